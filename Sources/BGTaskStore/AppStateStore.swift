import BGTaskControl
import BGTaskModel
import Foundation
import GRDB

/// The store's per-app state (refresh switch, penalties, the last launch) and settings.
extension PendingRequestStore {
    // MARK: App state and settings

    /// The app's state (a default one for an app never seen).
    public func appState(_ app: String) throws(BGTaskError) -> AppState {
        try read("read the state of \(app)") { db in try Self.appState(db, app) }
    }

    /// `judged` false: without what only the realistic policy reads (the day's energy excess,
    /// the app's uses), two subqueries fewer on every scheduling pass of another policy.
    package static func appState(_ db: Database, _ app: String, judged: Bool = true) throws -> AppState {
        guard let row = try Row.fetchOne(db.cachedStatement(sql: judged ? appStateSQL : appStateBasicSQL), arguments: [app]) else {
            return AppState(app: app)
        }
        return try appState(row, app: app)
    }

    /// The stored states of every app, or of `apps`, by app, in one read; an app never saved
    /// is absent (its state is `AppState(app:)`). All apps: one pass over app_state; given
    /// apps: one search of its primary key per app, up to `inListSize` apps a statement.
    public func appStates(apps: [String]? = nil) throws(BGTaskError) -> [String: AppState] {
        try read("read the states of the apps") { db in
            var states: [String: AppState] = [:]
            func collect(_ rows: RowCursor) throws {
                while let row = try rows.next() {
                    let app = try row.decode(String.self, atIndex: 0)
                    states[app] = try Self.appState(row, app: app)
                }
            }
            guard let apps else {
                try collect(Row.fetchCursor(db, sql: "SELECT \(Self.appStateColumns) FROM app_state"))
                return states
            }
            for chunk in Self.chunks(apps) {
                try collect(Row.fetchCursor(db, sql: "SELECT \(Self.appStateColumns) FROM app_state WHERE app IN (\(Self.placeholders(chunk.count)))",
                                            arguments: StatementArguments(chunk)))
            }
            return states
        }
    }

    /// The columns `appState(_:app:)` reads, in its order (by index: a lookup by name compares
    /// the name with every column's).
    package static let appStateColumns = """
        app, refresh_enabled, penalty_level, penalty_until, last_launch_at, last_launch_id, last_registered, \
        (SELECT day || ' ' || excess FROM app_day WHERE app_day.app = app_state.app AND excess IS NOT NULL ORDER BY day DESC LIMIT 1), \
        (SELECT group_concat(opened_at, ' ') FROM (SELECT opened_at FROM app_use WHERE app_use.app = app_state.app ORDER BY opened_at DESC LIMIT \(UsagePrediction.keptOpens)))
        """

    package static let appStateSQL = "SELECT \(appStateColumns) FROM app_state WHERE app = ?"
    package static let appStateBasicSQL = "SELECT app, refresh_enabled, penalty_level, penalty_until, last_launch_at, last_launch_id, last_registered FROM app_state WHERE app = ?"

    /// An app's state from a row of `appStateColumns`.
    package static func appState(_ row: Row, app: String) throws -> AppState {
        var state = AppState(app: app)
        state.refreshEnabled = try row.decode(Bool.self, atIndex: 1)
        state.penaltyLevel = try row.decode(Int.self, atIndex: 2)
        state.penaltyUntil = try row.decode(Double?.self, atIndex: 3).map(Date.init(timeIntervalSince1970:))
        state.lastLaunchAt = try row.decode(Double?.self, atIndex: 4).map(Date.init(timeIntervalSince1970:))
        state.lastLaunchID = try row.decode(String?.self, atIndex: 5)
        state.lastRegistered = try row.decode(String?.self, atIndex: 6).map(registeredIdentifiers)
        guard row.count > 8 else { return state }
        if let excess = try row.decode(String?.self, atIndex: 7), let space = excess.firstIndex(of: " "),
           let day = Double(excess[..<space]) {
            state.energyExcessDay = Date(timeIntervalSince1970: day)
            state.energyExcess = String(excess[excess.index(after: space)...])
        }
        if let opens = try row.decode(String?.self, atIndex: 8) {
            state.opens = opens.split(separator: " ").compactMap { Double($0) }.map(Date.init(timeIntervalSince1970:))
        }
        return state
    }

    /// `last_registered` decoded, remembered by its text: an app registers the same handlers
    /// launch after launch, and every scheduling pass reads the state of the app it launches.
    package static func registeredIdentifiers(_ json: String) throws -> [String] {
        if let known = registeredCache.withLock({ $0[json] }) { return known }
        let identifiers = try JSONDecoder().decode([String].self, from: Data(json.utf8))
        registeredCache.withLock { cache in
            if cache.count >= registeredCacheSize { cache.removeAll(keepingCapacity: true) }
            cache[json] = identifiers
        }
        return identifiers
    }
    private static let registeredCache = LockedValue<[String: [String]]>([:])
    package static let registeredCacheSize = 1_024
    package static var registeredCacheCount: Int { registeredCache.withLock { $0.count } }

    public func saveAppState(_ state: AppState) throws(BGTaskError) {
        try write("save the state of \(state.app)") { db in try Self.saveAppState(db, state) }
    }

    package static func saveAppState(_ db: Database, _ state: AppState) throws {
            try db.execute(
                sql: """
                    INSERT INTO app_state (app, refresh_enabled, penalty_level, penalty_until, last_launch_at, last_launch_id, last_registered)
                    VALUES (?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(app) DO UPDATE SET
                        refresh_enabled = excluded.refresh_enabled, penalty_level = excluded.penalty_level,
                        penalty_until = excluded.penalty_until, last_launch_at = excluded.last_launch_at,
                        last_launch_id = excluded.last_launch_id, last_registered = excluded.last_registered
                    """,
                arguments: [
                    state.app, state.refreshEnabled, state.penaltyLevel,
                    state.penaltyUntil?.timeIntervalSince1970, state.lastLaunchAt?.timeIntervalSince1970,
                    state.lastLaunchID, state.lastRegistered.map { Self.json($0) },
                ])
    }

    /// Small named settings: device overrides, the virtual clock. nil deletes.
    public func setting(_ key: String) throws(BGTaskError) -> String? {
        try read("read the setting \(key)") { db in
            try String.fetchOne(db.cachedStatement(sql: "SELECT value FROM setting WHERE key = ?"), arguments: [key])
        }
    }

    public func setSetting(_ key: String, _ value: String?) throws(BGTaskError) {
        try write("set the setting \(key)") { db in
            if let value {
                try db.execute(
                    sql: "INSERT INTO setting (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    arguments: [key, value])
            } else {
                try db.execute(sql: "DELETE FROM setting WHERE key = ?", arguments: [key])
            }
        }
    }
}
extension PendingRequestStore: ClockSettings {}

extension PendingRequestStore {
    /// The user opened `app` at `date` (the host's clock): kept for its usage pattern, with at
    /// most `UsagePrediction.keptOpens` uses and none older than the prediction's window.
    public func recordUse(app: String, at date: Date) throws(BGTaskError) {
        try writeUnsynced("record a use of \(app)") { db in
            try db.cachedStatement(sql: "INSERT INTO app_use (app, opened_at) VALUES (?, ?)").execute(arguments: [app, date.timeIntervalSince1970])
            // An app_state row, so that the app's state (and its uses) are read with it.
            try db.cachedStatement(sql: "INSERT OR IGNORE INTO app_state (app, refresh_enabled, penalty_level) VALUES (?, 1, 0)").execute(arguments: [app])
            let oldest = date.timeIntervalSince1970 - Double(UsagePrediction.windowDays) * 86_400
            try db.cachedStatement(sql: """
                DELETE FROM app_use WHERE app = ? AND (opened_at < ? OR opened_at < coalesce(
                    (SELECT opened_at FROM app_use WHERE app = ? ORDER BY opened_at DESC LIMIT 1 OFFSET \(UsagePrediction.keptOpens - 1)), 0))
                """).execute(arguments: [app, oldest, app])
        }
    }
}

import BGTaskControl
import BGTaskModel
import Foundation
import GRDB

/// The store's launch rows: begun, their pids, ended with their records, the history.
extension PendingRequestStore {
    // MARK: Launches

    /// Records a launch as running and marks the pending requests of `app` with identifiers in
    /// `tasks` as running in it, before the child is started. Not synced (`writeUnsynced`): it
    /// survives the host's crash, which is what it is for (the launch is then recovered as
    /// `host-lost` and its requests made pending again); a power loss, which ends the launch's
    /// processes too, may lose it, and the requests are then still pending, as they would be
    /// after that recovery.
    public func beginLaunch(
        id: String, app: String, reason: String, tasks: [TaskAssignment], at date: Date
    ) throws(BGTaskError) {
        let path = databaseURL.path
        try writeUnsynced("begin launch \(id) of \(app)") { db in
            try Self.begin(db, LaunchBegin(id: id, app: app, reason: reason, tasks: tasks, at: date), file: path)
        }
    }

    /// A launch to record as begun (`beginLaunches`).
    public struct LaunchBegin: Sendable {
        public var id: String
        public var app: String
        public var reason: String
        public var tasks: [TaskAssignment]
        public var at: Date

        public init(id: String, app: String, reason: String, tasks: [TaskAssignment], at: Date) {
            (self.id, self.app, self.reason, self.tasks, self.at) = (id, app, reason, tasks, at)
        }
    }

    /// `beginLaunch` for the launches one turn of the host started (a scheduling pass that
    /// launches a hundred apps), in one transaction: one commit where there were a hundred.
    /// Any failure fails them all (the caller then records them one at a time, so that each
    /// failure is its own launch's).
    public func beginLaunches(_ launches: [LaunchBegin]) throws(BGTaskError) {
        guard !launches.isEmpty else { return }
        let path = databaseURL.path
        try writeUnsynced("begin \(launches.count) launches") { db in
            for launch in launches { try Self.begin(db, launch, file: path) }
        }
    }

    private static func begin(_ db: Database, _ launch: LaunchBegin, file path: String) throws {
        let (id, app) = (launch.id, launch.app)
        if try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM launch WHERE id = ?"), arguments: [id]) != nil {
            throw BGTaskError(.invalidRequest, file: path, "begin launch \(id) of \(app): a launch with this id is already recorded")
        }
        try db.cachedStatement(sql: """
                INSERT INTO launch (id, app, reason, pid, started_at, state, tasks)
                VALUES (?, ?, ?, NULL, ?, 'running', ?)
                """).execute(arguments: [id, app, launch.reason, launch.at.timeIntervalSince1970, Self.json(launch.tasks)])
        for identifier in Set(launch.tasks.map(\.identifier)) {
            try db.cachedStatement(sql: "UPDATE request SET running_launch = ? WHERE app = ? AND identifier = ? AND running_launch IS NULL")
                .execute(arguments: [id, app, identifier])
        }
    }

    /// Remembers the runners' pids of running launches (for cleanup after a host crash), those
    /// one turn of the host started, in one transaction; a launch no longer recorded is
    /// skipped. Not synced, as `beginLaunch`: a power loss ends the runners too.
    public func setLaunchPIDs(_ pids: [(id: String, pid: Int32)]) throws(BGTaskError) {
        guard !pids.isEmpty else { return }
        try writeUnsynced("set the pids of \(pids.count) launches") { db in
            for (id, pid) in pids {
                try db.cachedStatement(sql: "UPDATE launch SET pid = ? WHERE id = ?").execute(arguments: [pid, id])
            }
        }
    }

    /// Remembers the runner's pid of a running launch (for cleanup after a host crash). Not
    /// synced, as `beginLaunch`: a power loss ends the runner too.
    public func setLaunchPID(id: String, pid: Int32) throws(BGTaskError) {
        let path = databaseURL.path
        try writeUnsynced("set the pid of launch \(id)") { db in
            try db.cachedStatement(sql: "UPDATE launch SET pid = ? WHERE id = ?").execute(arguments: [pid, id])
            if db.changesCount == 0 {
                throw BGTaskError(.invalidRequest, file: path, "set the pid of launch \(id): no such launch is recorded")
            }
        }
    }

    /// Ends a launch: stores its record, deletes the requests it ran (those still marked with
    /// its id; resubmissions made during the launch are new pending rows and stay). With
    /// `keepHistory`, prunes the app's history to its newest `keepHistory` ended launches in the
    /// same transaction (`pruneHistory`).
    /// Returns the ids of the launches pruned (their logs can go too).
    ///
    /// With `updatingState`, the app's state is read, changed and saved in the same transaction
    /// (one transaction where a read and a write were two, at the end of every launch), and the
    /// commit is not synced (`writeUnsynced`): the host's launch bookkeeping, which survives the
    /// host's crash; a power loss may lose it, and the launch is then recovered as `host-lost`
    /// with its requests pending again (at least once, as after any crash during a launch).
    /// Without it, the commit is synced. The record is encoded before the transaction, not while
    /// it holds the writer.
    @discardableResult
    /// `day`: the host clock's day it ended on, which its use is added to (`addToDay`); nil:
    /// the day its record began on.
    public func finishLaunch(_ record: RunRecord, keepHistory: Int? = nil, day: Date? = nil,
                             updatingState update: ((inout AppState) -> Void)? = nil) throws(BGTaskError) -> [String] {
        let path = databaseURL.path
        let json: String
        do { json = try Self.json(record) } catch {
            throw StoreErrors.wrap(error, file: path, operation: "encode the record of launch \(record.launchID)")
        }
        let body = { (db: Database) throws -> [String] in
            try Self.finish(db, record, json: json, file: path, keepHistory: keepHistory, day: day ?? EnergyBudget.day(of: record.startedAt), update: update)
        }
        let operation = "finish launch \(record.launchID) of \(record.app)"
        return update == nil ? try write(operation, body) : try writeUnsynced(operation, body)
    }

    /// `finishLaunch` with a state update (the host's bookkeeping, not synced) for the records
    /// that came back in one turn of the host, in one transaction. The launches pruned from the
    /// history, per record. Any failure fails them all (the caller then records them one at a
    /// time).
    public func finishLaunches(_ records: [RunRecord], keepHistory: Int? = nil, day: Date? = nil,
                               updatingState update: @escaping (RunRecord, inout AppState) -> Void) throws(BGTaskError) -> [[String]] {
        guard !records.isEmpty else { return [] }
        let path = databaseURL.path
        var encoded: [String] = []
        for record in records {
            do { encoded.append(try Self.json(record)) } catch {
                throw StoreErrors.wrap(error, file: path, operation: "encode the record of launch \(record.launchID)")
            }
        }
        return try writeUnsynced("finish \(records.count) launches") { db in
            try zip(records, encoded).map { record, json in
                try Self.finish(db, record, json: json, file: path, keepHistory: keepHistory, day: day ?? EnergyBudget.day(of: record.startedAt)) {
                    update(record, &$0)
                }
            }
        }
    }

    private static func finish(_ db: Database, _ record: RunRecord, json: String, file path: String, keepHistory: Int?, day: Date,
                               update: ((inout AppState) -> Void)?) throws -> [String] {
        try end(db, record, file: path, json: json)
        try addToDay(db, record, day: day)
        try db.cachedStatement(sql: "DELETE FROM request WHERE running_launch = ?").execute(arguments: [record.launchID])
        if let update {
            var current = try appState(db, record.app)
            update(&current)
            try saveAppState(db, current)
        }
        guard let keepHistory else { return [] }
        return try pruneHistory(db, app: record.app, keep: keepHistory)
    }

    /// Each app's newest launch whose process was suspended after it (termination `suspended`):
    /// after a host's crash, what may still be stopped on the machine with no host to resume or
    /// end it. (One query at the host's start, over the launch table's app index.)
    public func suspendedLaunches() throws(BGTaskError) -> [(launchID: String, app: String, pid: Int32)] {
        try read("list the launches whose process was left suspended") { db in
            try Row.fetchAll(db, sql: """
                SELECT id, app, pid FROM launch AS l
                WHERE state = 'ended' AND pid IS NOT NULL
                  AND started_at = (SELECT max(started_at) FROM launch WHERE app = l.app)
                  AND json_extract(record, '$.termination') = 'suspended'
                """).map { row in
                (try row.decode(String.self, forColumn: "id"), try row.decode(String.self, forColumn: "app"),
                 try row.decode(Int32.self, forColumn: "pid"))
            }
        }
    }

    /// Launches recorded as running: the host died during them.
    public func interruptedLaunches() throws(BGTaskError) -> [InterruptedLaunch] {
        try read("list the interrupted launches") { db in
            try Row.fetchAll(
                db,
                sql: "SELECT id, app, pid, reason, started_at, tasks FROM launch WHERE state = 'running' ORDER BY started_at, id"
            ).map { row in
                let tasks = try row.decode(String.self, forColumn: "tasks")
                return InterruptedLaunch(
                    launchID: try row.decode(String.self, forColumn: "id"),
                    app: try row.decode(String.self, forColumn: "app"),
                    pid: try row.decode(Int32?.self, forColumn: "pid"),
                    reason: try row.decode(String.self, forColumn: "reason"),
                    startedAt: Date(timeIntervalSince1970: try row.decode(Double.self, forColumn: "started_at")),
                    tasks: try JSONDecoder().decode([TaskAssignment].self, from: Data(tasks.utf8)))
            }
        }
    }

    /// Ends an interrupted launch with its `host-lost` record and makes its requests pending again.
    /// With `keepHistory`, prunes the app's history as `finishLaunch` does.
    @discardableResult
    public func recoverInterruptedLaunch(_ record: RunRecord, keepHistory: Int? = nil) throws(BGTaskError) -> [String] {
        let path = databaseURL.path
        return try write("recover interrupted launch \(record.launchID) of \(record.app)") { db in
            try Self.end(db, record, file: path)
            // A request resubmitted during the launch is a pending row with the same
            // (app, identifier): of the two, the later submission (higher seq) wins.
            let running = try Row.fetchAll(
                db, sql: "SELECT seq, app, identifier FROM request WHERE running_launch = ?",
                arguments: [record.launchID])
            for row in running {
                let seq = try row.decode(Int64.self, forColumn: "seq")
                let pendingSeq = try Int64.fetchOne(
                    db, sql: "SELECT seq FROM request WHERE app = ? AND identifier = ? AND running_launch IS NULL",
                    arguments: [try row.decode(String.self, forColumn: "app"), try row.decode(String.self, forColumn: "identifier")])
                guard let pendingSeq else { continue }
                try db.execute(sql: "DELETE FROM request WHERE seq = ?", arguments: [pendingSeq > seq ? seq : pendingSeq])
            }
            try db.execute(sql: "UPDATE request SET running_launch = NULL WHERE running_launch = ?", arguments: [record.launchID])
            guard let keepHistory else { return [] }
            return try Self.pruneHistory(db, app: record.app, keep: keepHistory)
        }
    }

    /// Run records, newest first, of `app` or of every app.
    public func history(app: String?, limit: Int) throws(BGTaskError) -> [RunRecord] {
        try historyJSON(app: app, limit: limit).map { text throws(BGTaskError) in
            do { return try RunRecord.decode(Data(text.utf8)) } catch {
                throw StoreErrors.wrap(error, file: databaseURL.path, operation: "read the launch history")
            }
        }
    }

    /// `history`'s records as the store keeps them: each one's JSON, the encoder's text (what a
    /// page that only passes them on needs, without decoding and encoding each again).
    public func historyJSON(app: String?, limit: Int) throws(BGTaskError) -> [String] {
        try read("read the launch history") { db in
            let limit = max(0, limit)
            // `record IS NOT NULL` (the same as state = 'ended') rather than `state = ...`, so
            // SQLite walks launch_started backwards and stops at the limit instead of sorting
            // every ended launch.
            let texts: [String]
            if let app {
                texts = try String.fetchAll(
                    db, sql: "SELECT record FROM launch WHERE app = ? AND record IS NOT NULL ORDER BY started_at DESC, id DESC LIMIT ?",
                    arguments: [app, limit])
            } else {
                texts = try String.fetchAll(
                    db, sql: "SELECT record FROM launch WHERE record IS NOT NULL ORDER BY started_at DESC, id DESC LIMIT ?",
                    arguments: [limit])
            }
            return texts
        }
    }

    /// One ended launch's record as the store keeps it (its JSON), by its ID; nil when no
    /// ended launch has it (running, pruned, or never).
    public func recordJSON(launchID: String) throws(BGTaskError) -> String? {
        try read("read a launch's record") { db in
            try String.fetchOne(db, sql: "SELECT record FROM launch WHERE id = ? AND record IS NOT NULL", arguments: [launchID])
        }
    }

    /// `pruneHistory`, step 1: the launch of `app` that comes after the `?` newest (newest
    /// first, running ones included). A walk of launch_app_started alone (covering: app,
    /// started_at and id are its columns), never the table.
    package static let historyBoundarySQL = "SELECT started_at, id FROM launch WHERE app = ? ORDER BY started_at DESC, id DESC LIMIT 1 OFFSET ?"

    /// `pruneHistory`, step 2: running launches of `app` newer than a launch. A search of
    /// launch_state for the few running rows; left to itself SQLite would read every newer launch
    /// of the app through launch_app_started.
    package static let runningNewerSQL = """
        SELECT COUNT(*) FROM launch INDEXED BY launch_state
        WHERE state = 'running' AND app = ? AND (started_at, id) > (?, ?)
        """

    /// `pruneHistory`, step 3: the ended launches of `app` at or before a launch. A range of
    /// launch_app_started from the app's oldest launch: it reads only the rows it deletes (and
    /// running ones among them).
    package static let pruneHistorySQL = "DELETE FROM launch WHERE app = ? AND (started_at, id) <= (?, ?) AND state = 'ended'"

    /// The ids `pruneHistorySQL` deletes (the same range of launch_app_started).
    package static let prunedLaunchesSQL = "SELECT id FROM launch WHERE app = ? AND (started_at, id) <= (?, ?) AND state = 'ended'"

    /// Deletes the ended launches of `app` (with their run records) older than its newest `keep`
    /// ended ones. Running launches are never deleted and do not count towards `keep`; other
    /// apps are untouched. Returns how many were deleted.
    ///
    /// Indexed: finding the boundary walks at most `keep` + (running launches) entries of
    /// launch_app_started without reading the table, and the delete reads only the rows it
    /// deletes: never a scan of the launch table.
    @discardableResult
    public func pruneHistory(app: String, keep: Int) throws(BGTaskError) -> Int {
        try write("prune the launch history of \(app)") { db in try Self.pruneHistory(db, app: app, keep: keep).count }
    }

    /// Returns the ids of the launches deleted.
    package static func pruneHistory(_ db: Database, app: String, keep: Int) throws -> [String] {
        let keep = max(0, keep)
        // The boundary is the newest launch that has `keep` ended launches before it (newest
        // first): it and every ended launch older than it go. Running launches among the newer
        // ones push it further back, and a boundary further back can only have more running
        // launches before it, so this settles within (running launches of the app) + 1 rounds.
        var skip = keep
        while true {
            guard let boundary = try Row.fetchOne(db.cachedStatement(sql: historyBoundarySQL), arguments: [app, skip]) else {
                return [] // `keep` ended launches or fewer
            }
            let startedAt = try boundary.decode(Double.self, atIndex: 0)
            let id = try boundary.decode(String.self, atIndex: 1)
            let runningNewer = try Int.fetchOne(db.cachedStatement(sql: runningNewerSQL), arguments: [app, startedAt, id]) ?? 0
            if keep + runningNewer == skip {
                // The same rows the delete takes (the same index search), for their logs.
                let pruned = try String.fetchAll(db.cachedStatement(sql: prunedLaunchesSQL), arguments: [app, startedAt, id])
                try db.cachedStatement(sql: pruneHistorySQL).execute(arguments: [app, startedAt, id])
                return pruned
            }
            skip = keep + runningNewer
        }
    }
}

import BGTaskSystem
import BGTaskModel
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A request as the host keeps it.
public struct StoredRequest: Sendable, Equatable, Codable {
    public var app: String
    public var request: TaskRequest
    public var submittedAt: Date
    /// The launch running it now, or nil while it is pending.
    public var runningLaunch: String?

    public init(app: String, request: TaskRequest, submittedAt: Date, runningLaunch: String? = nil) {
        self.app = app
        self.request = request
        self.submittedAt = submittedAt
        self.runningLaunch = runningLaunch
    }

    /// `earliestBeginDate` as a Date (nil: due at once).
    public var earliest: Date? { request.earliestBeginDate.map(Date.init(timeIntervalSince1970:)) }
}

/// Per-app scheduling state.
public struct AppState: Sendable, Equatable, Codable {
    public var app: String
    /// The per-app Background App Refresh switch.
    public var refreshEnabled: Bool = true
    /// Consecutive bad launches (watchdog, jetsam, crashed, unfinished tasks); 0 after a clean one.
    public var penaltyLevel: Int = 0
    /// Launches wait until then (realistic policy).
    public var penaltyUntil: Date?
    public var lastLaunchAt: Date?
    public var lastLaunchID: String?
    /// Identifiers the last launch registered (nil before any launch).
    public var lastRegistered: [String]?

    public init(app: String) { self.app = app }
}

/// A launch that was running when the host stopped (found at startup).
public struct InterruptedLaunch: Sendable, Equatable {
    public var launchID: String
    public var app: String
    public var pid: Int32?
    public var reason: String
    public var startedAt: Date
    /// The task identifiers and kinds it was running.
    public var tasks: [TaskAssignment]
}

/// The host's durable state in one SQLite database (`STATE/bgtask.sqlite`, WAL mode): pending
/// requests, launches and their run records, per-app state, and settings (device overrides,
/// the virtual clock). Every write is durable when the call returns: synced (submissions,
/// cancellations, settings), or, for the launch bookkeeping (`beginLaunch`, `setLaunchPID`,
/// `finishLaunch` with a state), durable against the host's crash and synced by the next
/// synced commit (`writeUnsynced`).
///
/// Thread-safe; any thread may call. Implemented with GRDB.
public final class PendingRequestStore: @unchecked Sendable {
    public let databaseURL: URL

    /// The connections: one writer (synchronous = FULL), concurrent readers (WAL snapshots).
    let pool: DatabasePool
    /// The scheduling pass's own read-only connection (`withSnapshot`; one pass at a time, on
    /// the host queue): a read from the pool checks the schema's version in a read transaction
    /// of its own before the pass's, and takes a reader through the pool's locks.
    let passReader: DatabaseQueue

    /// Writes to the transfer table so far (each of TransferStore.swift's writes counts one,
    /// before it runs): a reader that found nothing to do can tell that nothing changed since.
    let transferWrites = LockedValue<UInt64>(0)
    /// Concurrent `submit` calls, gathered into shared transactions.
    private let submissionGroups = GroupCommit<PendingSubmission, Result<SubmissionRules.Rejection?, BGTaskError>>()
    /// The write-ahead log, synced after a group of submissions is committed and visible.
    let writeAheadLog: WriteAheadLog
    /// The host's disk reserve (`StoreReserve`): released so that a write of the host's own
    /// bookkeeping (a record, a launch's begin, a recovery) that found the disk full is run
    /// again and kept; while released, submissions are refused ("disk full: ..."). Nil: none
    /// (`bgtask run`, tests, benchmarks).
    public let reserve: StoreReserve?

    /// How long a statement waits for a lock another connection or process holds.
    static let busyTimeout: TimeInterval = 5

    /// Opens (creating and migrating) the database in `directory`. A file that is not a
    /// database, or a directory that cannot be written, is a `BGTaskError` naming the file.
    public init(directory: URL, reserve: StoreReserve? = nil) throws(BGTaskError) {
        databaseURL = directory.appendingPathComponent("bgtask.sqlite")
        self.reserve = reserve
        let path = databaseURL.path
        writeAheadLog = WriteAheadLog(databasePath: path)
        try Self.prepare(directory: directory, databasePath: path)

        var configuration = Configuration()
        configuration.label = "bgtask.store"
        configuration.foreignKeysEnabled = true
        configuration.busyMode = .timeout(Self.busyTimeout)
        // Temporary tables and indices (a sort, a statement journal) in memory: a file for them
        // would need a new inode, and a filesystem out of inodes must not fail a record.
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA temp_store = MEMORY") }
        do {
            // DatabasePool puts the database in WAL mode.
            let pool = try DatabasePool(path: path, configuration: configuration)
            // GRDB sets its writer to synchronous = NORMAL when it enables WAL, and NORMAL may
            // lose the last commits on power loss. FULL syncs the WAL at every commit: a write
            // call returns only once the transaction is on disk.
            try pool.writeWithoutTransaction { db in
                try db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute()
            }
            let migrator = StoreSchema.migrator
            let superseded = try pool.read { db in try migrator.hasBeenSuperseded(db) }
            if superseded {
                throw BGTaskError(.system, file: path, "the database was created by a newer version of bgtask (it has migrations this version does not know)")
            }
            try migrator.migrate(pool)
            self.pool = pool
            var readOnly = Configuration()
            readOnly.label = "bgtask.store.pass"
            readOnly.readonly = true
            readOnly.busyMode = .timeout(Self.busyTimeout)
            passReader = try DatabaseQueue(path: path, configuration: readOnly)
        } catch {
            throw StoreErrors.wrap(error, file: path, operation: "open the database")
        }
    }

    // MARK: Requests

    /// Submits `request` for `app` in one transaction: with `rules`, Apple's rules
    /// (`SubmissionRules.decide`) see the app's state and its current requests (pending and
    /// running) and may reject it; otherwise (or without rules) the request replaces any
    /// *pending* request with the same identifier (a running one stays with its launch). Returns
    /// the rejection, or nil once the request is durable.
    ///
    /// Concurrent submissions share a transaction (group commit, `GroupCommit`): each runs in
    /// arrival order, so each sees the ones before it, and writes with one statement, so an error
    /// in one fails only that one. All are acknowledged after the one commit and sync that make
    /// them durable together. The rules are a value and a pure function of it: nothing inside the
    /// transaction calls back into the host.
    ///
    /// `whenVisible` (of `submitAll`) is called for each accepted submission as soon as its
    /// commit is visible to readers, before the write-ahead log is synced (`WriteAheadLog`): a
    /// scheduling pass started then runs while the disk syncs. Only the return waits for the
    /// sync, so a caller is never told a request is kept before it is on disk.
    public func submit(app: String, request: TaskRequest, at date: Date,
                       rules: SubmissionRules.Context?) throws(BGTaskError) -> SubmissionRules.Rejection? {
        try submitAll([Submission(app: app, request: request, at: date, rules: rules)])[0].get()
    }

    /// A submission for `submitAll`: what `submit` takes.
    public struct Submission: Sendable {
        public var app: String
        public var request: TaskRequest
        public var date: Date
        /// Nil: stored without Apple's rules (a test's or benchmark's own requests).
        public var rules: SubmissionRules.Context?

        public init(app: String, request: TaskRequest, at date: Date, rules: SubmissionRules.Context?) {
            self.app = app
            self.request = request
            self.date = date
            self.rules = rules
        }
    }

    /// Several submissions, in order, in the same group commit (a client that pipelines its
    /// requests): the outcome of each, as `submit` would give it.
    public func submitAll(_ submissions: [Submission],
                          whenVisible: (@Sendable () -> Void)? = nil) -> [Result<SubmissionRules.Rejection?, BGTaskError>] {
        submissionGroups.perform(submissions.map { submission in
            PendingSubmission(app: submission.app, operation: "submit \(submission.request.identifier) for \(submission.app)",
                              whenVisible: whenVisible) { db, cache in
                let (app, request) = (submission.app, submission.request)
                var current = try cache.requests[app] ?? Self.fetchRequests(db, where: "app = ?", [app])
                cache.requests[app] = current
                if let rules = submission.rules {
                    let state = try cache.states[app] ?? Self.appState(db, app)
                    cache.states[app] = state
                    if let rejection = SubmissionRules.decide(request, rules, state: state, current: current.map(\.request)) { return rejection }
                }
                // One statement: replacing the pending request with the same identifier is the
                // unique index's REPLACE (a running one is outside that partial index and stays).
                try Self.insert(db, app: app, request: request, submittedAt: submission.date)
                // The same change to the cached list: the next submission of this app in the
                // group sees it without reading and decoding the app's rows again.
                current.removeAll { $0.runningLaunch == nil && $0.request.identifier == request.identifier }
                current.append(StoredRequest(app: app, request: request, submittedAt: submission.date))
                cache.requests[app] = current
                return nil
            }
        }, commit: commitSubmissions)
    }

    /// Writes and commits taken so far by `submit`, and the largest group committed at once.
    public var submissionStatistics: (writes: Int, commits: Int, largestGroup: Int) { submissionGroups.statistics }

    /// One group of submissions in one transaction, committed without a sync (visible at once),
    /// then the write-ahead log synced: what `synchronous = FULL` does, with the accepted
    /// submissions' `whenVisible` called in between.
    private func commitSubmissions(_ group: [PendingSubmission]) -> [Result<SubmissionRules.Rejection?, BGTaskError>] {
        let path = databaseURL.path
        var outcomes: [Result<SubmissionRules.Rejection?, BGTaskError>] = []
        outcomes.reserveCapacity(group.count)
        // The disk was found full and the reserve given to records: no new request is taken
        // (never acknowledged and then lost) until the reserve is back.
        if let reserve, !reserve.restoreIfRoom() {
            return group.map { .failure(BGTaskError(.system, file: path, reserve.fullMessage(operation: $0.operation))) }
        }
        do {
            try writeUnsynced("submit \(group.count) request(s)", usingReserve: false) { db in
                var cache = SubmissionCache()
                for submission in group {
                    // Each submission writes with one statement, which SQLite applies whole or
                    // not at all: a failing one leaves the others of the group as they are.
                    do {
                        outcomes.append(.success(try submission.body(db, &cache)))
                    } catch {
                        cache.forget(submission.app)
                        outcomes.append(.failure(StoreErrors.wrap(error, file: path, operation: submission.operation)))
                    }
                }
            }
        } catch {
            // The commit failed: nothing of the group is durable.
            return group.map { .failure(StoreErrors.wrap(error, file: path, operation: $0.operation)) }
        }
        let accepted = outcomes.map { if case .success(nil) = $0 { true } else { false } }
        for (submission, isAccepted) in zip(group, accepted) where isAccepted { submission.whenVisible?() }
        do {
            try writeAheadLog.sync()
        } catch {
            // Written but maybe not on disk: no accepted submission is acknowledged. (It is in
            // the database and may run; a disk that cannot sync has bigger problems.)
            return zip(outcomes, accepted).map { $1 ? .failure(error) : $0 }
        }
        return outcomes
    }

    /// Cancels the pending request `identifier` of `app` (all of them for nil). Returns how
    /// many were removed.
    @discardableResult
    public func cancel(app: String, identifier: String?) throws(BGTaskError) -> Int {
        try write("cancel \(identifier ?? "every request") of \(app)") { db in
            if let identifier {
                try db.execute(
                    sql: "DELETE FROM request WHERE app = ? AND identifier = ? AND running_launch IS NULL",
                    arguments: [app, identifier])
            } else {
                try db.execute(sql: "DELETE FROM request WHERE app = ? AND running_launch IS NULL", arguments: [app])
            }
            return db.changesCount
        }
    }

    /// Requests not running, of `app` or of every app, oldest submission first.
    public func pending(app: String?) throws(BGTaskError) -> [StoredRequest] {
        try read("list the pending requests") { db in
            if let app {
                return try Self.fetchRequests(db, where: "app = ? AND running_launch IS NULL", [app])
            }
            return try Self.fetchRequests(db, where: "running_launch IS NULL", [])
        }
    }

    /// The pending request with this identifier (identifiers are unique per app; for an
    /// identifier two apps share, the first by app name).
    public func pendingRequest(identifier: String) throws(BGTaskError) -> StoredRequest? {
        try read("find the pending request \(identifier)") { db in
            try Self.fetchRequests(
                db, where: "identifier = ? AND running_launch IS NULL", [identifier],
                order: "app LIMIT 1"
            ).first
        }
    }

    /// The statement behind `dueApps`: each half is a search of `request_pending_due` (NULL,
    /// then the range up to now), never a scan. (One `earliest IS NULL OR earliest <= ?` makes
    /// SQLite scan every pending row.)
    static let dueAppsSQL = """
        SELECT app FROM request WHERE running_launch IS NULL AND earliest IS NULL
        UNION
        SELECT app FROM request WHERE running_launch IS NULL AND earliest <= ?
        """

    /// The statement behind `nextDueDate`: a search of `request_pending_due`.
    static let nextDueDateSQL = "SELECT MIN(earliest) FROM request WHERE running_launch IS NULL AND earliest > ?"

    /// Apps that have a pending request due at `now` (earliest begin date nil or <= now).
    /// Indexed: never a scan of all requests.
    public func dueApps(at now: Date) throws(BGTaskError) -> [String] {
        try read("find the apps with requests due") { db in
            // Sorted here rather than in SQL: an ORDER BY tempts SQLite into scanning by app.
            try String.fetchAll(db.cachedStatement(sql: Self.dueAppsSQL), arguments: [now.timeIntervalSince1970]).sorted()
        }
    }

    /// The earliest begin date after `now` among pending requests (the next time the scheduler
    /// must look), or nil. Indexed.
    public func nextDueDate(after now: Date) throws(BGTaskError) -> Date? {
        try read("find the next due date") { db in
            try Double.fetchOne(db.cachedStatement(sql: Self.nextDueDateSQL), arguments: [now.timeIntervalSince1970])
                .map(Date.init(timeIntervalSince1970:))
        }
    }

    /// The statement behind `pendingCounts()`: a walk of request_pending_unique alone. The
    /// partial index holds exactly the pending rows and starts with app, so SQLite groups along
    /// it without reading the table (nor the running rows).
    static let pendingCountsSQL = "SELECT app, COUNT(*) FROM request WHERE running_launch IS NULL GROUP BY app"

    /// The statement behind `pendingCounts(apps:)` for `count` apps: a search of
    /// request_pending_unique per app. (Left to itself SQLite takes request_app, which walks the
    /// running rows too and reads every row from the table.)
    static func pendingCountsSQL(apps count: Int) -> String {
        """
        SELECT app, COUNT(*) FROM request INDEXED BY request_pending_unique
        WHERE running_launch IS NULL AND app IN (\(placeholders(count))) GROUP BY app
        """
    }

    /// Pending requests (not running) per app, of every app or of `apps`; an app with none is
    /// absent. One indexed query (up to `inListSize` apps a statement), never a load of the
    /// requests themselves.
    public func pendingCounts(apps: [String]? = nil) throws(BGTaskError) -> [String: Int] {
        try read("count the pending requests") { db in
            var counts: [String: Int] = [:]
            func collect(_ rows: RowCursor) throws {
                while let row = try rows.next() {
                    counts[try row.decode(String.self, atIndex: 0)] = try row.decode(Int.self, atIndex: 1)
                }
            }
            guard let apps else {
                try collect(Row.fetchCursor(db.cachedStatement(sql: Self.pendingCountsSQL)))
                return counts
            }
            for chunk in Self.chunks(apps) {
                try collect(Row.fetchCursor(db, sql: Self.pendingCountsSQL(apps: chunk.count), arguments: StatementArguments(chunk)))
            }
            return counts
        }
    }

    /// Drops every pending request of `app` (its bundle was removed). Returns how many.
    @discardableResult
    public func removeApp(_ app: String) throws(BGTaskError) -> Int {
        try write("remove the requests of \(app)") { db in
            try db.execute(sql: "DELETE FROM request WHERE app = ? AND running_launch IS NULL", arguments: [app])
            let removed = db.changesCount
            // An app removed takes its notifications with it (its switches stay, as app_state does).
            try db.execute(sql: "DELETE FROM notification WHERE app = ?", arguments: [app])
            return removed
        }
    }

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
    public func finishLaunch(_ record: RunRecord, keepHistory: Int? = nil,
                             updatingState update: ((inout AppState) -> Void)? = nil) throws(BGTaskError) -> [String] {
        let path = databaseURL.path
        let json: String
        do { json = try Self.json(record) } catch {
            throw StoreErrors.wrap(error, file: path, operation: "encode the record of launch \(record.launchID)")
        }
        let body = { (db: Database) throws -> [String] in
            try Self.finish(db, record, json: json, file: path, keepHistory: keepHistory, update: update)
        }
        let operation = "finish launch \(record.launchID) of \(record.app)"
        return update == nil ? try write(operation, body) : try writeUnsynced(operation, body)
    }

    /// `finishLaunch` with a state update (the host's bookkeeping, not synced) for the records
    /// that came back in one turn of the host, in one transaction. The launches pruned from the
    /// history, per record. Any failure fails them all (the caller then records them one at a
    /// time).
    public func finishLaunches(_ records: [RunRecord], keepHistory: Int? = nil,
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
                try Self.finish(db, record, json: json, file: path, keepHistory: keepHistory) { update(record, &$0) }
            }
        }
    }

    private static func finish(_ db: Database, _ record: RunRecord, json: String, file path: String, keepHistory: Int?,
                               update: ((inout AppState) -> Void)?) throws -> [String] {
        try end(db, record, file: path, json: json)
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
            return try texts.map { try RunRecord.decode(Data($0.utf8)) }
        }
    }

    /// `pruneHistory`, step 1: the launch of `app` that comes after the `?` newest (newest
    /// first, running ones included). A walk of launch_app_started alone (covering: app,
    /// started_at and id are its columns), never the table.
    static let historyBoundarySQL = "SELECT started_at, id FROM launch WHERE app = ? ORDER BY started_at DESC, id DESC LIMIT 1 OFFSET ?"

    /// `pruneHistory`, step 2: running launches of `app` newer than a launch. A search of
    /// launch_state for the few running rows; left to itself SQLite would read every newer launch
    /// of the app through launch_app_started.
    static let runningNewerSQL = """
        SELECT COUNT(*) FROM launch INDEXED BY launch_state
        WHERE state = 'running' AND app = ? AND (started_at, id) > (?, ?)
        """

    /// `pruneHistory`, step 3: the ended launches of `app` at or before a launch. A range of
    /// launch_app_started from the app's oldest launch: it reads only the rows it deletes (and
    /// running ones among them).
    static let pruneHistorySQL = "DELETE FROM launch WHERE app = ? AND (started_at, id) <= (?, ?) AND state = 'ended'"

    /// The ids `pruneHistorySQL` deletes (the same range of launch_app_started).
    static let prunedLaunchesSQL = "SELECT id FROM launch WHERE app = ? AND (started_at, id) <= (?, ?) AND state = 'ended'"

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
    static func pruneHistory(_ db: Database, app: String, keep: Int) throws -> [String] {
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

    // MARK: App state and settings

    /// The app's state (a default one for an app never seen).
    public func appState(_ app: String) throws(BGTaskError) -> AppState {
        try read("read the state of \(app)") { db in try Self.appState(db, app) }
    }

    static func appState(_ db: Database, _ app: String) throws -> AppState {
        guard let row = try Row.fetchOne(db.cachedStatement(sql: appStateSQL), arguments: [app]) else {
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
    static let appStateColumns = "app, refresh_enabled, penalty_level, penalty_until, last_launch_at, last_launch_id, last_registered"

    static let appStateSQL = "SELECT \(appStateColumns) FROM app_state WHERE app = ?"

    /// An app's state from a row of `appStateColumns`.
    static func appState(_ row: Row, app: String) throws -> AppState {
        var state = AppState(app: app)
        state.refreshEnabled = try row.decode(Bool.self, atIndex: 1)
        state.penaltyLevel = try row.decode(Int.self, atIndex: 2)
        state.penaltyUntil = try row.decode(Double?.self, atIndex: 3).map(Date.init(timeIntervalSince1970:))
        state.lastLaunchAt = try row.decode(Double?.self, atIndex: 4).map(Date.init(timeIntervalSince1970:))
        state.lastLaunchID = try row.decode(String?.self, atIndex: 5)
        state.lastRegistered = try row.decode(String?.self, atIndex: 6).map(registeredIdentifiers)
        return state
    }

    /// `last_registered` decoded, remembered by its text: an app registers the same handlers
    /// launch after launch, and every scheduling pass reads the state of the app it launches.
    static func registeredIdentifiers(_ json: String) throws -> [String] {
        if let known = registeredCache.withLock({ $0[json] }) { return known }
        let identifiers = try JSONDecoder().decode([String].self, from: Data(json.utf8))
        registeredCache.withLock { cache in
            if cache.count >= registeredCacheSize { cache.removeAll(keepingCapacity: true) }
            cache[json] = identifiers
        }
        return identifiers
    }
    private static let registeredCache = LockedValue<[String: [String]]>([:])
    static let registeredCacheSize = 1_024
    static var registeredCacheCount: Int { registeredCache.withLock { $0.count } }

    public func saveAppState(_ state: AppState) throws(BGTaskError) {
        try write("save the state of \(state.app)") { db in try Self.saveAppState(db, state) }
    }

    static func saveAppState(_ db: Database, _ state: AppState) throws {
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

// MARK: - Internals

/// One `submit` waiting for its group's transaction.
struct PendingSubmission {
    var app: String
    var operation: String
    var whenVisible: (@Sendable () -> Void)?
    var body: (Database, inout SubmissionCache) throws -> SubmissionRules.Rejection?
}

/// What the submissions of one group read, kept for the next submission of the same app in
/// that group (the transaction's own view: nothing else writes during it).
struct SubmissionCache {
    var requests: [String: [StoredRequest]] = [:]
    var states: [String: AppState] = [:]

    /// After a failed submission: read the app again.
    mutating func forget(_ app: String) {
        requests[app] = nil
        states[app] = nil
    }
}

extension PendingRequestStore {
    /// One write transaction (BEGIN IMMEDIATE ... COMMIT, prepared once: `inCachedTransaction`);
    /// every error becomes a `BGTaskError` naming the file and `operation`.
    func write<T>(_ operation: @autoclosure () -> String, _ body: (Database) throws -> T) throws(BGTaskError) -> T {
        do {
            return try withReserve {
                try pool.writeWithoutTransaction { db in try db.inCachedTransaction("IMMEDIATE") { try body(db) } }
            }
        } catch {
            throw StoreErrors.wrap(error, file: databaseURL.path, operation: operation())
        }
    }

    /// One write transaction whose commit is not synced (`synchronous = NORMAL` for it alone, in
    /// WAL mode): it is in the WAL, in the kernel's page cache, when this returns, so it survives
    /// the host's crash (SIGKILL included: SQLite replays the WAL), and it reaches the disk with
    /// the next synced commit (every submission's) or the kernel's writeback; only a power loss
    /// or a kernel crash before then loses it. For writes whose loss the host recovers from and
    /// that no client was told are durable (the launch bookkeeping), and for submissions, whose
    /// answer waits for `WriteAheadLog.sync` (`commitSubmissions`).
    /// `usingReserve`: false for submissions, which are refused rather than written into the
    /// host's reserve (`withReserve`).
    func writeUnsynced<T>(_ operation: @autoclosure () -> String, usingReserve: Bool = true,
                          _ body: (Database) throws -> T) throws(BGTaskError) -> T {
        do {
            return try withReserve(usingReserve) { try pool.writeWithoutTransaction { db in
                try db.cachedStatement(sql: "PRAGMA synchronous = NORMAL").execute()
                do {
                    let result = try db.inCachedTransaction("IMMEDIATE") { try body(db) }
                    try db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute()
                    return result
                } catch {
                    // Every other write expects FULL: restored whatever happened.
                    try db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute()
                    throw error
                }
            } }
        } catch {
            throw StoreErrors.wrap(error, file: databaseURL.path, operation: operation())
        }
    }

    /// Runs `attempt` (a whole transaction); when it failed because the disk is full
    /// (`StoreErrors.isDiskFull`) and the host's reserve is held, releases the reserve and runs
    /// it once more, into the space given back: a launch's record, or the bookkeeping that keeps
    /// an acknowledged request, is not lost to a full disk. The failed attempt was rolled back
    /// (`inCachedTransaction`), so running it again writes it once.
    func withReserve<T>(_ allowed: Bool = true, _ attempt: () throws -> T) throws -> T {
        do {
            return try attempt()
        } catch {
            guard allowed, StoreErrors.isDiskFull(error), let reserve,
                  reserve.release(because: "SQLite: \((error as? DatabaseError)?.message ?? "\(error)")") else { throw error }
            return try attempt()
        }
    }

    /// One read of a consistent snapshot (a DEFERRED transaction of this function's own, its
    /// BEGIN and COMMIT prepared once: what `pool.read` does, without compiling them each time).
    func read<T>(_ operation: @autoclosure () -> String, _ body: (Database) throws -> T) throws(BGTaskError) -> T {
        do {
            return try pool.unsafeRead { db in try db.inCachedTransaction("DEFERRED") { try body(db) } }
        } catch {
            throw StoreErrors.wrap(error, file: databaseURL.path, operation: operation())
        }
    }

    /// Apps per `IN (...)` list: far below SQLite's limit on bound parameters.
    static let inListSize = 500

    static func chunks(_ apps: [String]) -> [ArraySlice<String>] {
        stride(from: 0, to: apps.count, by: inListSize).map { apps[$0..<min($0 + inListSize, apps.count)] }
    }

    /// `?, ?, ?` for `count` parameters.
    static func placeholders(_ count: Int) -> String {
        Array(repeating: "?", count: count).joined(separator: ", ")
    }

    static let requestColumns = """
        seq, app, identifier, kind, earliest, requires_network, requires_power, protection_type, \
        title, subtitle, strategy_fail, required_resources, submitted_at, running_launch
        """

    static func fetchRequests(
        _ db: Database, where condition: String, _ arguments: StatementArguments, order: String = "seq"
    ) throws -> [StoredRequest] {
        // Cached statements: compiling one costs more than running it (GRDB's authorizer
        // inspects every column at compile time), and these run for every submission.
        try Row.fetchAll(
            db.cachedStatement(sql: "SELECT \(requestColumns) FROM request WHERE \(condition) ORDER BY \(order)"), arguments: arguments
        ).map(storedRequest)
    }

    /// A row of `requestColumns`, decoded by position (in that order).
    static func storedRequest(_ row: Row) throws -> StoredRequest {
        let seq = try row.decode(Int64.self, atIndex: 0)
        let kindName = try row.decode(String.self, atIndex: 3)
        guard let kind = TaskKind(rawValue: kindName) else {
            throw StoreCorruption("request \(seq) has the unknown task kind '\(kindName)'")
        }
        let request = TaskRequest(
            kind: kind,
            identifier: try row.decode(String.self, atIndex: 2),
            earliestBeginDate: try row.decode(Double?.self, atIndex: 4),
            requiresNetworkConnectivity: try row.decode(Bool.self, atIndex: 5),
            requiresExternalPower: try row.decode(Bool.self, atIndex: 6),
            protectionType: try row.decode(Int32.self, atIndex: 7),
            title: try row.decode(String?.self, atIndex: 8),
            subtitle: try row.decode(String?.self, atIndex: 9),
            strategyFail: try row.decode(Bool.self, atIndex: 10),
            requiredResources: try row.decode(UInt32.self, atIndex: 11))
        return StoredRequest(
            app: try row.decode(String.self, atIndex: 1),
            request: request,
            submittedAt: Date(timeIntervalSince1970: try row.decode(Double.self, atIndex: 12)),
            runningLaunch: try row.decode(String?.self, atIndex: 13))
    }

    /// Inserts a pending request, replacing the pending one of `app` with the same identifier
    /// (`request_pending_unique`): the new row has a new `seq`, so it is the newest submission.
    static func insert(_ db: Database, app: String, request: TaskRequest, submittedAt: Date) throws {
        try db.cachedStatement(sql: """
                INSERT OR REPLACE INTO request (app, identifier, kind, earliest, requires_network, requires_power,
                    protection_type, title, subtitle, strategy_fail, required_resources, submitted_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """
        ).execute(arguments: [
            app, request.identifier, request.kind.rawValue, request.earliestBeginDate,
            request.requiresNetworkConnectivity, request.requiresExternalPower, request.protectionType,
            request.title, request.subtitle, request.strategyFail, Int64(request.requiredResources),
            submittedAt.timeIntervalSince1970,
        ])
    }

    /// Marks a launch ended with its record, inserting the launch when it was never begun.
    /// `json`: the record's JSON when the caller encoded it before the transaction.
    static func end(_ db: Database, _ record: RunRecord, file: String, json encoded: String? = nil) throws {
        let text = try encoded ?? json(record)
        let endedAt = record.startedAt.timeIntervalSince1970 + record.wallMs / 1000
        if let app = try String.fetchOne(db.cachedStatement(sql: "SELECT app FROM launch WHERE id = ?"), arguments: [record.launchID]) {
            guard app == record.app else {
                throw BGTaskError(.invalidRequest, file: file, "end launch \(record.launchID): it is a launch of \(app), the record is of \(record.app)")
            }
            try db.cachedStatement(sql: "UPDATE launch SET state = 'ended', record = ?, ended_at = ?, pid = coalesce(pid, nullif(?, 0)) WHERE id = ?")
                .execute(arguments: [text, endedAt, record.pid, record.launchID])
        } else {
            let tasks = record.tasks.enumerated().map { index, task in
                TaskAssignment(task: UInt64(index + 1), identifier: task.identifier, kind: task.type)
            }
            try db.execute(
                sql: """
                    INSERT INTO launch (id, app, reason, pid, started_at, state, tasks, record, ended_at)
                    VALUES (?, ?, ?, nullif(?, 0), ?, 'ended', ?, ?, ?)
                    """,
                arguments: [
                    record.launchID, record.app, record.reason, record.pid, record.startedAt.timeIntervalSince1970,
                    json(tasks), text, endedAt,
                ])
        }
    }

    static func json(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    /// What a launch writes at its begin and end, in the encoder's text without the encoder
    /// (`RecordJSON`: a few µs where the encoder took tens, at every launch).
    static func json(_ tasks: [TaskAssignment]) -> String { RecordJSON.tasks(tasks) }
    static func json(_ identifiers: [String]) -> String { RecordJSON.strings(identifiers) }
    /// A record's JSON (`RunRecord.jsonData`'s text).
    static func json(_ record: RunRecord) throws -> String {
        try RecordJSON.record(record) ?? String(decoding: record.jsonData(), as: UTF8.self)
    }

    /// Creates the directory when missing (syncing its parent, so the new entry survives power
    /// loss) and checks that the directory and an existing file can be written: SQLite would
    /// otherwise open read-only and fail later, less clearly.
    static func prepare(directory: URL, databasePath: String) throws(BGTaskError) {
        let directoryPath = directory.path
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directoryPath, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else {
                throw BGTaskError(.system, file: databasePath, "cannot open the database: \(directoryPath) is not a directory")
            }
        } else {
            do {
                try Directories.make(directoryPath, syncingParents: true)
            } catch {
                throw BGTaskError(.system, file: databasePath, errno: error.errno, "cannot create the state directory \(error.path ?? directoryPath)")
            }
        }
        if access(directoryPath, W_OK | X_OK) != 0 {
            let code = errno
            throw BGTaskError(.system, file: databasePath, errno: code, "the state directory \(directoryPath) is not writable (SQLite creates the database and its -wal and -shm files there)")
        }
        // Owner-only: the database holds every app's requests and records. SQLite makes a new
        // file 0644 (less the umask) and gives its -wal and -shm the database's mode, so the
        // database is made here, 0600, and existing files are made so (through a descriptor:
        // never a link's target).
        let created = open(databasePath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        if created >= 0 { close(created) }
        for path in [databasePath, databasePath + "-wal", databasePath + "-shm"] {
            let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            guard fd >= 0 else { continue }
            var info = stat()
            if fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_mode & 0o077 != 0 { fchmod(fd, 0o600) }
            close(fd)
        }
        if FileManager.default.fileExists(atPath: databasePath), access(databasePath, R_OK | W_OK) != 0 {
            let code = errno
            throw BGTaskError(.system, file: databasePath, errno: code, "the database file is not readable and writable by this user")
        }
    }

}

extension Database {
    /// `inTransaction`, with its BEGIN and COMMIT prepared once: GRDB compiles both anew for
    /// every transaction (its authorizer inspects each), and the launch's path runs three short
    /// transactions (the submission, the scheduling pass's snapshot, the launch's record). The
    /// store's `read`, `write` and `writeUnsynced` all go through here.
    /// `kind`: DEFERRED (a read) or IMMEDIATE (a write). Rolled back when `body` or the commit
    /// throws: the connection is never left inside a transaction.
    func inCachedTransaction<T>(_ kind: StaticString, _ body: () throws -> T) throws -> T {
        try cachedStatement(sql: "BEGIN \(kind) TRANSACTION").execute()
        do {
            let result = try body()
            try cachedStatement(sql: "COMMIT TRANSACTION").execute()
            return result
        } catch {
            if isInsideTransaction { try? rollback() }
            throw error
        }
    }
}

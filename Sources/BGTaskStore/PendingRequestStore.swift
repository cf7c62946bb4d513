import BGTaskControl
import BGTaskSystem
import BGTaskModel
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif




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
    package let pool: DatabasePool
    /// The scheduling pass's own read-only connection (`withSnapshot`; one pass at a time, on
    /// the host queue): a read from the pool checks the schema's version in a read transaction
    /// of its own before the pass's, and takes a reader through the pool's locks.
    package let passReader: DatabaseQueue

    /// Writes to the transfer table so far (each of TransferStore.swift's writes counts one,
    /// before it runs): a reader that found nothing to do can tell that nothing changed since.
    package let transferWrites = LockedValue<UInt64>(0)
    /// Told how long each write transaction took, BEGIN to COMMIT, in nanoseconds (the
    /// dashboard's `bgtask_store_commit_seconds`); nil: nobody asks.
    package let commitObserver = LockedValue<(@Sendable (UInt64) -> Void)?>(nil)
    /// Concurrent `submit` calls, gathered into shared transactions.
    private let submissionGroups = GroupCommit<PendingSubmission, Result<SubmissionRules.Rejection?, BGTaskError>>()
    /// The write-ahead log, synced after a group of submissions is committed and visible.
    package let writeAheadLog: WriteAheadLog
    /// The host's disk reserve (`StoreReserve`): released so that a write of the host's own
    /// bookkeeping (a record, a launch's begin, a recovery) that found the disk full is run
    /// again and kept; while released, submissions are refused ("disk full: ..."). Nil: none
    /// (`bgtask run`, tests, benchmarks).
    public let reserve: StoreReserve?

    /// How long a statement waits for a lock another connection or process holds.
    package static let busyTimeout: TimeInterval = 5

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
    package static let dueAppsSQL = """
        SELECT app FROM request WHERE running_launch IS NULL AND earliest IS NULL
        UNION
        SELECT app FROM request WHERE running_launch IS NULL AND earliest <= ?
        """

    /// The statement behind `nextDueDate`: a search of `request_pending_due`.
    package static let nextDueDateSQL = "SELECT MIN(earliest) FROM request WHERE running_launch IS NULL AND earliest > ?"

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
    package static let pendingCountsSQL = "SELECT app, COUNT(*) FROM request WHERE running_launch IS NULL GROUP BY app"

    /// The statement behind `pendingCounts(apps:)` for `count` apps: a search of
    /// request_pending_unique per app. (Left to itself SQLite takes request_app, which walks the
    /// running rows too and reads every row from the table.)
    package static func pendingCountsSQL(apps count: Int) -> String {
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
}

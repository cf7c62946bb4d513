import BGTaskControl
import BGTaskSystem
import BGTaskModel
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

// MARK: - Internals

/// One `submit` waiting for its group's transaction.
package struct PendingSubmission {
    package var app: String
    package var operation: String
    package var whenVisible: (@Sendable () -> Void)?
    package var body: (Database, inout SubmissionCache) throws -> SubmissionRules.Rejection?
}

/// What the submissions of one group read, kept for the next submission of the same app in
/// that group (the transaction's own view: nothing else writes during it).
package struct SubmissionCache {
    package var requests: [String: [StoredRequest]] = [:]
    package var states: [String: AppState] = [:]

    /// After a failed submission: read the app again.
    package mutating func forget(_ app: String) {
        requests[app] = nil
        states[app] = nil
    }

    /// The memberwise initializer, for the modules above this one.
    package init(requests: [String: [StoredRequest]] = [:], states: [String: AppState] = [:]) {
        self.requests = requests
        self.states = states
    }
}

extension PendingRequestStore {
    /// One write transaction (BEGIN IMMEDIATE ... COMMIT, prepared once: `inCachedTransaction`);
    /// every error becomes a `BGTaskError` naming the file and `operation`.
    package func write<T>(_ operation: @autoclosure () -> String, _ body: (Database) throws -> T) throws(BGTaskError) -> T {
        do {
            return try withReserve {
                try pool.writeWithoutTransaction { db in try timed { try db.inCachedTransaction("IMMEDIATE") { try body(db) } } }
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
    package func writeUnsynced<T>(_ operation: @autoclosure () -> String, usingReserve: Bool = true,
                          _ body: (Database) throws -> T) throws(BGTaskError) -> T {
        do {
            return try withReserve(usingReserve) { try pool.writeWithoutTransaction { db in
                try db.cachedStatement(sql: "PRAGMA synchronous = NORMAL").execute()
                do {
                    let result = try timed { try db.inCachedTransaction("IMMEDIATE") { try body(db) } }
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

    /// `transaction` timed for `commitObserver`, when there is one.
    private func timed<T>(_ transaction: () throws -> T) rethrows -> T {
        guard let observer = commitObserver.withLock({ $0 }) else { return try transaction() }
        let start = DispatchTime.now().uptimeNanoseconds
        defer { observer(DispatchTime.now().uptimeNanoseconds - start) }
        return try transaction()
    }

    /// Runs `attempt` (a whole transaction); when it failed because the disk is full
    /// (`StoreErrors.isDiskFull`) and the host's reserve is held, releases the reserve and runs
    /// it once more, into the space given back: a launch's record, or the bookkeeping that keeps
    /// an acknowledged request, is not lost to a full disk. The failed attempt was rolled back
    /// (`inCachedTransaction`), so running it again writes it once.
    package func withReserve<T>(_ allowed: Bool = true, _ attempt: () throws -> T) throws -> T {
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
    package func read<T>(_ operation: @autoclosure () -> String, _ body: (Database) throws -> T) throws(BGTaskError) -> T {
        do {
            return try pool.unsafeRead { db in try db.inCachedTransaction("DEFERRED") { try body(db) } }
        } catch {
            throw StoreErrors.wrap(error, file: databaseURL.path, operation: operation())
        }
    }

    /// Apps per `IN (...)` list: far below SQLite's limit on bound parameters.
    package static let inListSize = 500

    package static func chunks(_ apps: [String]) -> [ArraySlice<String>] {
        stride(from: 0, to: apps.count, by: inListSize).map { apps[$0..<min($0 + inListSize, apps.count)] }
    }

    /// `?, ?, ?` for `count` parameters.
    package static func placeholders(_ count: Int) -> String {
        Array(repeating: "?", count: count).joined(separator: ", ")
    }

    package static let requestColumns = """
        seq, app, identifier, kind, earliest, requires_network, requires_power, protection_type, \
        title, subtitle, strategy_fail, required_resources, submitted_at, running_launch
        """

    package static func fetchRequests(
        _ db: Database, where condition: String, _ arguments: StatementArguments, order: String = "seq"
    ) throws -> [StoredRequest] {
        // Cached statements: compiling one costs more than running it (GRDB's authorizer
        // inspects every column at compile time), and these run for every submission.
        try Row.fetchAll(
            db.cachedStatement(sql: "SELECT \(requestColumns) FROM request WHERE \(condition) ORDER BY \(order)"), arguments: arguments
        ).map(storedRequest)
    }

    /// A row of `requestColumns`, decoded by position (in that order).
    package static func storedRequest(_ row: Row) throws -> StoredRequest {
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
    package static func insert(_ db: Database, app: String, request: TaskRequest, submittedAt: Date) throws {
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
    package static func end(_ db: Database, _ record: RunRecord, file: String, json encoded: String? = nil) throws {
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

    package static func json(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    /// What a launch writes at its begin and end, in the encoder's text without the encoder
    /// (`RecordJSON`: a few µs where the encoder took tens, at every launch).
    package static func json(_ tasks: [TaskAssignment]) -> String { RecordJSON.tasks(tasks) }
    package static func json(_ identifiers: [String]) -> String { RecordJSON.strings(identifiers) }
    /// A record's JSON (`RunRecord.jsonData`'s text).
    package static func json(_ record: RunRecord) throws -> String {
        try RecordJSON.record(record) ?? String(decoding: record.jsonData(), as: UTF8.self)
    }

    /// Creates the directory when missing (syncing its parent, so the new entry survives power
    /// loss) and checks that the directory and an existing file can be written: SQLite would
    /// otherwise open read-only and fail later, less clearly.
    package static func prepare(directory: URL, databasePath: String) throws(BGTaskError) {
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
    package func inCachedTransaction<T>(_ kind: StaticString, _ body: () throws -> T) throws -> T {
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

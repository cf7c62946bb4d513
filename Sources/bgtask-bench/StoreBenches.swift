import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskModel
import Foundation
import GRDB
import Glibc

/// The INSERT `PendingRequestStore.insert` executes (Sources/BGTaskHost/Store/PendingRequestStore.swift),
/// so the floors write the same rows into the same schema.
let requestInsertSQL = """
    INSERT INTO request (app, identifier, kind, earliest, requires_network, requires_power,
        protection_type, title, subtitle, strategy_fail, required_resources, submitted_at)
    VALUES (?, ?, ?, ?, 0, 0, 0, NULL, NULL, 0, 0, ?)
    """

/// The statements behind `dueApps` and `nextDueDate` (copied from PendingRequestStore, which
/// keeps them internal), for EXPLAIN QUERY PLAN.
let dueAppsSQL = """
    SELECT app FROM request WHERE running_launch IS NULL AND earliest IS NULL
    UNION
    SELECT app FROM request WHERE running_launch IS NULL AND earliest <= ?
    """
let nextDueDateSQL = "SELECT MIN(earliest) FROM request WHERE running_launch IS NULL AND earliest > ?"

/// An empty store database with the real schema (created and migrated by the product), closed.
func makeStoreDatabase(in directory: URL) throws -> String {
    let store = try PendingRequestStore(directory: directory)
    return store.databaseURL.path
}

/// Opens a store database as the product does: WAL (a pool) and synchronous = FULL.
func openLikeTheStore(_ path: String) throws -> DatabasePool {
    var configuration = Configuration()
    configuration.busyMode = .timeout(5)
    let pool = try DatabasePool(path: path, configuration: configuration)
    try pool.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = FULL") }
    return pool
}

// MARK: SQLite floors

enum SQLiteFloor {
    /// Rows per second inserted `batch` to a transaction, `rows` in all.
    static func batched(in directory: URL, rows: Int, batch: Int = 1000) throws -> Double {
        let pool = try openLikeTheStore(try makeStoreDatabase(in: directory))
        let now = Date().timeIntervalSince1970
        let t0 = monotonicNs()
        var written = 0
        while written < rows {
            let start = written
            let end = min(rows, start + batch)
            try pool.write { db in
                let statement = try db.cachedStatement(sql: requestInsertSQL)
                for i in start..<end {
                    try statement.execute(arguments: ["com.floor.a\(i / 100)", "com.floor.a\(i / 100).t\(i % 100)", "processing", now + 86_400, now])
                }
            }
            written = end
        }
        return Double(rows) / seconds(since: t0)
    }

    /// Rows per second with one row per transaction (each commit synced), for `duration` s.
    static func singleRow(in directory: URL, duration: Double) throws -> Double {
        let pool = try openLikeTheStore(try makeStoreDatabase(in: directory))
        let now = Date().timeIntervalSince1970
        let t0 = monotonicNs()
        var i = 0
        while seconds(since: t0) < duration {
            try pool.write { db in
                try db.cachedStatement(sql: requestInsertSQL)
                    .execute(arguments: ["com.floor.a\(i / 100)", "com.floor.a\(i / 100).t\(i % 100)", "processing", now + 86_400, now])
            }
            i += 1
        }
        return Double(i) / seconds(since: t0)
    }
}

// MARK: Submissions over the control socket

/// `PendingRequestStore.submit` called in-process from `threads` threads for `duration` s (new
/// rows, the same per-app read, delete and insert as the host's submit): the store's share of
/// a submission, without the host, the socket or JSON.
func storeSubmitRate(in directory: URL, threads: Int, duration: Double) throws -> Double {
    let store = try PendingRequestStore(directory: directory)
    let acknowledged = Locked(0)
    let earliest = Date().timeIntervalSince1970 + 365 * 86_400
    let t0 = monotonicNs()
    let deadline = t0 + UInt64(duration * 1e9)
    onThreads(threads) { thread in
        var ok = 0
        var index = thread
        while monotonicNs() < deadline {
            let app = SubmitWorkload.app(index)
            for (identifier, kind) in SubmitWorkload.identifiers(index) where monotonicNs() < deadline {
                let request = TaskRequest(kind: kind, identifier: identifier, earliestBeginDate: earliest)
                if (try? store.submit(app: app, request: request, at: Date(), rules: nil)) == .some(nil) { ok += 1 }
            }
            index += threads
        }
        acknowledged.withLock { $0 += ok }
    }
    return Double(acknowledged.current) / seconds(since: t0)
}

/// A control connection kept open for many requests (the server reads frames in a loop; the
/// product's `ControlClient` opens one connection per request, as the CLI does).
final class PersistentControlConnection {
    private let fd: Int32
    private let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()

    init(path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard fd >= 0, connected == 0 else { throw BenchError("cannot connect to \(path): \(String(cString: strerror(errno)))") }
    }

    deinit { close(fd) }

    func send(_ command: ControlCommand) throws -> ControlResponse {
        try ControlFrame.write(try ControlCodec.encode(command), to: fd)
        guard let payload = try ControlFrame.read(from: fd) else { throw BenchError("the host closed the connection") }
        return try decoder.decode(ControlResponse.self, from: payload)
    }
}

struct SubmitResult {
    var perSecond: Double
    /// The host's CPU time per acknowledged submission, µs.
    var hostCPUPerSubmitUs: Double
    var acknowledged: Int
    var refused: Int
    var firstRefusal: String?
}

/// `apps` apps, each permitting one refresh and ten processing identifiers (Apple's per-app
/// limits: 1 refresh + 10 processing pending).
struct SubmitWorkload {
    let apps: Int
    static func app(_ index: Int) -> String { String(format: "com.bench.s%05d", index) }
    static func identifiers(_ index: Int) -> [(String, TaskKind)] {
        let app = app(index)
        return [("\(app).refresh", .refresh)] + (0..<10).map { ("\(app).p\($0)", .processing) }
    }

    func makeBundles(in plugins: URL) throws {
        try FileManager.default.createDirectory(at: plugins, withIntermediateDirectories: true)
        for index in 0..<apps {
            try makeBenchBundle(at: plugins.appendingPathComponent(String(format: "S%05d.app", index)),
                                identifier: Self.app(index), permitted: Self.identifiers(index).map(\.0))
        }
    }

    /// The (app, identifier) slots split over `threads`, round and round until `duration` runs
    /// out. Each acknowledged submission is durable in the host's store (committed and synced):
    /// a new row on the first pass over a slot, a replacement (delete + insert) after.
    /// How a client thread sends its submissions.
    enum Mode {
        /// `ControlClient.send(_:)`: one connection per request, as the CLI does.
        case connectionPerRequest
        /// One connection kept open, one request at a time.
        case persistent
        /// `ControlClient.send(_:window:)`: `window` requests written at once on a connection,
        /// then their answers read.
        case pipelined(window: Int)
    }

    func submit(threads: Int, duration: Double, mode: Mode, state: URL, hostPID: pid_t) -> SubmitResult {
        let cpu0 = ProcStat.cpuSeconds(hostPID) ?? .nan
        let counts = Locked<(ok: Int, refused: Int, first: String?)>((0, 0, nil))
        let earliest = Date().timeIntervalSince1970 + 365 * 86_400
        let socketPath = state.appendingPathComponent("control.sock").path
        let t0 = monotonicNs()
        let deadline = t0 + UInt64(duration * 1e9)
        onThreads(threads) { thread in
            let client = ControlClient(stateDirectory: state)
            var connection: PersistentControlConnection?
            if case .persistent = mode { connection = try? PersistentControlConnection(path: socketPath) }
            var window = 1
            if case .pipelined(let size) = mode { window = size }
            var ok = 0, refused = 0
            var first: String?
            var batch: [ControlCommand] = []
            func flush() {
                guard !batch.isEmpty else { return }
                let responses: [ControlResponse?]
                if let connection {
                    responses = batch.map { try? connection.send($0) }
                } else if case .pipelined = mode {
                    let answers = try? client.send(batch, window: window)
                    responses = answers ?? batch.map { _ in nil }
                } else {
                    responses = batch.map { try? client.send($0) }
                }
                for response in responses {
                    if response?.ok == true {
                        ok += 1
                    } else {
                        refused += 1
                        first = first ?? response?.error.map { "\($0.code): \($0.message)" } ?? "no answer"
                    }
                }
                batch.removeAll(keepingCapacity: true)
            }
            // This thread's slots, round and round: a new row the first time, a replacement
            // (delete + insert) after; both are durable submissions.
            outer: while true {
                for index in stride(from: thread, to: apps, by: threads) {
                    for (identifier, kind) in Self.identifiers(index) {
                        if monotonicNs() >= deadline { break outer }
                        batch.append(.submit(
                            app: Self.app(index),
                            request: TaskRequest(kind: kind, identifier: identifier, earliestBeginDate: earliest + Double(ok + batch.count))))
                        if batch.count >= window { flush() }
                    }
                }
            }
            flush()
            counts.withLock { $0 = ($0.ok + ok, $0.refused + refused, $0.first ?? first) }
        }
        let elapsed = seconds(since: t0)
        let result = counts.current
        let hostCPU = (ProcStat.cpuSeconds(hostPID) ?? .nan) - cpu0
        return SubmitResult(perSecond: Double(result.ok) / elapsed, hostCPUPerSubmitUs: hostCPU / Double(result.ok) * 1e6, acknowledged: result.ok, refused: result.refused, firstRefusal: result.first)
    }
}

// MARK: A host with many pending requests

struct PendingWorkload {
    let count: Int
    let apps: Int
    var perApp: Int { max(1, count / apps) }

    static func app(_ index: Int) -> String { String(format: "com.bench.p%05d", index) }
    static func identifier(_ app: Int, _ slot: Int) -> String { "\(Self.app(app)).t\(slot)" }

    /// Bundles for every app, each permitting its identifiers.
    func makeBundles(in plugins: URL) throws {
        try FileManager.default.createDirectory(at: plugins, withIntermediateDirectories: true)
        for index in 0..<apps {
            try makeBenchBundle(at: plugins.appendingPathComponent(String(format: "P%05d.app", index)),
                                identifier: Self.app(index), permitted: (0..<perApp).map { Self.identifier(index, $0) })
        }
    }

    /// Writes `count` pending rows straight into a store database the product created (so the
    /// schema and its indexes are the real ones), in big transactions. Earliest begin dates are
    /// spread over the next year, from one day ahead: nothing is due. Returns the earliest
    /// dates' 1,000th smallest value (a `dueApps` probe that finds 1,000 requests).
    func load(state: URL) throws -> (seconds: Double, thousandthDue: Double) {
        let path = try makeStoreDatabase(in: state)
        let queue = try DatabaseQueue(path: path)
        // Loading is setup, not measured: no syncs.
        try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = OFF") }
        let now = Date().timeIntervalSince1970
        var generator = SplitMix(seed: 6)
        var earliest = [Double](repeating: 0, count: count)
        for i in 0..<count { earliest[i] = now + 86_400 + Double(generator.next() % (365 * 86_400 * 1000)) / 1000 }
        let t0 = monotonicNs()
        let batch = 50_000
        var written = 0
        while written < count {
            let start = written
            let end = min(count, start + batch)
            try queue.inTransaction { db in
                let statement = try db.makeStatement(sql: requestInsertSQL)
                for i in start..<end {
                    let app = i % apps, slot = i / apps
                    try statement.execute(arguments: [
                        Self.app(app), Self.identifier(app, slot), slot == 0 ? "refresh" : "processing", earliest[i], now,
                    ])
                }
                return .commit
            }
            written = end
        }
        try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        let loadSeconds = seconds(since: t0)
        earliest.sort()
        return (loadSeconds, earliest[min(999, count - 1)])
    }
}

/// A small deterministic generator (the load is the same every run).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// `body`'s duration in µs, `n` times (after 3 unmeasured warm-up calls).
func timeCalls(_ n: Int, _ body: () throws -> Void) rethrows -> Samples {
    for _ in 0..<3 { try body() }
    var samples = Samples()
    for _ in 0..<n {
        let t0 = monotonicNs()
        try body()
        samples.append(Double(monotonicNs() - t0) / 1000)
    }
    return samples
}

/// EXPLAIN QUERY PLAN of `sql` on `path`, one detail per line.
func queryPlan(_ path: String, _ sql: String, _ arguments: StatementArguments) throws -> [String] {
    let queue = try DatabaseQueue(path: path, configuration: { var c = Configuration(); c.readonly = true; return c }())
    return try queue.read { db in
        try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: arguments).map { $0["detail"] as String? ?? "" }
    }
}

/// How many pending requests the host's store holds (read-only, beside the running host).
func countPending(state: URL) throws -> Int {
    var configuration = Configuration()
    configuration.readonly = true
    let queue = try DatabaseQueue(path: state.appendingPathComponent("bgtask.sqlite").path, configuration: configuration)
    return try queue.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM request WHERE running_launch IS NULL") ?? 0 }
}

import BGTaskControl
import BGTaskModel
import Foundation
import GRDB

/// Energy accounting and MetricKit's payloads: each app's use summed per day of the host's clock
/// (`app_day`) as its launches end, in the transaction that stores the record; the crashes, hangs
/// and CPU exceptions of those days (`app_diagnostic`); which days a launch has been handed.
extension PendingRequestStore {
    /// Days kept (MetricKit keeps a week of past payloads; a month leaves room to look back).
    public static let keptDays = 30
    /// Diagnostics kept per app and day: enough to see a pattern, bounded against a crash loop.
    public static let diagnosticsPerDay = 25

    /// Adds `record` to its app's day `day` (midnight UTC of the host's clock when it ended),
    /// marks the day excessive when it passes `EnergyBudget`, and keeps a diagnostic of a crash,
    /// a hang or a CPU exception.
    package static func addToDay(_ db: Database, _ record: RunRecord, day: Date) throws {
        let background = record.reason != LaunchReason.foreground.rawValue
        let energy = record.energy ?? RunRecord.EnergyRecord()
        var exits = [String: Int]()
        if background, let column = exitColumn(record) {
            exits[column] = 1
            if column == "exit_abnormal", let extra = signalColumn(record.signal) { exits[extra] = 1 }
        }
        let columns = ["exit_normal", "exit_memory", "exit_cpu", "exit_watchdog", "exit_assertion", "exit_abnormal", "exit_bad_access", "exit_illegal", "exit_disk"]
        let key = day.timeIntervalSince1970
        // One statement in the common case (the launch-finishing transaction runs one per record):
        // the sums it leaves come back with it.
        let sums = try Row.fetchOne(db.cachedStatement(sql: """
            INSERT INTO app_day (app, day, launches, cpu_ms, background_ms, foreground_ms, peak_memory, disk_written, disk_read, wakeups,
                                 background_cpu_ms, background_disk_written, network_sent, network_received, \(columns.joined(separator: ", ")))
            VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, \(columns.map { _ in "?" }.joined(separator: ", ")))
            ON CONFLICT(app, day) DO UPDATE SET
                launches = launches + 1, cpu_ms = cpu_ms + excluded.cpu_ms, background_ms = background_ms + excluded.background_ms,
                foreground_ms = foreground_ms + excluded.foreground_ms, peak_memory = max(peak_memory, excluded.peak_memory),
                disk_written = disk_written + excluded.disk_written, disk_read = disk_read + excluded.disk_read,
                wakeups = wakeups + excluded.wakeups, background_cpu_ms = background_cpu_ms + excluded.background_cpu_ms,
                background_disk_written = background_disk_written + excluded.background_disk_written,
                network_sent = network_sent + excluded.network_sent, network_received = network_received + excluded.network_received,
                \(columns.map { "\($0) = \($0) + excluded.\($0)" }.joined(separator: ", "))
            RETURNING launches, background_cpu_ms, background_disk_written, excess
            """), arguments: StatementArguments([
                record.app, key, record.cpuMs, background ? record.wallMs : 0, background ? 0 : record.wallMs,
                Int64(clamping: record.peakRSSBytes), Int64(clamping: energy.diskWrittenBytes), Int64(clamping: energy.diskReadBytes),
                Int64(clamping: energy.wakeups), background ? record.cpuMs : 0, background ? Int64(clamping: energy.diskWrittenBytes) : 0,
                Int64(clamping: energy.networkSentBytes ?? 0), Int64(clamping: energy.networkReceivedBytes ?? 0),
            ] + columns.map { exits[$0] ?? 0 } as [any DatabaseValueConvertible]))
        if background, let row = sums, try row.decode(String?.self, atIndex: 3) == nil,
           let excess = EnergyBudget.excess(cpuMs: try row.decode(Double.self, atIndex: 1), diskWrittenBytes: UInt64(max(0, try row.decode(Int64.self, atIndex: 2)))) {
            try db.cachedStatement(sql: "UPDATE app_day SET excess = ? WHERE app = ? AND day = ?").execute(arguments: [excess, record.app, key])
        }
        if background, let diagnostic = diagnostic(of: record) {
            let count = try Int.fetchOne(db.cachedStatement(sql: "SELECT count(*) FROM app_diagnostic WHERE app = ? AND day = ?"), arguments: [record.app, key]) ?? 0
            if count < diagnosticsPerDay {
                let json = String(decoding: try MetricJSON.encoder.encode(diagnostic), as: UTF8.self)
                try db.cachedStatement(sql: "INSERT OR REPLACE INTO app_diagnostic (launch_id, app, day, diagnostic) VALUES (?, ?, ?, ?)")
                    .execute(arguments: [record.launchID, record.app, key, json])
            }
        }
        // What is older than the days kept goes (once per app and day: at the day's first launch).
        if try sums?.decode(Int.self, atIndex: 0) == 1 {
            let oldest = key - Double(keptDays) * 86_400
            try db.cachedStatement(sql: "DELETE FROM app_day WHERE app = ? AND day < ?").execute(arguments: [record.app, oldest])
            try db.cachedStatement(sql: "DELETE FROM app_diagnostic WHERE app = ? AND day < ?").execute(arguments: [record.app, oldest])
        }
    }

    /// The column of MetricKit's background exit counts a launch's end adds to (nil: none, a
    /// launch that never ran the app: launch-failed, host-lost).
    static func exitColumn(_ record: RunRecord) -> String? {
        switch record.termination {
        case .exited: "exit_normal"
        // Suspended after its work: the process did not exit (MetricKit counts no exit for it).
        case .suspended: nil
        case .jetsam: "exit_memory"
        case .cpuLimit: "exit_cpu"
        case .watchdog:
            // Only background time held, every task ended: iOS's background-task assertion timeout.
            record.tasks.allSatisfy({ $0.outcome != .unfinished }) && record.backgroundTime?.contains { $0.outcome == .notEnded } == true
                ? "exit_assertion" : "exit_watchdog"
        case .crashed: "exit_abnormal"
        case .disk, .diskQuota: "exit_disk"
        case .launchFailed, .hostLost: nil
        }
    }

    static func signalColumn(_ signal: String?) -> String? {
        switch signal {
        case "SIGSEGV", "SIGBUS": "exit_bad_access"
        case "SIGILL", "SIGTRAP": "exit_illegal"
        default: nil
        }
    }

    /// A crash, a hang (a watchdog kill) or a CPU exception, from the record.
    static func diagnostic(of record: RunRecord) -> MetricDiagnostic? {
        let kind: MetricDiagnostic.Kind
        switch record.termination {
        case .crashed: kind = .crash
        case .watchdog: kind = .hang
        case .cpuLimit: kind = .cpuException
        default: return nil
        }
        // A hang lasts from its expiration (when it should have ended) to the kill.
        let duration = kind == .hang ? max(0, record.wallMs - (record.expiredAtMs ?? 0)) : record.wallMs
        return MetricDiagnostic(kind: kind, launchID: record.launchID, at: record.startedAt, durationMs: duration, signal: record.signal,
                                exitStatus: record.exitStatus, reason: record.error.map { RunRecord.bounded($0, 1024) },
                                cpuMs: kind == .cpuException ? record.cpuMs : nil)
    }

    /// The app's days (newest first), each with its diagnostics and whether it was delivered.
    public func metricDays(app: String, limit: Int = keptDays) throws(BGTaskError) -> [(day: MetricDay, diagnostics: [MetricDiagnostic], delivered: Bool, excess: String?)] {
        try read("read the metrics of \(app)") { db in
            try Self.days(db, app: app, sql: "WHERE app = ? ORDER BY day DESC LIMIT ?", arguments: [app, limit])
        }
    }

    /// The app's days that ended before `today` and were not delivered yet, oldest first, with
    /// their diagnostics (at most `deliveredDiagnostics`, the newest, each reason at most 512
    /// bytes: what a launch is handed must fit its start message). Nil when there are none.
    public func undeliveredMetrics(app: String, before today: Date) throws(BGTaskError) -> (days: [MetricDay], diagnostics: [MetricDiagnostic])? {
        try read("read the undelivered metrics of \(app)") { db in
            let days = try Self.days(db, app: app, sql: "WHERE app = ? AND day < ? AND delivered = 0 ORDER BY day", arguments: [app, today.timeIntervalSince1970])
            guard !days.isEmpty else { return nil }
            let diagnostics = days.flatMap(\.diagnostics).suffix(Self.deliveredDiagnostics).map { diagnostic in
                var bounded = diagnostic
                bounded.reason = diagnostic.reason.map { RunRecord.bounded($0, 512) }
                return bounded
            }
            return (days.map(\.day), Array(diagnostics))
        }
    }

    /// The app took its days before `today` (its MetricKit subscriber was handed them): they are
    /// delivered, and not offered again (MetricKit gives a day's payload once).
    public func markMetricsDelivered(app: String, before today: Date) throws(BGTaskError) {
        try writeUnsynced("mark the metrics of \(app) delivered") { db in
            try db.cachedStatement(sql: "UPDATE app_day SET delivered = 1 WHERE app = ? AND day < ? AND delivered = 0")
                .execute(arguments: [app, today.timeIntervalSince1970])
        }
    }

    /// Each app's oldest day not delivered yet (what `undeliveredMetrics` would offer once the
    /// day has ended): read once when the host starts, so that a launch reads the store for its
    /// metrics only when there are some.
    public func undeliveredDays() throws(BGTaskError) -> [String: Date] {
        try read("list the apps with undelivered metrics") { db in
            var days: [String: Date] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT app, min(day) FROM app_day WHERE delivered = 0 GROUP BY app") {
                days[row[0]] = Date(timeIntervalSince1970: row[1])
            }
            return days
        }
    }

    /// A suspended process of `app` was evicted for memory pressure on `day` (the host's clock):
    /// counted with that day's exits (no launch ended: the launch before it ended `suspended`).
    public func countMemoryPressureExit(app: String, day: Date) throws(BGTaskError) {
        try writeUnsynced("count a memory-pressure exit of \(app)") { db in
            try db.cachedStatement(sql: """
                INSERT INTO app_day (app, day, exit_memory_pressure) VALUES (?, ?, 1)
                ON CONFLICT(app, day) DO UPDATE SET exit_memory_pressure = exit_memory_pressure + 1
                """).execute(arguments: [app, day.timeIntervalSince1970])
        }
    }

    /// Diagnostics handed to one launch at most.
    public static let deliveredDiagnostics = 50

    private static func days(_ db: Database, app: String, sql: String, arguments: StatementArguments) throws
        -> [(day: MetricDay, diagnostics: [MetricDiagnostic], delivered: Bool, excess: String?)] {
        let rows = try Row.fetchAll(db, sql: """
            SELECT day, launches, cpu_ms, background_ms, foreground_ms, peak_memory, disk_written, disk_read, wakeups,
                   exit_normal, exit_memory, exit_cpu, exit_watchdog, exit_assertion, exit_abnormal, exit_bad_access, exit_illegal, exit_disk,
                   delivered, excess, network_sent, network_received, exit_memory_pressure
            FROM app_day \(sql)
            """, arguments: arguments)
        return try rows.map { row in
            let begin = Date(timeIntervalSince1970: try row.decode(Double.self, atIndex: 0))
            func count(_ index: Int) throws -> Int { try row.decode(Int.self, atIndex: index) }
            func bytes(_ index: Int) throws -> UInt64 { UInt64(max(0, try row.decode(Int64.self, atIndex: index))) }
            var exits = MetricDay.Exits()
            (exits.normal, exits.memoryLimit, exits.cpuLimit, exits.watchdog) = (try count(9), try count(10), try count(11), try count(12))
            (exits.backgroundTaskAssertionTimeout, exits.abnormal, exits.badAccess) = (try count(13), try count(14), try count(15))
            (exits.illegalInstruction, exits.disk, exits.memoryPressure) = (try count(16), try count(17), try count(22))
            var day = MetricDay(begin: begin, end: begin.addingTimeInterval(86_400 - 0.001), launches: try count(1), cpuMs: try row.decode(Double.self, atIndex: 2),
                                backgroundMs: try row.decode(Double.self, atIndex: 3), foregroundMs: try row.decode(Double.self, atIndex: 4),
                                peakMemoryBytes: try bytes(5), diskWrittenBytes: try bytes(6), diskReadBytes: try bytes(7), wakeups: try bytes(8), exits: exits)
            // Its own connections' bytes, and what the host moved for it: its background sessions'
            // transfers that ended that day.
            (day.networkUploadBytes, day.networkDownloadBytes) = (try bytes(20), try bytes(21))
            if let sums = try Row.fetchOne(db, sql: """
                SELECT coalesce(sum(bytes_sent), 0), coalesce(sum(bytes_received), 0) FROM transfer
                WHERE app = ? AND finished_at >= ? AND finished_at < ?
                """, arguments: [app, begin.timeIntervalSince1970, begin.timeIntervalSince1970 + 86_400]) {
                day.networkUploadBytes += try Self.bytes(0, of: sums)
                day.networkDownloadBytes += try Self.bytes(1, of: sums)
            }
            let diagnostics = try String.fetchAll(db, sql: "SELECT diagnostic FROM app_diagnostic WHERE app = ? AND day = ? ORDER BY rowid",
                                                  arguments: [app, begin.timeIntervalSince1970])
                .compactMap { try? MetricJSON.decoder.decode(MetricDiagnostic.self, from: Data($0.utf8)) }
            return (day, diagnostics, try row.decode(Bool.self, atIndex: 18), try row.decode(String?.self, atIndex: 19))
        }
    }

    private static func bytes(_ index: Int, of row: Row) throws -> UInt64 { UInt64(max(0, try row.decode(Int64.self, atIndex: index))) }
}

import BGTaskControl
import BGTaskHost
import BGTaskModel
import BGTaskStore
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Energy accounting: what each launch cost (in its record), summed per app and day, judged
/// against the daily budget, and handed to MetricKit once.
@Suite struct EnergyTests {
    private static let day0 = Date(timeIntervalSince1970: 1_800_057_600)  // a midnight UTC

    private func record(_ id: String, _ termination: RunRecord.Termination, cpuMs: Double = 100, wallMs: Double = 1_000, written: UInt64 = 0,
                        wakeups: UInt64 = 10, reason: String = "scheduled", signal: String? = nil, tasks: [RunRecord.Outcome] = [.succeeded],
                        backgroundTimeHeld: Bool = false) -> RunRecord {
        var record = RunRecord(app: "com.example.app", launchID: id, reason: reason,
                               tasks: tasks.map { RunRecord.TaskRecord(identifier: "com.example.app.t", type: .refresh, outcome: $0) },
                               termination: termination, signal: signal, exitStatus: nil, error: "it ended \(termination.rawValue)",
                               wallMs: wallMs, cpuMs: cpuMs, peakRSSBytes: 8 << 20, memoryLimitBytes: 0, memoryMechanism: "sampler",
                               budgetMs: 30_000, graceMs: 5_000, expiredAtMs: termination == .watchdog ? wallMs - 5_000 : nil, pid: 1,
                               startedAt: Self.day0.addingTimeInterval(3_600), bundlePath: "/p", log: nil, registered: [], refusedRegistrations: [], submitted: [])
        record.energy = RunRecord.EnergyRecord(diskWrittenBytes: written, diskReadBytes: 4096, wakeups: wakeups, cpuLimit: "80% of a core over 1m")
        if backgroundTimeHeld { record.backgroundTime = [RunRecord.BackgroundTimeRecord(id: 1, outcome: .notEnded, beganMs: 1)] }
        return record
    }

    @Test func eachDaySumsWhatItsLaunchesRecordedAndCountsExitsAsMetricKitDoes() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let store = try PendingRequestStore(directory: scratch.state)
        let day1 = Self.day0.addingTimeInterval(86_400)
        let launches: [(RunRecord, Date)] = [
            (record("L1", .exited, cpuMs: 100, written: 1 << 20), Self.day0),
            (record("L2", .suspended, cpuMs: 50, wakeups: 5), Self.day0),
            (record("L3", .jetsam), Self.day0),
            (record("L4", .watchdog, wallMs: 35_000, tasks: [.unfinished]), Self.day0),
            (record("L5", .watchdog, wallMs: 36_000, tasks: [.succeeded], backgroundTimeHeld: true), Self.day0),
            (record("L6", .crashed, signal: "SIGSEGV"), Self.day0),
            (record("L7", .cpuLimit, cpuMs: 48_000), Self.day0),
            (record("L8", .diskQuota), Self.day0),
            (record("L9", .exited, wallMs: 9_000, reason: "foreground"), Self.day0),
            (record("L10", .launchFailed), Self.day0),
            (record("L11", .exited, cpuMs: 7), day1),
        ]
        for (record, day) in launches {
            try store.beginLaunch(id: record.launchID, app: record.app, reason: record.reason, tasks: [], at: record.startedAt)
            _ = try store.finishLaunch(record, day: day)
        }
        let days = try store.metricDays(app: "com.example.app")
        #expect(days.map(\.day.begin) == [day1, Self.day0], "newest first")
        let first = try #require(days.last)
        #expect(first.day.launches == 10)
        #expect(first.day.cpuMs == 48_850.0, "eight launches of 100 ms, one of 50 ms, one of 48 s")
        #expect(first.day.foregroundMs == 9_000)
        #expect(first.day.diskWrittenBytes == 1 << 20)
        #expect(first.day.wakeups == 95)
        #expect(first.day.peakMemoryBytes == 8 << 20)
        let exits = first.day.exits
        let counted: [Int] = [exits.normal, exits.memoryLimit, exits.watchdog, exits.backgroundTaskAssertionTimeout]
        let others: [Int] = [exits.abnormal, exits.badAccess, exits.cpuLimit, exits.disk]
        #expect(counted == [1, 1, 1, 1], "\(exits): a suspended process did not exit")
        #expect(others == [1, 1, 1, 1], "\(exits)")
        #expect(exits.total == 7, "the suspended, the foreground launch and the one that never ran count in no exit")
        #expect(first.diagnostics.map(\.kind) == [.hang, .hang, .crash, .cpuException])
        #expect(first.diagnostics.first?.durationMs == 5_000, "a hang lasts from its expiration to its kill")
        #expect(first.diagnostics.first { $0.kind == .crash }?.signal == "SIGSEGV")
        #expect(first.excess == nil, "48 s of CPU is within the day's budget")

        // MetricKit: the days that ended, until the app takes them.
        #expect(try store.undeliveredMetrics(app: "com.example.app", before: Self.day0) == nil, "day 0 has not ended")
        let offered = try #require(try store.undeliveredMetrics(app: "com.example.app", before: day1))
        #expect(offered.days.map(\.begin) == [Self.day0] && offered.diagnostics.count == 4)
        #expect(try store.undeliveredMetrics(app: "com.example.app", before: day1)?.days.count == 1, "offered again until taken")
        try store.markMetricsDelivered(app: "com.example.app", before: day1)
        #expect(try store.undeliveredMetrics(app: "com.example.app", before: day1.addingTimeInterval(86_400))?.days.map(\.begin) == [day1])
        try store.markMetricsDelivered(app: "com.example.app", before: day1.addingTimeInterval(86_400))
        #expect(try store.undeliveredMetrics(app: "com.example.app", before: day1.addingTimeInterval(86_400)) == nil)
        #expect(try store.metricDays(app: "com.example.app").allSatisfy(\.delivered))
    }

    @Test func aDayOverItsBudgetIsMarkedAndTheRealisticPolicySchedulesTheAppLess() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let store = try PendingRequestStore(directory: scratch.state)
        for index in 0..<3 {
            let big = record("B\(index)", .exited, cpuMs: 250_000)
            try store.beginLaunch(id: big.launchID, app: big.app, reason: big.reason, tasks: [], at: big.startedAt)
            _ = try store.finishLaunch(big, day: Self.day0) { $0.lastLaunchAt = Self.day0.addingTimeInterval(3_600) }
        }
        let excess = try #require(try store.metricDays(app: "com.example.app").first?.excess)
        #expect(excess.contains("of background CPU that day, over the 10m a day allows"), "\(excess)")
        let state = try store.appState("com.example.app")
        #expect(state.energyExcessDay == Self.day0 && state.energyExcess == excess)

        func blockers(_ kind: TaskKind, at now: Date) -> [Blocker] {
            let eligibility = Eligibility(policy: .realistic, now: now, conditions: DeviceConditions(), runningLaunches: 0, maximumConcurrentLaunches: 4)
            let stored = StoredRequest(app: "com.example.app", request: TaskRequest(kind: kind, identifier: "com.example.app.t"), submittedAt: now)
            return eligibility.blockers(for: stored, app: nil, state: state, appRunning: false).filter { $0.code == "energy" || $0.code == "rate-limit" }
        }
        let lastLaunch = Self.day0.addingTimeInterval(3_600)
        // 20 minutes after the last launch: a refresh would be due, but not for an app over its budget.
        let refresh = blockers(.refresh, at: lastLaunch.addingTimeInterval(20 * 60))
        #expect(refresh.map(\.code) == ["energy"] && refresh.first?.until == lastLaunch.addingTimeInterval(3_600), "\(refresh)")
        #expect(blockers(.refresh, at: lastLaunch.addingTimeInterval(5 * 60)).map(\.code) == ["rate-limit"])
        #expect(blockers(.refresh, at: lastLaunch.addingTimeInterval(61 * 60)).isEmpty)
        let processing = blockers(.processing, at: lastLaunch.addingTimeInterval(60))
        #expect(processing.map(\.code) == ["energy"] && processing.first?.until == Self.day0.addingTimeInterval(86_400))
        // The next day the budget starts again.
        #expect(blockers(.processing, at: Self.day0.addingTimeInterval(86_400 + 60)).isEmpty)
    }

    @Test func aLaunchRecordsWhatItWroteAndWokeAndTheHostSumsItsDay() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual"], installing: [.misbehaving])
        defer { host.stop() }
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.write"]).status == 0)
        let record = try #require(try host.waitForHistory(count: 1).first)
        #expect(record.task("com.example.misbehaving.write")?.outcome == .succeeded, "\(record)")
        let energy = try #require(record.energy)
        #expect(energy.wakeups > 0)
        #expect(energy.cpuLimit == "80% of a core over 1m", "the host's default, iOS's")
        // Pages dirtied in a file count as storage writes (a tmpfs holds memory: nothing to count).
        if Self.filesystemType(of: scratch.state.path) != "tmpfs" { #expect(energy.diskWrittenBytes >= 4 << 20, "\(energy)") }

        let metrics = try host.cli(["metrics", "com.example.misbehaving"])
        #expect(metrics.status == 0 && metrics.stdout.contains("1 launch(es)") && metrics.stdout.contains("background exits: none"), "\(metrics.stdout)")
        let reports = try host.call(.metrics(app: "com.example.misbehaving"))
        #expect(reports.count == 1 && reports[0].day.wakeups == energy.wakeups && reports[0].day.diskWrittenBytes == energy.diskWrittenBytes)
        let unknown = try host.cli(["metrics", "com.example.nobody"])
        #expect(unknown.status != 0 && unknown.stderr.contains("com.example.nobody"), "\(unknown.stderr)")
    }

    /// The app's own connections: a launch that sends 256 KiB over TCP and reads 128 KiB back,
    /// keeping its connection open as it is suspended, has those bytes in its record and its
    /// day; the next launch of the same (resumed) process counts from them, not again.
    @Test func aLaunchRecordsWhatItsOwnConnectionsMovedAndTheNextLaunchCountsFromThere() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let server = try LoopbackPeer(receive: 256 << 10, answer: 128 << 10)
        defer { server.stop() }
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual"])
        let staged = try scratch.bundle("Misbehaving", info: TestBundle.misbehaving.info, name: "staged-M.app")
        try "\(server.port)\n".write(to: staged.appendingPathComponent("connect-port"), atomically: true, encoding: .utf8)
        try FileManager.default.moveItem(at: staged, to: host.plugins.appendingPathComponent("M.app"))
        try host.start()
        defer { host.stop() }
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.connect"]).status == 0)
        let record = try #require(try host.waitForHistory(count: 1).first)
        #expect(record.task("com.example.misbehaving.connect")?.outcome == .succeeded, "\(record)")
        #expect(server.received == 256 << 10, "the peer received \(server.received)")
        let energy = try #require(record.energy)
        // Payload counted by the kernel per socket: what the app sent and what it read (a
        // retransmission would count as sent again; none on loopback).
        #expect(energy.networkSentBytes == 256 << 10 && energy.networkReceivedBytes == 128 << 10, "\(energy)")
        #expect(record.termination == .suspended, "its connection stays open in its suspended process: \(record.termination)")
        #expect(record.description.contains("256.0 KiB sent, 128.0 KiB received on its connections"), "\(record)")

        // The same process again: its open connection moved nothing more.
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.ok"]).status == 0)
        let records = try host.waitForHistory(count: 2)
        let second = try #require(records.first { $0.launchID != record.launchID })
        #expect(second.resumed == true && second.energy?.networkSentBytes == 0 && second.energy?.networkReceivedBytes == 0,
                "\(second.resumed ?? false) \(String(describing: second.energy))")
        let reports = try host.call(.metrics(app: "com.example.misbehaving"))
        #expect(reports.count == 1 && reports[0].day.networkUploadBytes == 256 << 10 && reports[0].day.networkDownloadBytes == 128 << 10,
                "\(reports.map(\.day))")
    }

    /// The type of the filesystem holding `path` (the longest mount point over it in /proc/self/mounts).
    static func filesystemType(of path: String) -> String? {
        let mounts = (try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? ""
        var best: (point: String, type: String)?
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 2 else { continue }
            let point = String(fields[1])
            guard path == point || path.hasPrefix(point == "/" ? "/" : point + "/") else { continue }
            if point.count >= (best?.point.count ?? -1) { best = (point, String(fields[2])) }
        }
        return best?.type
    }

    /// MetricKit in real launches: a day's payload reaches the app's subscriber at its first
    /// launch after the day ends (here in its resumed process), once, in Apple's JSON shape,
    /// with that day's exits; `bgtask metrics` shows the same day as delivered.
    @Test func aDaysPayloadReachesTheAppsSubscriberAtItsNextLaunchOnce() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let metricsApp = TestBundle(library: "MetricsApp", info: "Tests/Fixtures/MetricsApp/Info.plist", name: "Metrics.app")
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual"], installing: [metricsApp])
        defer { host.stop() }
        let app = "com.example.metrics", refresh = "com.example.metrics.refresh"

        #expect(try host.cli(["submit", app, refresh]).status == 0)
        let first = try #require(try host.waitForHistory(count: 1).first)
        #expect(first.task(refresh)?.outcome == .succeeded, "\(first)")
        #expect(try String(contentsOfFile: try #require(first.log), encoding: .utf8).contains("metrics: refresh done, delivered false"))

        // The day ends; the next launch is handed it.
        #expect(try host.cli(["clock", "advance", "1d"]).status == 0)
        #expect(try host.cli(["submit", app, refresh]).status == 0)
        let records = try host.waitForHistory(count: 2)
        let second = try #require(records.first { $0.launchID != first.launchID })
        let log = try String(contentsOfFile: try #require(second.log), encoding: .utf8)
        #expect(log.contains("metrics: refresh done, delivered true"), "\(log)")
        let lines = log.split(separator: "\n").filter { $0.hasPrefix("metrics: payload ") }
        #expect(lines.count == 1, "one day, one payload: \(log)")
        let json = try #require(lines.first.map { String($0.split(separator: " ", maxSplits: 3)[3]) })
        // Read by Python's json module, not by this package's code.
        let script = "import json,sys; p=json.loads(sys.stdin.read()); b=p['applicationExitMetrics']['backgroundExitData']; "
            + "print(b['cumulativeNormalAppExitCount'], p['cpuMetrics']['cumulativeCPUTime'].split()[1], p['appVersion'], p['timeStampBegin'][:10], p['metaData']['appBuildVersion'])"
        let parsed = try runCommand(["/bin/sh", "-c", "printf '%s' \"$0\" | python3 -c \"$1\"", json, script])
        let reports = try host.call(.metrics(app: app))
        let dayText = { () -> String in
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withFullDate]
            return formatter.string(from: reports.last?.day.begin ?? Date())
        }()
        // Its launch ended in suspension (the host's default lifecycle): no exit, as MetricKit counts.
        #expect(parsed.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0 sec 1.2.0 \(dayText) 42", "\(parsed.stdout) \(parsed.stderr) \(json)")

        // The host's view: two days, the first delivered; its launch the one exit.
        #expect(reports.count == 2)
        #expect(reports.last?.delivered == true && reports.first?.delivered == false)
        #expect(reports.last?.day.exits.total == 0 && reports.last?.day.launches == 1)
        #expect(second.metricsDelivered == true && first.metricsDelivered == nil)
        // Handed once: a third launch the same day gets nothing.
        #expect(try host.cli(["submit", app, refresh]).status == 0)
        let third = try #require(try host.waitForHistory(count: 3).first { $0.launchID != first.launchID && $0.launchID != second.launchID })
        #expect(try String(contentsOfFile: try #require(third.log), encoding: .utf8).contains("metrics: payload") == false)
    }
}

/// A TCP peer on loopback for one connection: reads `receive` bytes, answers `answer` bytes,
/// then holds the connection until the other side closes it or the peer is stopped.
final class LoopbackPeer: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32
    private let lock = NSLock()
    private var receivedBytes = 0
    private var thread: Thread?
    private var stopped = false

    var received: Int { lock.withLock { receivedBytes } }

    init(receive: Int, answer: Int) throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listener = listener
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 }
        }
        guard bound, listen(listener, 4) == 0 else { throw POSIXError(.EADDRNOTAVAIL) }
        port = UInt16(bigEndian: address.sin_port)
        let thread = Thread { [self] in serve(receive: receive, answer: answer) }
        self.thread = thread
        thread.start()
    }

    private func serve(receive: Int, answer: Int) {
        var pollfd = Glibc.pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        // Bounded: a test that never connects leaves after 60 s.
        guard poll(&pollfd, 1, 60_000) == 1 else { return }
        let connection = accept(listener, nil, nil)
        guard connection >= 0 else { return }
        defer { close(connection) }
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        var total = 0
        while total < receive {
            let count = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress, min($0.count, receive - total), 0) }
            guard count > 0 else { return }
            total += count
            lock.withLock { receivedBytes = total }
        }
        let reply = [UInt8](repeating: 3, count: answer)
        var sent = 0
        while sent < answer {
            let count = reply.withUnsafeBytes { send(connection, $0.baseAddress! + sent, answer - sent, 0) }
            guard count > 0 else { return }
            sent += count
        }
        // Held until the app's side closes or the test stops the peer.
        while !lock.withLock({ stopped }) {
            var held = Glibc.pollfd(fd: connection, events: Int16(POLLIN), revents: 0)
            if poll(&held, 1, 100) == 1, buffer.withUnsafeMutableBytes({ recv(connection, $0.baseAddress, $0.count, 0) }) <= 0 { return }
        }
    }

    func stop() {
        lock.withLock { stopped = true }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }
}

import BGTaskLaunch
import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskModel
import BGTaskSystem
import Foundation
import GRDB
import Glibc
import _BGTaskSystemShims

// MARK: Stamps the BenchPlugin writes

/// What the BenchPlugin writes when one of its handlers is entered (`struct stamp` in
/// Tests/Fixtures/BenchPlugin/bench.c): CLOCK_MONOTONIC is the same clock in every PID
/// namespace, so it compares with this process's own.
struct Stamp {
    enum What: UInt64 { case handler = 1, expiration = 2, push = 3 }
    var what: UInt64
    var monotonicNs: UInt64
    var realtimeNs: UInt64
}

/// `DATA_DIRECTORY/bench-stamp` of one app, as a FIFO this process holds open (read and write,
/// so a launch's writer never finds it without a reader): a read wakes the moment the handler
/// writes, with no polling. The host gives the container (and this FIFO) to the app's uid at
/// its first launch.
final class StampFIFO {
    let fd: Int32
    let app: String

    init(container: URL, app: String) throws {
        self.app = app
        try FileManager.default.createDirectory(at: container, withIntermediateDirectories: true)
        let path = container.appendingPathComponent("bench-stamp").path
        unlink(path)
        guard mkfifo(path, 0o666) == 0 else { throw BenchError("mkfifo \(path): \(String(cString: strerror(errno)))") }
        chmod(path, 0o666)
        fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw BenchError("open \(path): \(String(cString: strerror(errno)))") }
    }

    deinit { close(fd) }

    /// The stamps waiting now (without blocking).
    func take() -> [Stamp] {
        var stamps: [Stamp] = []
        var buffer = [UInt64](repeating: 0, count: 3 * 64)
        while true {
            let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard got > 0 else { break }
            for i in 0..<(got / 24) { stamps.append(Stamp(what: buffer[3 * i], monotonicNs: buffer[3 * i + 1], realtimeNs: buffer[3 * i + 2])) }
            if got < buffer.count * 8 { break }
        }
        return stamps
    }

    /// The next stamp, waiting at most `timeoutMs`.
    func next(timeoutMs: Int32) -> Stamp? {
        if let first = pending.first { pending.removeFirst(); return first }
        let deadline = monotonicNs() + UInt64(timeoutMs) * 1_000_000
        while true {
            pending = take()
            if let first = pending.first { pending.removeFirst(); return first }
            let now = monotonicNs()
            guard now < deadline else { return nil }
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            _ = poll(&fds, 1, Int32((deadline - now) / 1_000_000) + 1)
        }
    }
    private var pending: [Stamp] = []
}

/// Waits for stamps on many FIFOs at once: every stamp of `what` until `count` arrived or
/// `timeout` passed; returns them with their app.
func collectStamps(_ fifos: [StampFIFO], what: Stamp.What, count: Int, timeout: Double) -> [(app: String, stamp: Stamp)] {
    var collected: [(app: String, stamp: Stamp)] = []
    let deadline = monotonicNs() + UInt64(timeout * 1e9)
    var fds = fifos.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
    while collected.count < count {
        let now = monotonicNs()
        guard now < deadline else { break }
        for i in fds.indices { fds[i].revents = 0 }
        let ready = poll(&fds, nfds_t(fds.count), Int32(min(1000, (deadline - now) / 1_000_000 + 1)))
        guard ready > 0 else { continue }
        for (i, entry) in fds.enumerated() where entry.revents != 0 {
            for stamp in fifos[i].take() where stamp.what == what.rawValue { collected.append((fifos[i].app, stamp)) }
        }
    }
    return collected
}

/// CLOCK_REALTIME in ns (the host's records and the stamps' second clock).
func realtimeNs() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// Descriptors for a thousand launches (the host's and this process's): the soft limit up to
/// the hard one. The host inherits it.
func raiseDescriptorLimit() {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}

// MARK: A host with BenchPlugin apps

/// A real `bgtask host` (immediate policy, real clock, confined as it runs by default) with
/// `apps` BenchPlugin apps, each with a stamp FIFO in its container.
final class EndToEndHost {
    static let identifiers = ["bench.stamp", "bench.sleep", "bench.hang", "bench.noop"]
    let host: HostProcess
    let apps: [String]
    let fifos: [String: StampFIFO]
    let client: ControlClient

    init(root: URL, apps count: Int, arguments: [String] = [], environment: [String: String] = [:]) throws {
        let plugins = root.appendingPathComponent("plugins")
        let state = root.appendingPathComponent("state")
        var apps: [String] = []
        var fifos: [String: StampFIFO] = [:]
        for index in 0..<count {
            let app = String(format: "com.example.e2e%04d", index)
            try makeBenchBundle(at: plugins.appendingPathComponent("E2E\(index).app"), identifier: app, permitted: Self.identifiers,
                                modes: ["fetch", "processing", "remote-notification"])
            fifos[app] = try StampFIFO(container: state.appendingPathComponent("containers/\(app)"), app: app)
            apps.append(app)
        }
        self.apps = apps
        self.fifos = fifos
        host = HostProcess(plugins: plugins, state: state, log: root.appendingPathComponent("host.log"),
                           arguments: ["--clock", "real", "--policy", "immediate"] + arguments, environment: environment)
        try host.start()
        client = host.client
    }

    func stop() { host.stop() }

    static func submission(_ app: String, _ identifier: String, kind: TaskKind = .refresh) -> ControlCommand {
        .submit(app: app, request: TaskRequest(kind: kind, identifier: identifier))
    }

    /// The records the host stored (read beside it, as `bgtask history` would, without the
    /// control socket's answer-size bound).
    func records(limit: Int) throws -> [RunRecord] {
        try PendingRequestStore(directory: host.state).history(app: nil, limit: limit)
    }

    /// The moment (realtime, ns) each launch of the store began, by launch id: `started_at` of
    /// its row, taken by the launch coordinator once the scheduling pass chose it, before the
    /// launch is recorded (the record's own `started_at` has milliseconds only).
    func launchRowStarts() throws -> [String: Double] {
        var configuration = Configuration()
        configuration.readonly = true
        let queue = try DatabaseQueue(path: host.state.appendingPathComponent("bgtask.sqlite").path, configuration: configuration)
        return try queue.read { db in
            var starts: [String: Double] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT id, started_at FROM launch") { starts[row["id"]] = row["started_at"] }
            return starts
        }
    }
}

/// What `timePushes` measured: µs from each push to its launch's entry and to its answer, and
/// the pushes that did not reach a launch entry, with the first one's reason.
struct PushTimes {
    var handler = Samples(), answer = Samples()
    var lost = 0
    var firstProblem: String?
}

/// Background pushes one at a time, each to the next of `apps`, 10 ms apart: from the push to
/// the app's `push` stamp (its launch entry). `prepare` runs outside the timing (a device
/// token); `send` pushes and says whether the push was taken, with why not, or, taken, what
/// the host said of its delivery (for a push whose launch entry never came).
func timePushes<Prepared>(_ count: Int, to apps: [String], fifos: [String: StampFIFO],
                          prepare: (String) throws -> Prepared,
                          send: (String, Prepared) throws -> (taken: Bool, detail: String)) throws -> PushTimes {
    var times = PushTimes()
    for i in 0..<count {
        let app = apps[i % apps.count]
        let fifo = fifos[app]!
        let prepared = try prepare(app)
        _ = fifo.take()
        let t0 = monotonicNs()
        let (taken, detail) = try send(app, prepared)
        times.answer.append(Double(monotonicNs() - t0) / 1000)
        guard taken else {
            times.lost += 1
            times.firstProblem = times.firstProblem ?? detail
            continue
        }
        guard let stamp = fifo.next(timeoutMs: 3000), stamp.what == Stamp.What.push.rawValue else {
            times.lost += 1
            times.firstProblem = times.firstProblem ?? "no launch entry stamp: \(detail)"
            continue
        }
        times.handler.append(Double(stamp.monotonicNs &- t0) / 1000)
        usleep(10_000)
    }
    return times
}

// MARK: One submission at a time

/// Every app of a host in turn: the next submission goes to the app used longest ago, so that
/// on an `--app-lifecycle ios` host it finds its app suspended (not still running its last
/// launch), and on a fresh host its app not running.
final class AppRotation {
    let e2e: EndToEndHost
    private var next = 0

    init(_ e2e: EndToEndHost) { self.e2e = e2e }

    func take() -> String {
        defer { next += 1 }
        return e2e.apps[next % e2e.apps.count]
    }
}

/// Submit → acknowledged and submit → handler entered, one submission at a time (a connection
/// per request, as `bgtask submit` makes one), over a rotation of a host's apps.
final class OneAtATime {
    /// The idle gap between a handler's entry and the next submission (bench-celery.sh's Celery
    /// side waits the same): what a sporadic submission finds.
    static let idleGapUs: UInt32 = 10_000

    let rotation: AppRotation
    var ack = Samples(), handler = Samples(), lost = 0
    /// Each measured submission: its app, when it was sent (realtime, ns) and when the handler
    /// stamped (realtime, ns), for `WhereItGoes`.
    var submitted: [(app: String, ns: UInt64, handlerRealtime: UInt64)] = []

    init(_ rotation: AppRotation) { self.rotation = rotation }

    /// `count` more submissions, `gapUs` of idle after each handler's entry (0: back to back).
    func run(_ count: Int, gapUs: UInt32) throws {
        let e2e = rotation.e2e
        for _ in 0..<count {
            let app = rotation.take()
            let fifo = e2e.fifos[app]!
            _ = fifo.take()
            let r0 = realtimeNs()
            let t0 = monotonicNs()
            let response = try e2e.client.send(EndToEndHost.submission(app, "bench.stamp"))
            let t1 = monotonicNs()
            guard response.ok else { throw BenchError("e2e submit refused: \(response.error?.message ?? "?")") }
            ack.append(Double(t1 - t0) / 1000)
            guard let stamp = fifo.next(timeoutMs: 5000) else { lost += 1; continue }
            handler.append(Double(stamp.monotonicNs &- t0) / 1000)
            submitted.append((app, r0, stamp.realtimeNs))
            if gapUs > 0 { usleep(gapUs) }
        }
    }
}

/// Where the time of measured submissions went, from the store beside their host: the launch
/// row's start (the scheduling pass chose it; realtime, taken before the launch is recorded),
/// the record's handler time (from the supervisor's start), and how many of the launches were
/// resumes of a suspended process (the record's `resumed`).
struct WhereItGoes {
    var toRow = Samples(), rowToHandler = Samples(), supervisorToHandler = Samples()
    var matched = 0, resumed = 0

    init(_ submitted: [(app: String, ns: UInt64, handlerRealtime: UInt64)], records: [RunRecord], rows: [String: Double]) {
        var byApp: [String: [(row: Double, record: RunRecord)]] = [:]
        for record in records { if let row = rows[record.launchID] { byApp[record.app, default: []].append((row * 1e9, record)) } }
        for app in byApp.keys { byApp[app]!.sort { $0.row < $1.row } }
        for sample in submitted {
            // The first launch of the app that began after the submission.
            guard let match = byApp[sample.app]?.first(where: { $0.row >= Double(sample.ns) - 1e6 }) else { continue }
            matched += 1
            if match.record.resumed == true { resumed += 1 }
            toRow.append((match.row - Double(sample.ns)) / 1000)
            rowToHandler.append((Double(sample.handlerRealtime) - match.row) / 1000)
            if let started = match.record.tasks.first?.startedMs { supervisorToHandler.append(started * 1000) }
        }
    }
}

extension SectionRunner {
    /// One sustained round: every app's request submitted at once (pipelined on one
    /// connection); launches/s until the last handler, and the drain in ms.
    static func drainRound(_ e2e: EndToEndHost, label: String) throws -> (rate: Double, drainMs: Double) {
        for fifo in e2e.fifos.values { _ = fifo.take() }
        let batch = e2e.apps.map { EndToEndHost.submission($0, "bench.stamp") }
        let t0 = monotonicNs()
        let responses = try e2e.client.send(batch, window: 256)
        guard responses.allSatisfy(\.ok) else { throw BenchError("e2e batch submit refused: \(responses.first { !$0.ok }?.error?.message ?? "?")") }
        let stamps = collectStamps(Array(e2e.fifos.values), what: .handler, count: e2e.apps.count, timeout: 120)
        let last = stamps.map(\.stamp.monotonicNs).max() ?? monotonicNs()
        if stamps.count < e2e.apps.count { progress("e2e (\(label)): only \(stamps.count) of \(e2e.apps.count) handlers entered") }
        let elapsed = Double(last - t0) / 1e9
        usleep(500_000) // the last launches end (and, on an ios host, are suspended)
        return (Double(stamps.count) / elapsed, elapsed * 1000)
    }
}

// MARK: The sections

extension SectionRunner {
    /// `--only e2e`: what a user sees, through a running host.
    func endToEnd() throws {
        report.section("e2e: through a running `bgtask host` (immediate policy, real clock, confined): control socket → scheduling → launch → handler, vs in-process launches and fork, same run")
        let n = iterations
        raiseDescriptorLimit()
        progress("e2e: fork floor (\(n.forkLatency) × fork + _exit + waitpid) and in-process launches (\(n.launchLatency) latency, \(n.launchThroughput) on 2 threads)")
        let fork = try Floors.forkLatency(n.forkLatency)
        let floor = fork.p50
        let inProcess = try LaunchBench(root: root.appendingPathComponent("e2e-inprocess"), launcher: .zygote)
        let inLatency = try inProcess.latency(n.launchLatency)
        var inCall = Samples()
        for _ in 0..<min(100, n.launchLatency) {
            let t0 = monotonicNs()
            _ = try inProcess.noop()
            inCall.append(Double(monotonicNs() - t0) / 1000)
        }
        let inSequential = try inProcess.throughput(n.launchThroughput, threads: 1)
        let inC2 = try inProcess.throughput(n.launchThroughput, threads: 2)
        inProcess.stop()

        let apps = max(8, n.e2eApps)
        // Two hosts side by side, the same apps on each: `--app-lifecycle fresh` (a new process
        // per launch) and `--app-lifecycle ios` (the default: a launch's process is suspended
        // after its work and the app's next launch resumes it). Their measurements alternate in
        // blocks, so a machine that slows down or speeds up during the run moves both alike.
        progress("e2e: starting two hosts with \(apps) apps each (--app-lifecycle fresh, --app-lifecycle ios)")
        let apnsPort = try unusedLoopbackPort()
        let e2e = try EndToEndHost(root: root.appendingPathComponent("e2e"), apps: apps,
                                   arguments: ["--apns-port", "\(apnsPort)", "--app-lifecycle", "fresh"])
        defer { e2e.stop() }
        let ios = try EndToEndHost(root: root.appendingPathComponent("e2e-ios"), apps: apps, arguments: ["--app-lifecycle", "ios"])
        defer { ios.stop() }

        // A first round over every app of both hosts, unmeasured: after it each app of the ios
        // host has a suspended process, so every measured launch there is a resume (the records
        // say so: `resumed`, counted below); the fresh host's caches and zygote are as warm.
        progress("e2e: warm-up, one launch of each of the \(apps) apps on each host")
        for host in [e2e, ios] {
            for app in host.apps {
                _ = host.fifos[app]!.take()
                let response = try host.client.send(EndToEndHost.submission(app, "bench.stamp"))
                guard response.ok else { throw BenchError("e2e warm-up submit refused: \(response.error?.message ?? "?")") }
                if host.fifos[app]!.next(timeoutMs: 5000) == nil { progress("e2e: warm-up launch of \(app) never reached its handler") }
            }
        }
        usleep(300_000) // the last warm-up launches end (and are suspended)

        // Submit → acknowledged, submit → handler entered: one submission at a time, a
        // connection per request (as `bgtask submit` makes one), each to the next of all the
        // host's apps (so each finds its app not running, on the ios host suspended), with 10 ms
        // of idle gap after each handler (what a sporadic submission finds) or back to back.
        let fresh = OneAtATime(AppRotation(e2e)), freshBackToBack = OneAtATime(fresh.rotation)
        let resumed = OneAtATime(AppRotation(ios)), resumedBackToBack = OneAtATime(resumed.rotation)
        let blocks = n.quick ? 2 : 5
        progress("e2e: \(n.e2eLatency) submissions one at a time per host and per method (10 ms idle gaps, back to back), alternated in \(blocks) blocks")
        for block in 0..<blocks {
            let count = n.e2eLatency / blocks + (block < n.e2eLatency % blocks ? 1 : 0)
            try fresh.run(count, gapUs: OneAtATime.idleGapUs)
            try resumed.run(count, gapUs: OneAtATime.idleGapUs)
            try freshBackToBack.run(count, gapUs: 0)
            try resumedBackToBack.run(count, gapUs: 0)
        }
        usleep(300_000)
        // Where the time went, from the stores beside the hosts: the launch row's start (the
        // scheduling pass chose it; realtime, taken before the launch is recorded) and the
        // record's handler time (from the supervisor's start), and whether it was a resume.
        let records = (try? e2e.records(limit: 100_000)) ?? [], rows = (try? e2e.launchRowStarts()) ?? [:]
        let iosRecords = (try? ios.records(limit: 100_000)) ?? [], iosRows = (try? ios.launchRowStarts()) ?? [:]
        let freshWhere = WhereItGoes(fresh.submitted, records: records, rows: rows)
        let freshBackToBackWhere = WhereItGoes(freshBackToBack.submitted, records: records, rows: rows)
        let resumedWhere = WhereItGoes(resumed.submitted, records: iosRecords, rows: iosRows)
        let resumedBackToBackWhere = WhereItGoes(resumedBackToBack.submitted, records: iosRecords, rows: iosRows)
        let (ack, handler, lost) = (fresh.ack, fresh.handler, fresh.lost)
        let (toRow, rowToHandler, supervisorToHandler) = (freshWhere.toRow, freshWhere.rowToHandler, freshWhere.supervisorToHandler)
        let rotation = Array(e2e.apps.prefix(8))

        // Sustained: every app's request due at once, launches/s until the last handler; the
        // two hosts' rounds alternate.
        progress("e2e: \(apps) apps submitted at once (pipelined on one connection), \(n.e2eRounds) round(s) per host, alternated, --max-launches 2")
        var rates = Samples(), drains = Samples(), iosRates = Samples(), iosDrains = Samples()
        for _ in 0..<n.e2eRounds {
            for (host, label) in [(e2e, "fresh"), (ios, "ios")] {
                let (rate, drain) = try Self.drainRound(host, label: label)
                if label == "fresh" { rates.append(rate); drains.append(drain) } else { iosRates.append(rate); iosDrains.append(drain) }
            }
        }
        let iosDrainRecords = (try? ios.records(limit: apps * n.e2eRounds)) ?? []
        let drainResumed = iosDrainRecords.filter { $0.resumed == true }.count
        // simulate-launch: the CLI's socket call to the record back.
        progress("e2e: \(n.e2eSimulate) simulate-launch round trips (wait for the record)")
        var simulate = Samples(), simulateHandler = Samples()
        for i in 0..<n.e2eSimulate {
            let app = rotation[i % rotation.count]
            let request = ControlCommand.simulateLaunch(identifier: "bench.stamp", app: app, force: true, kind: .refresh, wait: true)
            let t0 = monotonicNs()
            let response = try e2e.client.send(request)
            let t1 = monotonicNs()
            guard response.ok, let record = response.record, record.succeeded else {
                throw BenchError("simulate-launch failed: \(response.error?.message ?? response.record.map { "\($0)" } ?? "?")")
            }
            simulate.append(Double(t1 - t0) / 1000)
            if let stamp = e2e.fifos[app]!.next(timeoutMs: 1000) { simulateHandler.append(Double(stamp.monotonicNs &- t0) / 1000) }
        }

        // A background push over the control socket (`bgtask push`) → the app's launch entry.
        progress("e2e: \(n.e2ePush) background pushes (control socket) → launch entry")
        let pushes = try timePushes(n.e2ePush, to: rotation, fifos: e2e.fifos, prepare: { _ in () }) { app, _ in
            let response = try e2e.client.send(.push(app: app, PushBody(payload: #"{"aps":{"content-available":1}}"#, pushType: "background", priority: 5)))
            guard response.ok else { return (false, response.error?.message ?? "refused") }
            return (true, response.push.map { "\($0.state) \($0.detail ?? "")" } ?? "?")
        }

        // The same through the APNs-compatible endpoint, as a provider's server sends it: one
        // HTTP/2 connection kept open, a stream per push, each to an app that had none yet (so
        // iOS's delivery rules for background pushes hold none back).
        progress("e2e: \(n.e2ePush) background pushes (APNs HTTP/2 endpoint, cleartext) → launch entry")
        let provider = try APNsBenchClient(port: apnsPort)
        let unpushed = Array(e2e.apps.dropFirst(rotation.count))
        let apnsPushes = try timePushes(n.e2ePush, to: unpushed.isEmpty ? rotation : unpushed, fifos: e2e.fifos, prepare: { app in
            guard let token = try e2e.client.send(.deviceToken(app: app)).deviceToken else {
                throw BenchError("the host gave no device token for \(app)")
            }
            return token
        }) { app, token in
            let response = try provider.post(path: "/3/device/\(token)", headers: [
                ("apns-topic", app), ("apns-push-type", "background"), ("apns-priority", "5"),
            ], body: #"{"aps":{"content-available":1}}"#)
            guard response.status == 200 else { return (false, "HTTP \(response.status)") }
            return (true, "\(response.headers["bgtask-push-state"].first ?? "?") \(response.headers["bgtask-push-detail"].first ?? "")")
        }
        let (push, pushAck, pushLost, pushFirstProblem) = (pushes.handler, pushes.answer, pushes.lost, pushes.firstProblem)
        let (apnsPush, apnsAck, apnsLost, apnsFirstProblem) = (apnsPushes.handler, apnsPushes.answer, apnsPushes.lost, apnsPushes.firstProblem)

        let inRate = inC2.perSecond
        let rate = rates.p50
        report.set("e2e_fork_floor_p50_us", floor, 1)
        report.set("e2e_inprocess_launch_p50_us", inLatency.start.p50, 1)
        report.set("e2e_inprocess_launch_p99_us", inLatency.start.p99, 1)
        report.set("e2e_inprocess_run_p50_us", inCall.p50, 1)
        report.set("e2e_inprocess_throughput_per_s", inSequential.perSecond, 1)
        report.set("e2e_inprocess_throughput_c2_per_s", inC2.perSecond, 1)
        report.set("e2e_submit_ack_p50_us", ack.p50, 1)
        report.set("e2e_submit_ack_p99_us", ack.p99, 1)
        report.set("e2e_submit_handler_p50_us", handler.p50, 1)
        report.set("e2e_submit_handler_p99_us", handler.p99, 1)
        report.set("e2e_submit_handler_p50_over_floor", handler.p50 / floor, 2)
        report.set("e2e_submit_handler_samples", .int(handler.count))
        report.set("e2e_submit_handler_lost", .int(lost))
        report.set("e2e_submit_to_launch_row_p50_us", toRow.p50, 1)
        report.set("e2e_launch_row_to_handler_p50_us", rowToHandler.p50, 1)
        report.set("e2e_supervisor_to_handler_p50_us", supervisorToHandler.p50, 1)
        report.set("e2e_apps", .int(apps))
        report.set("e2e_throughput_per_s", rate, 1)
        report.set("e2e_throughput_over_inprocess", rate / inRate, 3)
        report.set("e2e_drain_ms", drains.p50, 1)
        report.set("e2e_simulate_rtt_p50_us", simulate.p50, 1)
        report.set("e2e_simulate_rtt_p99_us", simulate.p99, 1)
        report.set("e2e_simulate_handler_p50_us", simulateHandler.p50, 1)
        report.set("e2e_push_handler_p50_us", push.p50, 1)
        report.set("e2e_push_handler_p99_us", push.p99, 1)
        report.set("e2e_push_ack_p50_us", pushAck.p50, 1)
        report.set("e2e_push_samples", .int(push.count))
        report.set("e2e_apns_push_handler_p50_us", apnsPush.p50, 1)
        report.set("e2e_apns_push_handler_p99_us", apnsPush.p99, 1)
        report.set("e2e_apns_push_response_p50_us", apnsAck.p50, 1)
        report.set("e2e_apns_push_samples", .int(apnsPush.count))
        // Both lifecycles, both methods: the keys above are the fresh host's with idle gaps
        // (what they measured before the ios lifecycle); these name the host and the method.
        report.set("e2e_idle_gap_ms", Double(OneAtATime.idleGapUs) / 1000, 1)
        let variants: [(key: String, name: String, run: OneAtATime, spent: WhereItGoes, target: Double)] = [
            ("fresh_gap", "fresh process, 10 ms idle gaps", fresh, freshWhere, 2),
            ("fresh_b2b", "fresh process, back to back", freshBackToBack, freshBackToBackWhere, 2),
            ("resumed_gap", "resumed process, 10 ms idle gaps", resumed, resumedWhere, 0.5),
            ("resumed_b2b", "resumed process, back to back", resumedBackToBack, resumedBackToBackWhere, 0.5),
        ]
        for v in variants {
            report.set("e2e_\(v.key)_submit_ack_p50_us", v.run.ack.p50, 1)
            report.set("e2e_\(v.key)_submit_handler_p50_us", v.run.handler.p50, 1)
            report.set("e2e_\(v.key)_submit_handler_p99_us", v.run.handler.p99, 1)
            report.set("e2e_\(v.key)_submit_handler_p50_over_floor", v.run.handler.p50 / floor, 2)
            report.set("e2e_\(v.key)_submit_handler_samples", .int(v.run.handler.count))
            report.set("e2e_\(v.key)_submit_handler_lost", .int(v.run.lost))
            report.set("e2e_\(v.key)_submit_to_launch_row_p50_us", v.spent.toRow.p50, 1)
            report.set("e2e_\(v.key)_launch_row_to_handler_p50_us", v.spent.rowToHandler.p50, 1)
            report.set("e2e_\(v.key)_supervisor_to_handler_p50_us", v.spent.supervisorToHandler.p50, 1)
            report.set("e2e_\(v.key)_records_matched", .int(v.spent.matched))
            report.set("e2e_\(v.key)_records_resumed", .int(v.spent.resumed))
        }
        report.set("e2e_fresh_throughput_per_s", rate, 1)
        report.set("e2e_resumed_throughput_per_s", iosRates.p50, 1)
        report.set("e2e_resumed_throughput_over_inprocess", iosRates.p50 / inRate, 3)
        report.set("e2e_resumed_drain_ms", iosDrains.p50, 1)
        report.set("e2e_resumed_drain_records_resumed", .int(drainResumed))
        report.set("e2e_resumed_drain_records", .int(iosDrainRecords.count))

        report.row("fork floor p50 (this run)", us(floor), target: "floor")
        report.row("in-process launch p50 / p99 (LaunchSupervisor.run → handler)", "\(us(inLatency.start.p50)) / \(us(inLatency.start.p99))",
                   floor: "fork p50 \(us(floor))", ratio: times(inLatency.start.p50 / floor), target: "context")
        report.row("submit → acknowledged p50 / p99 (connection per request)", "\(us(ack.p50)) / \(us(ack.p99))", target: "context")
        for v in variants {
            let p50 = v.run.handler.p50
            report.row("submit → handler entered p50, \(v.name)", us(p50), floor: "fork p50 \(us(floor))", ratio: times(p50 / floor),
                       target: "≤ \(String(format: "%g", v.target))× floor", verdict: verdict(p50 <= v.target * floor, missedBy: times(p50 / floor)))
            report.row("  p99, \(v.name)", us(v.run.handler.p99), floor: "fork p50 \(us(floor))", ratio: times(v.run.handler.p99 / floor), target: "context")
            report.row("  submit → launch chosen (row's started_at) p50", us(v.spent.toRow.p50), target: "where it goes")
            report.row("  launch chosen → handler entered p50", us(v.spent.rowToHandler.p50), floor: "in-process \(us(inLatency.start.p50))",
                       ratio: times(v.spent.rowToHandler.p50 / inLatency.start.p50), target: "where it goes")
            report.row("  supervisor start → handler (record) p50", us(v.spent.supervisorToHandler.p50), floor: "in-process \(us(inLatency.start.p50))",
                       ratio: times(v.spent.supervisorToHandler.p50 / inLatency.start.p50), target: "where it goes")
            report.row("  records of these launches: resumed", "\(v.spent.resumed) of \(v.spent.matched)",
                       target: v.key.hasPrefix("resumed") ? "all" : "none",
                       verdict: verdict(v.key.hasPrefix("resumed") ? v.spent.resumed == v.spent.matched && v.spent.matched > 0 : v.spent.resumed == 0))
        }
        report.row("\(apps) apps due at once → launches/s until the last handler (--max-launches 2), fresh processes", perSecond(rate),
                   floor: "in-process, 2 threads \(perSecond(inRate))", ratio: pct(rate / inRate * 100), target: "≥ 80 %",
                   verdict: verdict(rate >= 0.8 * inRate, missedBy: pct(rate / inRate * 100)))
        report.row("\(apps) apps due at once → launches/s until the last handler (--max-launches 2), resumed processes", perSecond(iosRates.p50),
                   floor: "in-process, 2 threads \(perSecond(inRate))", ratio: pct(iosRates.p50 / inRate * 100),
                   target: "context (\(drainResumed) of \(iosDrainRecords.count) records resumed)")
        report.row("simulate-launch round trip p50 / p99 (socket call → record back)", "\(us(simulate.p50)) / \(us(simulate.p99))",
                   floor: "in-process run() \(us(inCall.p50))", ratio: times(simulate.p50 / inCall.p50), target: "context")
        report.row("background push (control socket) → launch entry p50 / p99", "\(us(push.p50)) / \(us(push.p99))",
                   floor: "fork p50 \(us(floor))", ratio: times(push.p50 / floor), target: "context")
        report.row("background push (APNs HTTP/2 endpoint) → launch entry p50 / p99", "\(us(apnsPush.p50)) / \(us(apnsPush.p99))",
                   floor: "fork p50 \(us(floor))", ratio: times(apnsPush.p50 / floor), target: "context")
        report.row("  APNs endpoint: POST → response (200, delivered) p50", us(apnsAck.p50), target: "where it goes")
        if apnsLost > 0 { report.note("e2e: \(apnsLost) of \(n.e2ePush) APNs pushes did not reach the launch entry; first: \(apnsFirstProblem ?? "?")") }
        for v in variants where v.run.lost > 0 {
            report.note("e2e: \(v.run.lost) of \(n.e2eLatency) submissions (\(v.name)) never reached their handler within 5 s")
        }
        if pushLost > 0 { report.note("e2e: \(pushLost) of \(n.e2ePush) pushes did not reach the launch entry; first: \(pushFirstProblem ?? "?")") }
        report.note("e2e: two hosts with the same \(apps) apps, `--app-lifecycle fresh` and `--app-lifecycle ios`, measured in alternated blocks after one unmeasured launch of every app on each (so the ios host resumes suspended processes); submissions one at a time rotate over all \(apps) apps; the un-suffixed e2e_submit_* keys are the fresh host's with idle gaps; simulate-launch and pushes go to the fresh host")
        report.note("e2e: pushes through the control socket (`bgtask push`, as simctl) and through the APNs-compatible endpoint (--apns-port, HTTP/2 cleartext with prior knowledge, one connection kept open, SwiftNIO's HTTP/2 client)")
    }

}

extension ProcStat {
    /// PSS of `pid` and every descendant (by /proc/PID/task/*/children), and how many.
    static func treePSS(_ pid: pid_t) -> (bytes: Double, processes: Int) {
        var total = 0.0, count = 0
        var stack = [pid]
        while let next = stack.popLast() {
            total += Double(pss(next) ?? 0)
            count += 1
            stack += children(of: next)
        }
        return (total, count)
    }

    /// Proportional set size (smaps_rollup), bytes.
    static func pss(_ pid: pid_t) -> UInt64? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/smaps_rollup", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("Pss:") {
            return line.split(separator: " ").dropFirst().first.flatMap { UInt64($0) }.map { $0 * 1024 }
        }
        return nil
    }
}

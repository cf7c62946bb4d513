import BGTaskControl
import BGTaskModel
import BGTaskStore
import Foundation
import Glibc

/// The dashboard under load (issue 32): a host with `dashboardRecords` records in its store and
/// `dashboardRunning` launches running (BenchPlugin apps sleeping in their handlers), its
/// dashboard asked for its pages one after another, timed from the request's first byte to
/// the answer's last (HTTP/1.1 over loopback, a new connection each, as a browser's first
/// load). Event latency: from a submission's answer to the `launch-began` event of its launch
/// on a page's `/events` stream, beside the floor of the same run, the launch's own handler
/// stamp (what the launch itself took to start).
extension SectionRunner {
    func dashboard() throws {
        let n = iterations
        report.section("dashboard: page and event latency with \(n.dashboardRunning) launches running and \(count(n.dashboardRecords)) records")
        raiseDescriptorLimit()
        let root = self.root.appendingPathComponent("dashboard")
        let state = root.appendingPathComponent("state")
        try FileManager.default.createDirectory(at: state, withIntermediateDirectories: true)
        let apps = (0..<n.dashboardRunning + 1).map { String(format: "com.example.e2e%04d", $0) }
        progress("dashboard: \(count(n.dashboardRecords)) records into the store")
        let seeded = try Self.seed(state: state, apps: apps, records: n.dashboardRecords)
        let e2e = try EndToEndHost(root: root, apps: apps.count, arguments: [
            "--http-port", "0", "--max-launches", "\(apps.count + 8)", "--budget", "10m", "--history-per-app", "\(n.dashboardRecords)",
        ])
        defer { e2e.stop() }
        let port = try Self.port(inLog: e2e.host.log.path)
        // Every app but the last: a launch sleeping in its handler until the run ends.
        progress("dashboard: \(n.dashboardRunning) launches sleeping in their handlers")
        for app in apps.dropLast() { _ = try e2e.client.send(EndToEndHost.submission(app, "bench.sleep")) }
        let deadline = Date().addingTimeInterval(300)
        var running = 0
        while Date() < deadline {
            running = (try e2e.client.send(.running).running ?? []).count
            if running >= n.dashboardRunning { break }
            usleep(200_000)
        }
        guard running >= n.dashboardRunning else { throw BenchError("only \(running) of \(n.dashboardRunning) launches were running after 300 s") }

        var pages: [(String, String, Samples)] = []
        for (name, path) in [("page", "/"), ("overview", "/api/overview"), ("history", "/api/history?limit=500"), ("metrics", "/metrics"), ("launch", "/api/launch/seed00000000")] {
            progress("dashboard: \(n.dashboardRequests) × GET \(path)")
            var samples = Samples()
            for _ in 0..<n.dashboardRequests {
                let start = monotonicNs()
                let (status, size) = try Self.get(port: port, path: path)
                guard status == 200, size > 16 else { throw BenchError("GET \(path): \(status), \(size) bytes (the oldest record must be found)") }
                samples.append(Double(monotonicNs() - start) / 1_000_000)
            }
            pages.append((name, path, samples))
        }

        progress("dashboard: \(n.dashboardEvents) launches watched on /events")
        let stream = try EventStream(port: port)
        defer { stream.close() }
        let last = apps.last!
        var events = Samples(), handlers = Samples()
        for _ in 0..<n.dashboardEvents {
            let submitted = monotonicNs()
            _ = try e2e.client.send(EndToEndHost.submission(last, "bench.stamp"))
            let answered = monotonicNs()
            guard stream.waitFor("launch-began", app: last, timeoutMs: 10_000) else { throw BenchError("no launch-began event within 10 s") }
            events.append(Double(monotonicNs() - answered) / 1_000_000)
            if let stamp = e2e.fifos[last]?.next(timeoutMs: 10_000) {
                handlers.append(Double(Int64(stamp.monotonicNs) - Int64(submitted)) / 1_000_000)
            }
            guard stream.waitFor("launch-ended", app: last, timeoutMs: 10_000) else { throw BenchError("no launch-ended event within 10 s") }
        }

        report.set("dashboard_running_launches", .int(running))
        report.set("dashboard_records", .int(seeded))
        for (name, path, samples) in pages {
            report.set("dashboard_\(name)_p50_ms", samples.p50, 2)
            report.set("dashboard_\(name)_p99_ms", samples.p99, 2)
            report.row("GET \(path) (\(running) running, \(count(seeded)) records)", String(format: "p50 %.1f ms, p99 %.1f ms", samples.p50, samples.p99),
                       target: "p99 ≤ 100 ms", verdict: samples.p99 <= 100 ? "yes" : "no")
        }
        report.set("dashboard_event_p50_ms", events.p50, 2)
        report.set("dashboard_event_p99_ms", events.p99, 2)
        report.set("dashboard_event_handler_floor_p50_ms", handlers.p50, 2)
        report.row("submit answered → launch-began on /events", String(format: "p50 %.1f ms, p99 %.1f ms", events.p50, events.p99),
                   floor: String(format: "submit → handler p50 %.1f ms", handlers.p50), ratio: String(format: "%.2f×", events.p50 / handlers.p50),
                   target: "p99 ≤ 100 ms", verdict: events.p99 <= 100 ? "yes" : "no")
    }

    /// `records` ended launches spread over `apps`, a day old, written through the store's own
    /// path (as the host writes them), in batches of 1,000.
    static func seed(state: URL, apps: [String], records total: Int) throws -> Int {
        let store = try PendingRequestStore(directory: state)
        let start = Date().addingTimeInterval(-86_400)
        var written = 0
        while written < total {
            let batch = (written..<min(written + 1000, total)).map { index -> RunRecord in
                let app = apps[index % apps.count]
                let terminations: [RunRecord.Termination] = [.suspended, .suspended, .suspended, .exited, .watchdog, .jetsam]
                let termination = terminations[index % terminations.count]
                return RunRecord(app: app, launchID: String(format: "seed%08d", index), reason: "scheduled",
                                 tasks: [RunRecord.TaskRecord(identifier: "bench.noop", type: .refresh, outcome: termination == .watchdog ? .unfinished : .succeeded)],
                                 termination: termination, signal: nil, exitStatus: nil, error: nil, wallMs: 40, cpuMs: 5, peakRSSBytes: 8 << 20,
                                 memoryLimitBytes: 256 << 20, memoryMechanism: "sampler", budgetMs: 30_000, graceMs: 5_000, expiredAtMs: nil, pid: 1,
                                 startedAt: start.addingTimeInterval(Double(index) * 86_400 / Double(total)), bundlePath: "/bench",
                                 log: nil, registered: ["bench.noop"], refusedRegistrations: [], submitted: [])
            }
            _ = try store.finishLaunches(batch, updatingState: { _, _ in })
            written += batch.count
        }
        return written
    }

    static func port(inLog path: String) throws -> Int {
        for _ in 0..<100 {
            let log = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            for line in log.split(separator: "\n") where line.contains("dashboard listening") {
                if let range = line.range(of: "port="), let port = Int(line[range.upperBound...].prefix { $0.isNumber }) { return port }
            }
            usleep(100_000)
        }
        throw BenchError("no 'dashboard listening' line in \(path)")
    }

    /// One GET on a new connection (`Connection: close`): the status and the body's size.
    static func get(port: Int, path: String) throws -> (Int, Int) {
        let fd = try connectLoopback(port)
        defer { Glibc.close(fd) }
        let request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n"
        _ = request.withCString { send(fd, $0, strlen($0), 0) }
        var response = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            response.append(contentsOf: buffer[0..<count])
        }
        let head = String(decoding: response.prefix(64), as: UTF8.self)
        let status = head.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? -1
        return (status, response.count)
    }
}

func connectLoopback(_ port: Int) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = UInt16(port).bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard fd >= 0, connected == 0 else {
        if fd >= 0 { Glibc.close(fd) }
        throw BenchError("cannot connect to 127.0.0.1:\(port): errno \(errno)")
    }
    return fd
}

/// A page's `/events` stream, read as it arrives: each event's name and its data's app.
final class EventStream {
    private let fd: Int32
    private var pending = ""

    init(port: Int) throws {
        fd = try connectLoopback(port)
        let request = "GET /events HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAccept: text/event-stream\r\n\r\n"
        _ = request.withCString { send(fd, $0, strlen($0), 0) }
    }

    func close() { Glibc.close(fd) }

    /// Waits for an event `name` whose data names `app` (events of other apps are passed over).
    func waitFor(_ name: String, app: String, timeoutMs: Int32) -> Bool {
        let deadline = monotonicNs() + UInt64(timeoutMs) * 1_000_000
        while true {
            // Events are separated by a blank line; the chunked framing's size lines are not
            // `event:` or `data:` lines and are passed over.
            while let end = pending.range(of: "\n\n") {
                let event = String(pending[..<end.lowerBound])
                pending.removeSubrange(..<end.upperBound)
                if event.contains("event: \(name)\n") && event.contains("\"app\":\"\(app)\"") { return true }
            }
            let now = monotonicNs()
            guard now < deadline else { return false }
            var poll = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard Glibc.poll(&poll, 1, Int32((deadline - now) / 1_000_000) + 1) == 1 else { return false }
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return false }
            pending += String(decoding: buffer[0..<count], as: UTF8.self).replacingOccurrences(of: "\r\n", with: "\n")
        }
    }
}

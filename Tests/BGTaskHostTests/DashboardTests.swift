import BGTaskControl
import BGTaskModel
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The dashboard and /metrics (issue 32), against clients nobody here wrote: headless Chromium
/// driven by selenium (Tests/Interop/dashboard_browser.py) and prometheus_client's parser, both
/// from the venv `scripts/install-test-deps.sh` makes (Chromium and its driver from Debian).
@Suite(.serialized) struct DashboardTests {
    static let app = "com.example.misbehaving"

    /// A host serving its dashboard on a free loopback port (read from its log).
    static func started(_ scratch: Scratch, _ extra: [String] = []) throws -> (HostProcess, Int) {
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual", "--http-port", "0", "--budget", "2s", "--grace", "1s",
                                                                 "--memory-limit", "64MB"] + extra)
        try host.install(TestBundle.misbehaving.library, info: TestBundle.misbehaving.info, as: TestBundle.misbehaving.name)
        try host.start()
        let port = try #require(eventually(within: 10) { Self.port(inLog: host.logPath) != nil } ? Self.port(inLog: host.logPath) : nil,
                                "no 'dashboard listening' line in \(host.logPath)")
        return (host, port)
    }

    static func port(inLog path: String) -> Int? {
        let log = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        for line in log.split(separator: "\n") where line.contains("dashboard listening") {
            guard let range = line.range(of: "port=") else { continue }
            return Int(line[range.upperBound...].prefix { $0.isNumber })
        }
        return nil
    }

    /// Three launches (one ended as asked, one killed by the watchdog, one by jetsam) and a
    /// request held until the device is on power.
    static func stage(_ host: HostProcess) throws {
        // The CLI's status says how the launch ended (non-zero for a kill): its record is what counts.
        for (behaviour, ending) in [("ok", "suspended"), ("block", "watchdog"), ("alloc", "jetsam")] {
            let launched = try host.cli(["simulate-launch", "\(app).\(behaviour)", "--force", "--type", "processing"])
            #expect(launched.stdout.contains(ending), "\(behaviour): \(launched.stdout) \(launched.stderr)")
        }
        #expect(try host.cli(["device", "--power", "off"]).status == 0)
        let submitted = try host.cli(["submit", app, "\(app).write", "--type", "processing", "--requires-power"])
        #expect(submitted.status == 0, "\(submitted.stderr)")
    }

    /// A staged host (`stage`) for a test that drives it with a client from the venv.
    static func withStagedHost(_ extra: [String] = [], _ body: (HostProcess, Int, Scratch) throws -> Void) throws {
        try ProviderLibraries.require()
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, port) = try started(scratch, extra)
        defer { host.stop() }
        try stage(host)
        try body(host, port, scratch)
    }

    @Test(.enabled(if: ProviderLibraries.runnable)) func aPersonSeesTheLaunchesTheWhyAndALiveLaunchInARealBrowser() throws {
        try Self.withStagedHost(["--http-actions"]) { host, port, scratch in
            let shots = ProcessInfo.processInfo.environment["BGTASK_DASHBOARD_SCREENSHOTS"] ?? scratch.url.appendingPathComponent("shots").path
            let browsed = try runCommand([ProviderLibraries.python, ProviderLibraries.interop.appendingPathComponent("dashboard_browser.py").path,
                                          "http://127.0.0.1:\(port)/", Products.cli, scratch.state.path, shots], timeout: .seconds(180))
            #expect(browsed.status == 0, "\(browsed.stdout)\n\(browsed.stderr.suffix(3000))")
            let seen = try #require(try? JSONSerialization.jsonObject(with: Data(browsed.stdout.split(separator: "\n").last.map(String.init)?.utf8 ?? "".utf8)) as? [String: Any],
                                    "\(browsed.stdout)")
            #expect((seen["why"] as? String)?.contains("power") == true, "\(seen)")
            #expect(seen["new"] as? Bool == true)
            // The watchdog-killed launch's memory and CPU were drawn from its samples; the page's
            // forms pushed (a mark on the timeline) and put the device on power (the why changed).
            #expect((seen["chart_points"] as? Int ?? 0) >= 2, "\(seen)")
            #expect(seen["push_mark"] as? Bool == true && seen["power_cleared"] as? Bool == true, "\(seen)")
            let pushes = try host.send(.pushes(limit: 10)).pushes ?? []
            #expect(pushes.count == 1 && pushes.first?.app == Self.app, "\(pushes.map(\.text))")
            // What the page showed is what the host recorded.
            let records = try host.send(.history(limit: 10)).records ?? []
            #expect(Set(records.map(\.termination.rawValue)).isSuperset(of: ["watchdog", "jetsam"]), "\(records.map(\.termination))")
        }
    }

    @Test(.enabled(if: ProviderLibraries.runnable)) func metricsParseWithPrometheusParserAndMatchTheRecords() throws {
        try Self.withStagedHost { host, port, _ in
            let records = try host.send(.history(limit: 100)).records ?? []
            #expect(records.count == 3)
            let parse = """
                import json, sys, urllib.request
                from prometheus_client.parser import text_string_to_metric_families
                text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
                out = {}
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        out.setdefault(sample.name, []).append({"labels": sample.labels, "value": sample.value})
                print(json.dumps(out))
                """
            let scraped = try runCommand([ProviderLibraries.python, "-c", parse, "http://127.0.0.1:\(port)/metrics"])
            #expect(scraped.status == 0, "\(scraped.stderr)")
            let samples = try #require(try JSONSerialization.jsonObject(with: Data(scraped.stdout.utf8)) as? [String: [[String: Any]]])
            // Counters by app and termination, as the records say.
            var counted: [String: Double] = [:]
            for sample in samples["bgtask_launches_total"] ?? [] {
                let labels = sample["labels"] as? [String: String] ?? [:]
                #expect(labels["app"] == Self.app)
                counted[labels["termination"] ?? "?", default: 0] += sample["value"] as? Double ?? 0
            }
            var recorded: [String: Double] = [:]
            for record in records { recorded[record.termination.rawValue, default: 0] += 1 }
            #expect(counted == recorded, "metrics \(counted), records \(recorded)")
            // The held request, the app, nothing running; a watchdog kill's lateness was observed.
            #expect((samples["bgtask_pending_requests"]?.first?["value"] as? Double) == 1)
            #expect((samples["bgtask_running_launches"]?.first?["value"] as? Double) == 0)
            #expect((samples["bgtask_watchdog_lateness_seconds_count"]?.first?["value"] as? Double) == 1, "\(samples["bgtask_watchdog_lateness_seconds_count"] ?? [])")
            #expect((samples["bgtask_handler_latency_seconds_count"]?.first?["value"] as? Double ?? 0) >= 2)
            // Every launch's begin and end, the submission, the device change: the store's writes were timed.
            #expect((samples["bgtask_store_commit_seconds_count"]?.first?["value"] as? Double ?? 0) >= 6, "\(samples["bgtask_store_commit_seconds_count"] ?? [])")
        }
    }

    /// Who may see and who may act: off loopback only with the token, a page whose Host is
    /// another site's name is refused even on loopback, actions only when enabled and only with
    /// their header, and a host asked to listen off loopback without a token does not start.
    @Test func theDashboardRefusesStrangersAndActsOnlyWhenAllowed() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let token = "dashboard-token-\(UInt64.random(in: 1...UInt64.max))"
        let tokenFile = scratch.url.appendingPathComponent("token")
        try token.write(to: tokenFile, atomically: true, encoding: .utf8)
        chmod(tokenFile.path, 0o600)
        let (host, port) = try Self.started(scratch, ["--http-address", "0.0.0.0", "--http-token-file", tokenFile.path])
        defer { host.stop() }
        func status(_ address: String, _ path: String = "/api/overview", headers: [String] = [], method: String = "GET") throws -> Int {
            let curl = try runCommand(["/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, "--max-time", "10"]
                                      + headers.flatMap { ["-H", $0] } + ["http://\(address):\(port)\(path)"])
            return Int(curl.stdout) ?? -1
        }
        #expect(try status("127.0.0.1") == 200)
        #expect(try status("127.0.0.1", headers: ["Host: attacker.example:\(port)"]) == 403, "a rebound name is not loopback")
        #expect(try status("127.0.0.1", headers: ["Host: attacker.example", "Authorization: Bearer \(token)"]) == 200)
        if let outside = Self.nonLoopbackAddress() {
            #expect(try status(outside) == 403, "\(outside) without the token")
            #expect(try status(outside, headers: ["Authorization: Bearer wrong-\(token)"]) == 403)
            #expect(try status(outside, headers: ["Authorization: Bearer \(token)"]) == 200)
            #expect(try status(outside, "/metrics", headers: ["Authorization: Bearer \(token)"]) == 200)
        }
        // Read-only: no action, header or not.
        #expect(try status("127.0.0.1", "/api/action", headers: ["X-Bgtask-Action: 1"], method: "POST") == 403)
        host.stop()

        // Off loopback without a token: refused, named.
        let refused = try runCLI(["host", "--plugins", host.plugins.path, "--state", scratch.url.appendingPathComponent("other").path,
                                  "--http-port", "0", "--http-address", "0.0.0.0"], timeout: .seconds(30))
        #expect(refused.status != 0 && refused.stderr.contains("needs a token"), "\(refused.stderr)")
        // A token file others can read is refused.
        chmod(tokenFile.path, 0o644)
        let exposed = try runCLI(["host", "--plugins", host.plugins.path, "--state", scratch.url.appendingPathComponent("other").path,
                                  "--http-port", "0", "--http-token-file", tokenFile.path], timeout: .seconds(30))
        #expect(exposed.status != 0 && exposed.stderr.contains("readable or writable by others"), "\(exposed.stderr)")
    }

    @Test func actionsNeedTheirHeaderAndTakeOnlyTheDashboardsVerbs() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, port) = try Self.started(scratch, ["--http-actions"])
        defer { host.stop() }
        func post(_ body: String, header: Bool = true) throws -> (Int, String) {
            let curl = try runCommand(["/usr/bin/curl", "-s", "-w", "\n%{http_code}", "-X", "POST", "--max-time", "10", "-H", "Content-Type: application/json"]
                                      + (header ? ["-H", "X-Bgtask-Action: 1"] : []) + ["--data", body, "http://127.0.0.1:\(port)/api/action"])
            let lines = curl.stdout.split(separator: "\n", omittingEmptySubsequences: false)
            return (Int(lines.last ?? "") ?? -1, lines.dropLast().joined(separator: "\n"))
        }
        let launch = #"{"verb": "simulate-launch", "identifier": "com.example.misbehaving.ok", "force": true, "request": {"kind": "processing", "identifier": "com.example.misbehaving.ok"}}"#
        #expect(try post(launch, header: false).0 == 403, "a page of another site cannot send the header without a preflight")
        let (status, body) = try post(launch)
        #expect(status == 200 && body.contains("launch"), "\(status) \(body)")
        #expect(try host.waitForHistory(count: 1).first?.app == Self.app)
        let (evictStatus, evictBody) = try post(#"{"verb": "evict", "app": "com.example.misbehaving"}"#)
        #expect(evictStatus == 403 && evictBody.contains("does not evict"), "\(evictStatus) \(evictBody)")
        let (garbageStatus, garbageBody) = try post("{not json")
        #expect(garbageStatus == 400 && garbageBody.contains("not a control request"), "\(garbageStatus) \(garbageBody)")
        let (unknownStatus, unknownBody) = try post(#"{"verb": "format-disk"}"#)
        #expect(unknownStatus == 400 && unknownBody.contains("unknown verb"), "\(unknownStatus) \(unknownBody)")
    }

    /// `bgtask top`: a running launch with its time against its budget and its memory
    /// against its limit, read from the host (`running`), and nothing once it has ended.
    @Test func topShowsARunningLaunchAgainstItsBudgetAndLimit() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, port) = try Self.started(scratch)
        defer { host.stop() }
        let launched = try host.cli(["simulate-launch", "\(Self.app).block", "--force", "--type", "processing", "--no-wait"])
        let id = try #require(launched.stdout.split(separator: " ").last.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }, "\(launched.stdout)")
        var shown = ""
        #expect(eventually(within: 5) {
            shown = (try? host.cli(["top", "--once"]).stdout) ?? ""
            return shown.contains(id) && shown.contains("MiB")
        }, "\(launched.stdout) \(launched.stderr) top: \(shown) history: \((try? host.send(.history(limit: 5)).records?.map(\.description)) ?? [])")
        #expect(shown.contains("1 launch(es) running") && shown.contains(Self.app) && shown.contains("/2s") && shown.contains("com.example.misbehaving.block"), "\(shown)")
        let json = try host.cli(["top", "--once", "--json"])
        let reports = try JSONDecoder.control.decode([RunningLaunchReport].self, from: Data(json.stdout.utf8))
        #expect(reports.count == 1 && reports[0].launchID == id && reports[0].budgetMs == 2000 && reports[0].memoryLimitBytes == 64 << 20
                && (reports[0].residentBytes ?? 0) > 1 << 20 && (reports[0].residentBytes ?? 0) < 64 << 20, "\(reports)")
        // The dashboard's page of the launch while it runs: what is known so far.
        let running = try Self.get(port, "/api/launch/\(id)")
        #expect(running.status == 200, "\(running)")
        let live = try #require(try JSONSerialization.jsonObject(with: Data(running.body.utf8)) as? [String: Any], "\(running.body)")
        #expect((live["running"] as? [String: Any])?["launch_id"] as? String == id && live["record"] == nil, "\(live)")
        // Killed by the watchdog at 3 s: then nothing runs.
        _ = try host.waitForHistory(count: 1)
        #expect(try host.cli(["top", "--once"]).stdout.contains("0 launch(es) running"))
        // Its record now, and its memory and CPU over its 3 s: a point a second, from the
        // supervisor's samples, kept beside its log.
        let ended = try Self.get(port, "/api/launch/\(id)")
        let page = try #require(try JSONSerialization.jsonObject(with: Data(ended.body.utf8)) as? [String: Any], "\(ended.body)")
        #expect((page["record"] as? [String: Any])?["termination"] as? String == "watchdog", "\(Array(page.keys))")
        let samples = page["samples"] as? [[String: Any]] ?? []
        #expect(samples.count >= 2 && samples.count <= 5, "\(samples)")
        let times = samples.compactMap { $0["ms"] as? Double }
        #expect(times == times.sorted() && (times.last ?? 0) < 3_500, "\(times)")
        #expect(samples.allSatisfy { ($0["resident_bytes"] as? Int ?? 0) > 1 << 20 && ($0["resident_bytes"] as? Int ?? 0) < 64 << 20 }, "\(samples)")
        #expect(samples.contains { $0["cpu_ms"] is Double }, "\(samples)")
        #expect(FileManager.default.fileExists(atPath: host.scratch.state.appendingPathComponent("logs/\(id).samples").path))
    }

    /// A GET on the dashboard: its status and body (curl, loopback).
    static func get(_ port: Int, _ path: String) throws -> (status: Int, body: String) {
        let curl = try runCommand(["/usr/bin/curl", "-s", "-w", "\n%{http_code}", "--max-time", "10", "http://127.0.0.1:\(port)\(path)"])
        let lines = curl.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        return (Int(lines.last ?? "") ?? -1, lines.dropLast().joined(separator: "\n"))
    }

    /// Hostile clients: an action body past its bound, more event streams than allowed, a
    /// launch ID that tries to name another file. Each is refused with a reason and the
    /// dashboard goes on answering.
    @Test func hostileClientsAreBoundedAndTheDashboardGoesOn() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, port) = try Self.started(scratch, ["--http-actions"])
        defer { host.stop() }
        // 1 MiB for an action whose bound is 64 KiB.
        let big = scratch.url.appendingPathComponent("big.json")
        try Data(("{\"verb\": \"push\", \"app\": \"\(Self.app)\", \"push\": {\"payload\": \"" + String(repeating: "x", count: 1 << 20) + "\"}}").utf8).write(to: big)
        let posted = try runCommand(["/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "--max-time", "20",
                                     "-H", "X-Bgtask-Action: 1", "-H", "Content-Type: application/json", "--data-binary", "@\(big.path)",
                                     "http://127.0.0.1:\(port)/api/action"])
        #expect(posted.stdout == "413", "\(posted.stdout) \(posted.stderr)")
        #expect(try host.send(.pushes(limit: 10)).pushes?.isEmpty == true)
        // A launch ID naming another file: no page, nothing read.
        for path in ["/api/launch/..%2F..%2Fetc%2Fpasswd", "/api/launch/%2E%2E", "/api/launch/a%00b"] {
            let answer = try Self.get(port, path)
            #expect(answer.status == 200 && answer.body == "null", "\(path): \(answer)")
        }
        // 64 pages watching at once; the 65th is told why, and is let in once one has gone
        // (found by the heartbeats the refusal sends).
        var streams: [Int32] = []
        defer { for fd in streams { close(fd) } }
        for index in 0..<64 {
            let fd = try Self.openEventStream(port)
            streams.append(fd)
            let head = Self.read(fd, until: "bgtask events")
            #expect(head.hasPrefix("HTTP/1.1 200"), "stream \(index): \(head)")
        }
        let refused = try Self.openEventStream(port)
        let answer = Self.read(refused, until: "watching already")
        close(refused)
        #expect(answer.hasPrefix("HTTP/1.1 503") && answer.contains("64 pages are watching already"), "\(answer)")
        #expect(try Self.get(port, "/api/overview").status == 200, "the dashboard still answers")
        close(streams.removeLast())
        var admitted = ""
        #expect(eventually(within: 10) {
            guard let fd = try? Self.openEventStream(port) else { return false }
            admitted = Self.read(fd, until: "bgtask events")
            if admitted.hasPrefix("HTTP/1.1 200") { streams.append(fd); return true }
            close(fd)
            return false
        }, "\(admitted)")
    }

    /// A connection that asked for /events (HTTP/1.1, loopback), with a 5 s receive timeout.
    static func openEventStream(_ port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HostTestError("socket: \(errno)") }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard connected == 0 else { close(fd); throw HostTestError("connect: \(errno)") }
        let request = "GET /events HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAccept: text/event-stream\r\n\r\n"
        _ = request.withCString { send(fd, $0, strlen($0), 0) }
        return fd
    }

    /// What `fd` sends until `marker` appears (or 5 s without a byte, or 64 KiB).
    static func read(_ fd: Int32, until marker: String) -> String {
        var received = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while received.count < 1 << 16 {
            let count = recv(fd, &buffer, buffer.count, 0)
            guard count > 0 else { break }
            received += buffer[0..<count]
            if String(decoding: received, as: UTF8.self).contains(marker) { break }
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// An address of this machine that is not loopback (its first up interface's IPv4), if any.
    static func nonLoopbackAddress() -> String? {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return nil }
        defer { freeifaddrs(list) }
        var entry: UnsafeMutablePointer<ifaddrs>? = first
        while let current = entry {
            defer { entry = current.pointee.ifa_next }
            guard let address = current.pointee.ifa_addr, address.pointee.sa_family == sa_family_t(AF_INET),
                  current.pointee.ifa_flags & UInt32(IFF_LOOPBACK) == 0, current.pointee.ifa_flags & UInt32(IFF_UP) != 0 else { continue }
            var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            guard getnameinfo(address, socklen_t(MemoryLayout<sockaddr_in>.size), &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 else { continue }
            return String(cString: host)
        }
        return nil
    }
}

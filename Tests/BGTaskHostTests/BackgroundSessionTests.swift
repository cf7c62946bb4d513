import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// Background URL sessions from the app's side (docs/sdk.md, "Background URL sessions"): the
/// Downloader fixture is Apple's DownloadManager pattern, unchanged.
@Suite struct BackgroundSessionTests {
    static let downloader = TestBundle(library: "Downloader", info: "Tests/Fixtures/Downloader/Info.plist", name: "Downloader.app")

    /// Writes the fixture's instructions next to its Info.plist (it reads them from `Bundle.main`).
    static func configure(_ bundle: URL, _ config: [String: Any]) throws {
        let data = try JSONSerialization.data(withJSONObject: config)
        try data.write(to: bundle.appendingPathComponent("config.json"))
    }

    /// Without a host (`bgtask run`), nothing can carry a background task: the app's delegate
    /// hears so at once, as an URLError, and the launch's log says why. It also shows the hook
    /// on URLSession's initializer saw the app's session (the attach is logged).
    @Test func withoutAHostTheDelegateIsToldAtOnce() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Downloader", info: Self.downloader.info)
        try Self.configure(bundle, ["downloads": ["http://127.0.0.1:9/never"]])
        let (record, _) = try scratch.run(bundle, ["--task", "com.example.downloader.wait:refresh"])
        #expect(record.task("com.example.downloader.wait")?.outcome == .succeeded)
        let log = try record.logText()
        #expect(log.contains("background session com.example.downloader.background: the host did not attach it"), "\(log)")
        #expect(log.contains("downloader: started file0 task 1"), "\(log)")
        #expect(log.contains("downloader: complete file0 error -1004"), "\(log)")
    }
}

/// The Downloader app (Apple's DownloadManager pattern, unchanged) under a real host and the
/// suite's loopback HTTP server: transfers the host carries for it, delivered to its delegate
/// while it runs and by relaunching it when it does not.
@Suite struct BackgroundSessionHostTests {
    static let app = "com.example.downloader"
    static let session = "com.example.downloader.background"

    /// A host with the Downloader installed, told `config`; the server started.
    static func started(_ scratch: Scratch, _ config: (TransferTestServer) -> [String: Any], throttle: Int? = nil,
                        arguments: [String] = ["--clock", "virtual"], installing others: [TestBundle] = []) throws -> (HostProcess, TransferTestServer) {
        let server = TransferTestServer()
        server.throttle = throttle
        try server.start()
        let host = try HostProcess(scratch: scratch, arguments: arguments)
        for bundle in others { try host.install(bundle.library, info: bundle.info, as: bundle.name) }
        let staged = try scratch.bundle("Downloader", info: BackgroundSessionTests.downloader.info, name: "staged-Downloader.app")
        try BackgroundSessionTests.configure(staged, config(server))
        try FileManager.default.moveItem(at: staged, to: host.plugins.appendingPathComponent("Downloader.app"))
        try host.start()
        return (host, server)
    }

    static func fnv(_ data: Data) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in data { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return String(hash, radix: 16)
    }

    static func launch(_ host: HostProcess, _ task: String) throws {
        let result = try host.cli(["simulate-launch", "\(app).\(task)", "--force", "--type", "refresh"])
        try #require(result.status == 0, "\(result.stderr)")
    }

    /// The first record (newest last) matching `predicate`, waiting for it.
    static func record(_ host: HostProcess, timeout: TimeInterval = 60, where predicate: (RunRecord) -> Bool) throws -> RunRecord {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let found = (try host.send(.history(limit: 50)).records ?? []).first(where: predicate) { return found }
            usleep(50_000)
        }
        throw HostTestError("no such record within \(Int(timeout)) s: \((try? host.send(.history(limit: 50)).records) ?? []); transfers \((try? transfers(host)) ?? []); host log \((try? String(contentsOfFile: host.logPath, encoding: .utf8))?.suffix(3000) ?? "")")
    }

    static func transfers(_ host: HostProcess) throws -> [TransferReport] {
        try host.send(.transfers(app: app)).transfers ?? []
    }

    /// While the app runs: progress, then the file (moved by the delegate before it returned),
    /// then the completion, with the server's response on the task.
    @Test func aDownloadIsDeliveredToTheRunningApp() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let size = 300_000
        let (host, server) = try Self.started(scratch, { ["downloads": [$0.url("/bytes/\(size)")]] }, throttle: 600_000)
        defer { host.stop(); server.stop() }
        try Self.launch(host, "wait")
        let record = try Self.record(host) { $0.task("\(Self.app).wait") != nil }
        #expect(record.task("\(Self.app).wait")?.outcome == .succeeded, "\(record)")
        let log = try record.logText()
        #expect(log.contains("downloader: progress file0 "), "progress reached the delegate: \(log)")
        #expect(log.contains("downloader: finished file0 status 200 bytes \(size) fnv \(Self.fnv(TransferTestServer.bytes(size)))"), "\(log)")
        #expect(log.contains("downloader: complete file0 ok status 200"), "\(log)")
        // No Content-Disposition: the URL's last path component, as Apple's URLResponse says.
        #expect(log.contains(" suggested \(size)\n") || log.hasSuffix(" suggested \(size)"), "\(log)")
        let transfer = try #require(try Self.transfers(host).first)
        #expect(transfer.state == .delivered && transfer.bytesReceived == Int64(size), "\(transfer)")
        #expect(record.transfers?.delivered.contains(transfer.id) == true, "the record names it: \(String(describing: record.transfers))")
    }

    /// The app starts a download and exits; the host carries it, then launches the app for
    /// `background-transfer`: handleEvents, the recreated session receives the file, then
    /// urlSessionDidFinishEvents, whose completion handler ends the launch.
    @Test func aDownloadOutlivesTheAppAndRelaunchesItToDeliver() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let size = 200_000
        let (host, server) = try Self.started(scratch, { ["downloads": [$0.url("/bytes/\(size)")]] }, throttle: 400_000)
        defer { host.stop(); server.stop() }
        try Self.launch(host, "start")
        let started = try Self.record(host) { $0.task("\(Self.app).start") != nil }
        #expect(started.task("\(Self.app).start")?.outcome == .succeeded)
        let relaunch = try Self.record(host) { $0.reason == "background-transfer" }
        #expect(relaunch.termination == .suspended, "\(relaunch)")
        let log = try relaunch.logText()
        let lines = log.split(separator: "\n").filter { $0.hasPrefix("downloader: ") && !$0.hasPrefix("downloader: progress") }.map(String.init)
        let expected = [
            "downloader: handleEvents \(Self.session)",
            "downloader: finished file0 status 200 bytes \(size) fnv \(Self.fnv(TransferTestServer.bytes(size)))",
            "downloader: complete file0 ok status 200",
            "downloader: didFinishEvents \(Self.session)",
        ]
        #expect(lines.map { $0.replacingOccurrences(of: #" in /.*$"#, with: "", options: .regularExpression) } == expected, "\(log)")
        let transfer = try #require(try Self.transfers(host).first)
        #expect(transfer.state == .delivered)
        #expect(relaunch.transfers?.delivered == [transfer.id], "\(String(describing: relaunch.transfers))")
    }

    /// SIGKILL the host mid-download: the restarted host resumes it with a Range request, and
    /// the relaunched app gets every byte, once.
    @Test func aHostKilledMidDownloadResumesItAndTheAppGetsEveryByte() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let size = 600_000
        let (host, server) = try Self.started(scratch, { ["downloads": [$0.url("/bytes/\(size)")]] }, throttle: 200_000)
        defer { server.stop() }
        try Self.launch(host, "start")
        _ = try Self.record(host) { $0.task("\(Self.app).start") != nil }
        let deadline = Date().addingTimeInterval(20)
        while (try? Self.transfers(host).first?.bytesReceived ?? 0) ?? 0 < 100_000 && Date() < deadline { usleep(50_000) }
        host.crash()
        let again = try HostProcess(scratch: scratch)
        try again.start()
        defer { again.stop() }
        let relaunch = try Self.record(again) { $0.reason == "background-transfer" }
        let log = try relaunch.logText()
        #expect(log.contains("downloader: finished file0 status 200 bytes \(size) fnv \(Self.fnv(TransferTestServer.bytes(size)))"), "\(log)")
        let ranges = server.requests.compactMap { $0.header("Range") }
        #expect(ranges.count == 1 && ranges[0].hasPrefix("bytes=") && ranges[0] != "bytes=0-", "resumed with a Range: \(ranges)")
        let transfer = try #require(try Self.transfers(again).first)
        #expect(transfer.resumed && transfer.state == .delivered, "\(transfer)")
        #expect(log.components(separatedBy: "downloader: finished file0").count == 2, "delivered once: \(log)")
    }

    /// An upload from a file in the container: the server's answer reaches the delegate as data.
    @Test func anUploadsAnswerReachesTheDelegate() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, server) = try Self.started(scratch, { ["upload": $0.url("/upload")] })
        defer { host.stop(); server.stop() }
        try Self.launch(host, "upload")
        let record = try Self.record(host) { $0.task("\(Self.app).upload") != nil }
        let log = try record.logText()
        #expect(log.contains(#"downloader: answer upload {"length":100000,"sha256":""#), "\(log)")
        #expect(log.contains("downloader: complete upload ok status 200"), "\(log)")
        #expect(server.requests.contains { $0.method == "PUT" && $0.uri == "/upload" })
    }

    /// A server error is a completed download with its status; cancelling one reaches the host.
    @Test func aServerErrorIsACompletedTaskAndACancelReachesTheHost() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, server) = try Self.started(scratch, { ["downloads": [$0.url("/status/500"), $0.url("/bytes/2000000")], "cancel": "file1", "cancelAfterBytes": 1] },
                                              throttle: 100_000)
        defer { host.stop(); server.stop() }
        try Self.launch(host, "cancel")
        let record = try Self.record(host) { $0.task("\(Self.app).cancel") != nil }
        let log = try record.logText()
        #expect(log.contains("downloader: finished file0 status 500 bytes 11"), "\(log)")
        #expect(log.contains("downloader: complete file0 ok status 500"), "\(log)")
        #expect(log.contains("downloader: cancelling file1"), "\(log)")
        #expect(log.contains("downloader: complete file1 error -999"), "\(log)")
        let states = Dictionary(try Self.transfers(host).map { ($0.url.hasSuffix("/status/500") ? "error" : "big", $0.state) }) { a, _ in a }
        #expect(states["error"] == .delivered, "\(states)")
        #expect(states["big"] == .cancelled || states["big"] == .delivered, "\(states)")
    }

    /// A discretionary download waits while the device is on battery (`transfers` says why),
    /// and goes when power returns.
    @Test func aDiscretionaryDownloadWaitsForPower() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (host, server) = try Self.started(scratch, { ["downloads": [$0.url("/bytes/10000")], "discretionary": true] })
        defer { host.stop(); server.stop() }
        _ = try host.cli(["device", "--power", "off"])
        try Self.launch(host, "start")
        _ = try Self.record(host) { $0.task("\(Self.app).start") != nil }
        usleep(300_000)
        let held = try #require(try Self.transfers(host).first)
        #expect(held.state == .waiting && held.heldBy?.contains("power") == true, "\(held)")
        #expect(server.requests.isEmpty, "nothing was fetched on battery")
        _ = try host.cli(["device", "--power", "on"])
        let relaunch = try Self.record(host) { $0.reason == "background-transfer" }
        #expect(try relaunch.logText().contains("downloader: finished file0 status 200 bytes 10000"))
    }

    /// The host's open descriptors (/proc/PID/fd).
    static func descriptors(_ pid: pid_t) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).count
    }

    /// What the host's descriptors are (their /proc links), for a failure's message.
    static func descriptorTargets(_ pid: pid_t) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).sorted { (Int($0) ?? 0) < (Int($1) ?? 0) }.map {
            "\($0) -> " + ((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)")) ?? "?")
        }
    }

    /// Issue 28, item 5, bounded: one app's launch starts 300 downloads (the issue's thousand
    /// took a host with the shipped unit's 1,024 descriptors to its limit). The host, held to
    /// RLIMIT_NOFILE 1,024 as that unit gives it, runs 6 of them at once and queues the rest
    /// with the reason; its descriptors stay within a few dozen of their level; another app's
    /// launch and a control request succeed in the middle of it; the flooding launch's log is
    /// whole; every download completes; and the descriptors come back to their level.
    @Test func threeHundredDownloadsFromOneAppKeepTheHostsDescriptorsBounded() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let count = 300
        let (host, server) = try Self.started(scratch, { server in ["downloads": (0..<count).map { server.url("/bytes/\(20_000 + $0)") }] },
                                              throttle: 100_000, installing: [.feed])
        defer { host.stop(); server.stop() }
        let limited = try runCommand(["/usr/bin/prlimit", "--pid", "\(host.pid)", "--nofile=1024:1024"])
        try #require(limited.status == 0, "prlimit: \(limited.stderr)")
        usleep(300_000)
        let baseline = Self.descriptors(host.pid)
        let before = Self.descriptorTargets(host.pid)
        let began = Date()
        try Self.launch(host, "start")
        var most = baseline
        var sawQueued: TransferReport?
        var otherApp: RunRecord?
        let deadline = Date().addingTimeInterval(150)
        var reports: [TransferReport] = []
        while Date() < deadline {
            most = max(most, Self.descriptors(host.pid))
            reports = try host.send(.transfers(app: Self.app, limit: 1000)).transfers ?? []
            if sawQueued == nil { sawQueued = reports.first { $0.heldBy?.hasPrefix("queued: \(Self.app) has 6 transfers running") == true } }
            if otherApp == nil, reports.count > 50, reports.contains(where: { $0.state == .waiting }) {
                // In the middle of the flood: another app launches, the control socket answers.
                let launched = try host.cli(["simulate-launch", "com.example.feed.refresh", "--force", "--type", "refresh"])
                #expect(launched.status == 0, "\(launched.stderr)")
                #expect(try host.send(.status).ok == true)
                // (The flood's own relaunches fill the history: searched whole.)
                let waitFor = Date().addingTimeInterval(60)
                while otherApp == nil, Date() < waitFor {
                    otherApp = (try host.send(.history(limit: 1000)).records ?? []).first { $0.app == "com.example.feed" }
                    if otherApp == nil { usleep(50_000) }
                }
                let why = try host.cli(["why", reports.first { $0.state == .waiting }!.id])
                #expect(why.status == 0 && why.stdout.contains("held: queued"), "\(why.stdout) \(why.stderr)")
            }
            if reports.count == count, reports.allSatisfy({ $0.state.isFinished }) { break }
            usleep(20_000)
        }
        #expect(reports.count == count && reports.allSatisfy { $0.state == .completed || $0.state == .delivered },
                "\(reports.filter { $0.state != .completed && $0.state != .delivered }.prefix(3).map(\.text))")
        #expect(sawQueued != nil, "transfers past the app's 6 waited, with the reason")
        #expect(most <= baseline + 60, "the host's descriptors stayed bounded: \(baseline) at rest, \(most) at the most")
        let other = try #require(otherApp, "another app launched during the flood")
        #expect(other.termination == .suspended && other.task("com.example.feed.refresh")?.outcome == .succeeded, "\(other)")
        let flooding = try #require((try host.send(.history(limit: 1000)).records ?? []).first { $0.task("\(Self.app).start") != nil })
        #expect(try flooding.logText().contains("downloader: started file\(count - 1) task"), "the flooding launch's log is whole")
        // Afterwards (the relaunch that delivers them has ended, pooled connections closed):
        // the descriptors are back at their level.
        let delivered = Date().addingTimeInterval(120)
        while Date() < delivered, try host.send(.transfers(app: Self.app, limit: 1000)).transfers?.allSatisfy({ $0.state == .delivered }) != true {
            usleep(100_000)
        }
        // The store's reader connections (GRDB's pool, bounded, opened as reads overlapped)
        // and the event loops' timers stay: they are the host's, not the flood's.
        func counted(_ targets: [String]) -> [String] {
            targets.filter { !$0.contains("bgtask.sqlite") && !$0.contains("timerfd") }
        }
        // Each suspended app holds its channel, its log pipe and two pidfds (the host's child's
        // and the app's): bounded by --max-suspended-apps, and not the flood's.
        let suspended = try (host.send(.apps()).apps ?? []).filter { $0.process == "suspended" }.count
        let level = counted(before).count + 4 * suspended
        var now = counted(Self.descriptorTargets(host.pid))
        let settled = Date().addingTimeInterval(40)
        while now.count > level + 2 || now.contains(where: { $0.contains("/transfers/") }), Date() < settled {
            usleep(200_000)
            now = counted(Self.descriptorTargets(host.pid))
        }
        let tcp = (try? String(contentsOfFile: "/proc/\(host.pid)/net/tcp", encoding: .utf8)) ?? ""
        // (+2: the zygote's spare launch and a control connection may be open at any time.)
        #expect(now.count <= level + 2 && !now.contains { $0.contains("/transfers/") }, "descriptors back to their level: \(level) before, \(now.count) after: \(Set(now).subtracting(before).sorted()); tcp \(tcp)")
        print("300 downloads: \(baseline) descriptors at rest, \(most) at the most, \(Self.descriptors(host.pid)) after (\(now.count) of them not the store's or timers, \(level) before); \(Int(Date().timeIntervalSince(began))) s")
    }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing
import _BGTaskSystemShims

/// A real `bgtask host` process, in its own process group, driven through its socket and the
/// CLI. `stop()` or `kill()` reaps it and its group.
final class HostProcess: @unchecked Sendable {
    let scratch: Scratch
    let plugins: URL
    private(set) var pid: pid_t = 0
    let arguments: [String]
    /// Changes to the host's environment (nil removes a variable), set before `start()`.
    var environment: [String: String?] = [:]
    /// A command the host is started through (its arguments then the host's), set before
    /// `start()`: e.g. one that confines the host first.
    var launcher: [String] = []

    init(scratch: Scratch, arguments: [String] = ["--clock", "virtual"]) throws {
        self.scratch = scratch
        plugins = scratch.url.appendingPathComponent("plugins")
        try FileManager.default.createDirectory(at: plugins, withIntermediateDirectories: true)
        self.arguments = arguments
    }

    var logPath: String { scratch.url.appendingPathComponent("host.log").path }

    /// A test that failed half-way must not leave its host running.
    deinit {
        if pid > 0 { crash() }
    }

    func start() throws {
        let log = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        defer { close(log) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, log, 1)
        posix_spawn_file_actions_adddup2(&actions, log, 2)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
        posix_spawnattr_setpgroup(&attributes, 0)
        let args = launcher + [Products.cli, "host", "--plugins", plugins.path, "--state", scratch.state.path] + arguments
        let argv = args.map { strdup($0) } + [nil]
        var variables = ProcessInfo.processInfo.environment
        // The host ends with this test process, whatever kills it.
        variables["BGTASK_EXIT_WITH_PARENT"] = String(getpid())
        for (key, value) in environment { variables[key] = value }
        let envp = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        let rc = posix_spawn(&pid, launcher.first ?? Products.cli, &actions, &attributes, argv, envp)
        guard rc == 0 else { throw POSIXError(POSIXErrorCode(rawValue: rc) ?? .EIO) }
        // Ready when the control socket answers.
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if (try? ControlClient(stateDirectory: scratch.state).send(.status))?.ok == true { return }
            if bgtask_has_exited(pid) != 0 { break }
            usleep(20_000)
        }
        let output = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        throw HostTestError("the host did not come up: \(output)")
    }

    /// SIGTERM and wait: the graceful path.
    @discardableResult
    func stop() -> Int32 {
        guard pid > 0 else { return 0 }
        kill(pid, SIGTERM)
        return reap()
    }

    /// SIGKILL: the crash path.
    func crash() {
        guard pid > 0 else { return }
        kill(pid, SIGKILL)
        reap()
    }

    @discardableResult
    private func reap() -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        kill(-pid, SIGKILL)
        pid = 0
        return status
    }

    func cli(_ arguments: [String]) throws -> CLIResult {
        try runCLI(arguments + ["--state", scratch.state.path])
    }

    func send(_ command: ControlCommand) throws -> ControlResponse {
        try ControlClient(stateDirectory: scratch.state).send(command)
    }

    /// A typed call (`ControlCall`): its answer, or the refusal thrown.
    func call<Answer>(_ call: ControlCall<Answer>) throws -> Answer {
        try ControlClient(stateDirectory: scratch.state).call(call)
    }

    /// Sends a request as it is on the wire, whatever it holds.
    func send(wire request: ControlRequest) throws -> ControlResponse {
        try ControlClient(stateDirectory: scratch.state).send(wire: [request])[0]
    }

    /// Waits (bounded) until the host's history holds `count` records.
    func waitForHistory(count: Int, timeout: TimeInterval = 30) throws -> [RunRecord] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let records = try send(.history(limit: 1000)).records ?? []
            if records.count >= count { return records }
            if Date() > deadline { throw HostTestError("history has \(records.count) record(s), expected \(count)") }
            usleep(20_000)
        }
    }

    func install(_ library: String, info: String, as name: String) throws {
        let staged = try scratch.bundle(library, info: info, name: "staged-\(name)")
        // An atomic move into the watched directory, as operators are told to do.
        try FileManager.default.moveItem(at: staged, to: plugins.appendingPathComponent(name))
    }

    /// `Broken.app`: an Info.plist with a CFBundleIdentifier that is not a reverse-DNS name.
    func installBrokenBundle() throws -> URL {
        let broken = plugins.appendingPathComponent("Broken.app")
        try FileManager.default.createDirectory(at: broken, withIntermediateDirectories: true)
        try "<plist><dict><key>CFBundleIdentifier</key><string>x</string></dict></plist>".write(
            to: broken.appendingPathComponent("Info.plist"), atomically: true, encoding: .utf8)
        return broken
    }
}

/// An example or fixture bundle a test host runs.
struct TestBundle: Sendable {
    var library: String
    var info: String
    var name: String
    static let feed = TestBundle(library: "Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")
    static let counter = TestBundle(library: "Counter", info: "Plugins/Counter/Info.plist", name: "Counter.app")
    static let misbehaving = TestBundle(library: "Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
}

extension HostProcess {
    /// A host with `bundles` moved into its plugin directory, started.
    static func started(_ scratch: Scratch, arguments: [String] = ["--clock", "virtual"], installing bundles: [TestBundle] = []) throws -> HostProcess {
        let host = try HostProcess(scratch: scratch, arguments: arguments)
        for bundle in bundles { try host.install(bundle.library, info: bundle.info, as: bundle.name) }
        try host.start()
        return host
    }
}

struct HostTestError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

@Suite struct HostTests {
    @Test func aRefreshSubmittedFromALaunchRunsAfterTheVirtualClockAdvances() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }

        let apps = try host.send(.apps()).apps ?? []
        #expect(apps.map(\.identifier) == ["com.example.feed"])

        // The first refresh, submitted from the CLI 15 minutes ahead.
        let submitted = try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--type", "refresh", "--earliest", "+15m"])
        #expect(submitted.status == 0, "\(submitted.stderr)")
        let why = try host.cli(["why", "com.example.feed.refresh", "--json"])
        let report = try JSONDecoder.control.decode(WhyReport.self, from: Data(why.stdout.utf8))
        #expect(report.state == .pending)
        #expect(report.blockers.map(\.code) == ["not-due"])
        let words = try host.cli(["why", "com.example.feed.refresh"])
        #expect(words.stdout.contains("not yet due"), "\(words.stdout)")

        _ = try host.cli(["clock", "advance", "14m"])
        usleep(200_000)
        #expect(try host.send(.history()).records?.isEmpty == true, "ran before it was due")
        _ = try host.cli(["clock", "advance", "1m"])
        let first = try host.waitForHistory(count: 1)
        #expect(first[0].reason == "scheduled")
        #expect(first[0].task("com.example.feed.refresh")?.outcome == .succeeded)

        // Inside that launch the app submitted its next refresh, 15 minutes ahead of *its* now.
        let pending = try host.send(.pending(app: "com.example.feed")).pending ?? []
        #expect(pending.map(\.request.identifier) == ["com.example.feed.refresh"])
        _ = try host.cli(["clock", "advance", "14m"])
        usleep(300_000)
        #expect(try host.send(.history()).records?.count == 1, "the app's refresh ran before its earliestBeginDate")
        _ = try host.cli(["clock", "advance", "1m"])
        let second = try host.waitForHistory(count: 2)
        #expect(second[0].task("com.example.feed.refresh")?.outcome == .succeeded)
        let log = try second[0].logText()
        #expect(log.contains("refresh #2"))

        let history = try host.cli(["history", "com.example.feed"])
        #expect(history.stdout.contains("com.example.feed.refresh [refresh] succeeded"))
    }

    @Test func conditionsHoldRequestsBackAndWhyNamesThem() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.counter, .feed])
        defer { host.stop() }

        _ = try host.cli(["device", "--power", "off", "--network", "off", "--low-power", "on"])
        let processing = try host.cli(["submit", "com.example.feed", "com.example.feed.cleanup", "--type", "processing", "--requires-power", "--requires-network"])
        #expect(processing.status == 0, "\(processing.stderr)")
        let refused = try host.cli(["submit", "com.example.counter", "com.example.counter.tick"])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("Low Power Mode") && refused.stderr.contains("[unavailable]"), "\(refused.stderr)")

        let report = try #require(try host.send(.why(identifier: "com.example.feed.cleanup")).why)
        #expect(Set(report.blockers.map(\.code)) == ["no-external-power", "no-network"])
        _ = try host.cli(["device", "--idle", "off"])
        let idle = try #require(try host.send(.why(identifier: "com.example.feed.cleanup")).why)
        #expect(idle.blockers.map(\.code).contains("device-not-idle"))

        _ = try host.cli(["device", "--power", "on", "--network", "on", "--idle", "on", "--low-power", "off"])
        let records = try host.waitForHistory(count: 1)
        #expect(records[0].task("com.example.feed.cleanup")?.outcome == .succeeded)
        #expect(records[0].task("com.example.feed.cleanup")?.type == .processing)
    }

    @Test func apiSemanticsThroughTheCLI() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let app = "com.example.misbehaving"

        // Resubmitting replaces; 1 refresh at most; not permitted; unknown app.
        #expect(try host.cli(["submit", app, "com.example.misbehaving.ok", "--earliest", "+1h"]).status == 0)
        #expect(try host.cli(["submit", app, "com.example.misbehaving.ok", "--earliest", "+2h"]).status == 0)
        let pending = try host.send(.pending(app: app)).pending ?? []
        #expect(pending.count == 1)
        let tooMany = try host.cli(["submit", app, "com.example.misbehaving.fail", "--earliest", "+1h"])
        #expect(tooMany.stderr.contains("[tooManyPendingTaskRequests]"), "\(tooMany.stderr)")
        let notPermitted = try host.cli(["submit", app, "com.example.other", "--earliest", "+1h"])
        #expect(notPermitted.stderr.contains("[notPermitted]"), "\(notPermitted.stderr)")
        let unknown = try host.cli(["submit", "com.example.nope", "com.example.nope.x"])
        #expect(unknown.stderr.contains("[not-found]"), "\(unknown.stderr)")

        // simulate-launch needs a pending request unless --force; it runs now, whatever the date.
        let refusedLaunch = try host.cli(["simulate-launch", "com.example.misbehaving.twice"])
        #expect(refusedLaunch.stderr.contains("--force"), "\(refusedLaunch.stderr)")
        let simulated = try host.cli(["simulate-launch", "com.example.misbehaving.ok", "--json"])
        #expect(simulated.status == 0, "\(simulated.stderr)")
        let record = try RunRecord.decode(Data(simulated.stdout.utf8))
        #expect(record.reason == "simulated")
        #expect(record.task("com.example.misbehaving.ok")?.outcome == .succeeded)
        #expect(try host.send(.pending(app: app)).pending?.isEmpty == true, "a simulated launch consumes the request")
        let forced = try host.cli(["simulate-launch", "com.example.misbehaving.fail", "--force", "--type", "processing", "--json"])
        #expect(try RunRecord.decode(Data(forced.stdout.utf8)).task("com.example.misbehaving.fail")?.outcome == .failed)

        // simulate-expire reaches a running task.
        let running = try host.cli(["simulate-launch", "com.example.misbehaving.never", "--force", "--type", "refresh", "--no-wait"])
        #expect(running.status == 0, "\(running.stderr)")
        var expired: CLIResult?
        for _ in 0..<100 {
            let attempt = try host.cli(["simulate-expire", "com.example.misbehaving.never"])
            if attempt.status == 0 { expired = attempt; break }
            usleep(20_000)
        }
        #expect(expired != nil)
        let records = try host.waitForHistory(count: 3)
        #expect(records[0].task("com.example.misbehaving.never")?.outcome == .expired)

        // cancel and cancel-all.
        #expect(try host.cli(["submit", app, "com.example.misbehaving.ok", "--earliest", "+1h"]).status == 0)
        #expect(try host.cli(["submit", app, "com.example.misbehaving.fail", "--type", "processing", "--earliest", "+1h"]).status == 0)
        #expect(try host.cli(["cancel", app, "com.example.misbehaving.ok"]).stdout.contains("cancelled"))
        #expect(try host.send(.pending(app: app)).pending?.map(\.request.identifier) == ["com.example.misbehaving.fail"])
        #expect(try host.cli(["cancel-all", app]).stdout.contains("cancelled 1"))
    }

    @Test func badFramesAndPeersGetErrorsAndTheHostServesOn() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch)
        defer { host.stop() }
        let path = scratch.state.appendingPathComponent("control.sock").path
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o600, "owner-only socket")

        func exchange(_ bytes: [UInt8]) throws -> String {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                raw.copyBytes(from: Array(path.utf8))
                raw[path.utf8.count] = 0
            }
            _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
            _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            shutdown(fd, Int32(SHUT_WR))
            var received = [UInt8]()
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = recv(fd, &buffer, buffer.count, 0)
                if n <= 0 { break }
                received += buffer[0..<n]
            }
            return String(decoding: received.dropFirst(ControlFrame.headerSize), as: UTF8.self)
        }
        func frame(_ payload: String, version: UInt8 = 1, length: UInt32? = nil) -> [UInt8] {
            let body = Array(payload.utf8)
            let n = length ?? UInt32(body.count)
            return [0x42, 0x47, version, 0, UInt8(n >> 24), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] + body
        }
        #expect(try exchange(Array("GET / HTTP/1.1\r\n\r\n".utf8)).contains("magic"))
        #expect(try exchange(frame("{}", version: 9)).contains("version"))
        #expect(try exchange(frame("", length: 64 << 20)).contains("over the limit"))
        #expect(try exchange(Array(frame("{\"verb\":\"apps\"}").prefix(12))).contains("ended inside a frame payload"))
        #expect(try exchange(frame("not json")).contains("bad-request"))
        #expect(try exchange(frame("{\"verb\":\"format-disk\"}")).contains("unknown verb 'format-disk'"))
        #expect(try host.send(.status).ok, "the host still serves")
    }

    @Test func pipelinedRequestsAreAnsweredInOrderAndSubmissionsShareACommit() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }
        let feed = "com.example.feed"
        func submit(_ identifier: String, _ kind: TaskKind, app: String = feed) -> ControlRequest {
            ControlCommand.submit(app: app, request: TaskRequest(kind: kind, identifier: identifier), delay: 3600).wire
        }
        // One connection, every frame written before any answer is read.
        let responses = try ControlClient(stateDirectory: scratch.state).send(wire: [
            submit("\(feed).refresh", .refresh),
            submit("\(feed).cleanup", .processing),
            submit("\(feed).not-permitted", .processing),
            ControlRequest(verb: "format-disk"),
            submit("\(feed).refresh", .refresh, app: "com.example.nobody"),
            ControlCommand.pending(app: feed).wire,
            submit("\(feed).cleanup", .processing),
        ])
        #expect(responses.count == 7)
        #expect(responses[0].ok && responses[1].ok)
        #expect(responses[2].failure?.code == .notPermitted, "\(responses[2])")
        #expect(responses[3].failure?.code == .unknownVerb)
        #expect(responses[4].failure?.code == .notFound)
        // The pending answer comes after the submissions before it, and before the one after it.
        #expect(responses[5].pending?.map(\.request.identifier) == ["\(feed).refresh", "\(feed).cleanup"])
        #expect(responses[6].ok)
        #expect(try host.send(.pending(app: feed)).pending?.map(\.request.identifier) == ["\(feed).refresh", "\(feed).cleanup"])
    }

    @Test func invalidBundlesAreReportedAndDroppedBundlesLoadWhileRunning() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        let broken = try host.installBrokenBundle()
        try host.start()
        defer { host.stop() }

        let apps = try host.cli(["apps"])
        #expect(apps.stdout.contains("invalid: \(broken.path)/Info.plist: key CFBundleIdentifier"), "\(apps.stdout)")
        try host.install("Feed", info: "Plugins/Feed/Info.plist", as: "Feed.app")
        var loaded = false
        for _ in 0..<150 where !loaded {
            loaded = (try host.send(.apps()).apps ?? []).contains { $0.identifier == "com.example.feed" }
            if !loaded { usleep(20_000) }
        }
        #expect(loaded, "a bundle moved into the plugin directory is loaded")

        #expect(try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--earliest", "+1h"]).status == 0)
        try FileManager.default.removeItem(at: host.plugins.appendingPathComponent("Feed.app"))
        var dropped = false
        for _ in 0..<150 where !dropped {
            dropped = try host.send(.pending()).pending?.isEmpty == true
            if !dropped { usleep(20_000) }
        }
        #expect(dropped, "a removed bundle's pending requests are dropped")
    }
}

@Suite struct HostLifetimeTests {
    /// `BGTASK_EXIT_WITH_PARENT=PID`: the host shuts down gracefully when that process ends (the
    /// suite's own hosts name the test process, so none outlives a crashed test run).
    @Test func aHostEndsWithTheProcessItWasToldToFollow() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        var sleeper: pid_t = 0
        let argv = [strdup("/bin/sleep"), strdup("60"), nil]
        defer { argv.forEach { free($0) } }
        #expect(posix_spawn(&sleeper, "/bin/sleep", nil, nil, argv, environ) == 0)
        var sleeperReaped = false
        defer {
            if !sleeperReaped {
                kill(sleeper, SIGKILL)
                var status: Int32 = 0
                waitpid(sleeper, &status, 0)
            }
        }
        let host = try HostProcess(scratch: scratch)
        host.environment["BGTASK_EXIT_WITH_PARENT"] = String(sleeper)
        try host.start()
        defer { host.stop() }
        usleep(200_000)
        #expect(bgtask_has_exited(host.pid) == 0, "the host runs while the process it follows does")
        kill(sleeper, SIGKILL)
        var status: Int32 = 0
        waitpid(sleeper, &status, 0)
        sleeperReaped = true
        let deadline = Date().addingTimeInterval(20)
        while bgtask_has_exited(host.pid) == 0 && Date() < deadline { usleep(20_000) }
        #expect(bgtask_has_exited(host.pid) != 0, "the host outlived the process it follows")
        let log = (try? String(contentsOfFile: host.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("(BGTASK_EXIT_WITH_PARENT) ended: shutting down"), "\(log)")
    }
}

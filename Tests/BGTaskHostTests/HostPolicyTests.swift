@testable import BGTaskHost
import BGTaskModel
import Foundation
import Testing

@Suite struct HostPolicyTests {
    /// Waits until the misbehaving app's `never` handler runs in the host's launch. Running is
    /// not enough: the handler sets its expiration handler when it runs, and an expiration
    /// before that completes the task unsuccessfully (failed, not expired), as on iOS. It
    /// prints first; the log has the line once it ran (a loaded machine may take a while from
    /// the launch's start to its handler).
    private func waitForNeverHandler(_ host: HostProcess, _ scratch: Scratch, sourceLocation: SourceLocation = #_sourceLocation) throws {
        var launchID: String?
        for _ in 0..<250 where launchID == nil {
            launchID = (try host.send(.apps()).apps ?? []).first?.running
            if launchID == nil { usleep(20_000) }
        }
        let id = try #require(launchID, sourceLocation: sourceLocation)
        let log = scratch.state.appendingPathComponent("logs/\(id).log")
        var began = false
        for _ in 0..<500 where !began {
            began = (try? String(contentsOf: log, encoding: .utf8))?.contains("never will not complete until expired") == true
            if !began { usleep(10_000) }
        }
        #expect(began, sourceLocation: sourceLocation)
    }

    @Test func aProcessingTaskIsExpiredWhenPowerGoesAway() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "60s"], installing: [.misbehaving])
        defer { host.stop() }
        _ = try host.cli(["device", "--power", "on"])
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.never", "--type", "processing", "--requires-power"]).status == 0)
        try waitForNeverHandler(host, scratch)
        _ = try host.cli(["device", "--power", "off"])
        let records = try host.waitForHistory(count: 1, timeout: 20)
        let task = try #require(records[0].task("com.example.misbehaving.never"))
        #expect(task.outcome == .expired, "\(records[0])")
        #expect(records[0].wallMs < 30_000, "expired on power loss, not at the budget")
    }

    /// The budget's expiration reaches the app at its deadline even when the host cannot send
    /// it then (stopped here; busy or swapped out in life): the runner expires its own launch at
    /// the deadline it was given, and the host's kill still comes at the grace's end. Before,
    /// the expiration waited for the host's message, so for as long as the host was stopped.
    @Test func theBudgetExpiresTheLaunchOnTimeWhileTheHostIsStopped() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "1500ms", "--grace", "5s"], installing: [.misbehaving])
        defer { host.stop() }
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.never"]).status == 0)
        try waitForNeverHandler(host, scratch)
        // Stopped (the host only: its launches are in groups of their own) from before the
        // deadline until well after it.
        #expect(kill(host.pid, SIGSTOP) == 0)
        usleep(2_600_000)
        #expect(kill(host.pid, SIGCONT) == 0)
        let records = try host.waitForHistory(count: 1, timeout: 20)
        let task = try #require(records[0].task("com.example.misbehaving.never"))
        #expect(task.outcome == .expired, "\(records[0])")
        let expired = try #require(task.expiredMs)
        #expect(expired >= 1500 && expired < 2400, "expired \(expired) ms into a launch with a 1.5 s budget, the host stopped for 2.6 s from before it")
        #expect(records[0].termination == .suspended, "\(records[0])")
    }

    @Test func realisticPolicyPenalizesBadLaunchesAndWhySaysSo() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--policy", "realistic", "--budget", "300ms", "--grace", "200ms",
                                                                "--foreground-stay", "100ms"], installing: [.misbehaving])
        defer { host.stop() }
        // The user opens the app once: an app never opened would be refreshed only every 4 hours.
        #expect(try host.cli(["open", "com.example.misbehaving", "--wait"]).status == 0)
        _ = try host.waitForHistory(count: 1)
        _ = try host.cli(["clock", "advance", "15m"])
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.spin"]).status == 0)
        let records = try host.waitForHistory(count: 2)
        #expect(records[0].termination == .watchdog)

        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.ok"]).status == 0)
        let report = try #require(try host.send(.why(identifier: "com.example.misbehaving.ok")).why)
        #expect(Set(report.blockers.filter(\.blocking).map(\.code)) == ["penalty", "rate-limit"], "\(report.text)")
        let app = try #require(try host.send(.apps()).apps?.first)
        #expect(app.penaltyLevel == 1)

        // 30 minutes later the penalty has passed, and so has the 15-minute refresh interval.
        _ = try host.cli(["clock", "advance", "29m"])
        usleep(200_000)
        #expect(try host.send(.history()).records?.count == 2)
        _ = try host.cli(["clock", "advance", "1m"])
        let after = try host.waitForHistory(count: 3)
        #expect(after[0].task("com.example.misbehaving.ok")?.outcome == .succeeded)
        #expect(try host.send(.apps()).apps?.first?.penaltyLevel == 0, "a clean launch clears the penalty")
    }

    @Test func oneHostPerStateDirectoryAndOversizedEventsFailCleanly() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }
        let second = try runCLI(["host", "--plugins", host.plugins.path, "--state", scratch.state.path], timeout: .seconds(30))
        #expect(second.status == 1)
        #expect(second.stderr.contains("another bgtask host"), "\(second.stderr)")
        #expect(try host.send(.status).ok, "the first host is untouched")

        // An event too large for a launch's start is refused before a launch is made for it.
        let event = "{\"action\": \"" + String(repeating: "x", count: 300_000) + "\"}"
        let response = try host.send(.open(app: "com.example.feed", event: event, wait: true))
        #expect(response.failure?.code == .tooLarge, "\(String(describing: response.error))")
        #expect(response.error?.message.contains("300014 bytes, over the limit of 65536") == true)
        #expect(try host.send(.history(limit: 10)).records?.isEmpty == true)
    }

    @Test func aCorruptDatabaseIsAClearErrorAtStart() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
        try Data(repeating: 0x5a, count: 8192).write(to: scratch.state.appendingPathComponent("bgtask.sqlite"))
        let result = try runCLI(["host", "--plugins", scratch.url.path, "--state", scratch.state.path], timeout: .seconds(30))
        #expect(result.status == 1)
        #expect(result.stderr.contains("\(scratch.state.path)/bgtask.sqlite"), "\(result.stderr)")
    }

    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "needs root and setpriv to act as another user"))
    func aPeerWithOtherCredentialsIsRefused() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch)
        defer { host.stop() }
        chmod(scratch.url.path, 0o755)
        chmod(scratch.state.path, 0o755)
        let socket = scratch.state.appendingPathComponent("control.sock").path
        let asNobody = ["/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", Products.cli, "apps", "--state", scratch.state.path]

        // The socket's mode keeps other users out...
        let denied = try runCommand(asNobody)
        #expect(denied.status == 69)
        #expect(denied.stderr.contains("belongs to another user"), "\(denied.stderr)")
        // ...and if it did not, the peer's credentials would.
        chmod(socket, 0o666)
        let refused = try runCommand(asNobody)
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("may not control it") && refused.stderr.contains("[permission-denied]"), "\(refused.stderr)")
        #expect(try host.send(.status).ok)
    }
}

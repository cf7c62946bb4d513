import BGTaskHost
import BGTaskControl
import BGTaskSystem
import Foundation
import Testing
import _BGTaskSystemShims

/// Unified logging (issue 15, part 4) through real launches: app code that logs with `import os`
/// (Tests/Fixtures/UnifiedLogging5 and 6: Swift 5 and 6 language modes), its entries in the
/// launch's log in the defined line format, private values redacted unless the launch is told to
/// keep them, and `bgtask log` showing, filtering and following them.
@Suite struct UnifiedLoggingLaunchTests {
    static let app = "com.example.oslog"

    /// `bgtask log ... --json`, decoded.
    static func entries(_ scratch: Scratch, _ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) throws -> [[String: String]] {
        let result = try runCLI(["log", "--json", "--state", scratch.state.path] + arguments)
        try #require(result.status == 0, "bgtask log \(arguments): \(result.status) \(result.stderr)", sourceLocation: sourceLocation)
        return try result.stdout.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: String], "\($0)", sourceLocation: sourceLocation)
        }
    }

    @Test(arguments: ["UnifiedLogging5", "UnifiedLogging6"])
    func entriesLandInTheLaunchLogRedactedAndBgtaskLogFiltersThem(library: String) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle(library, info: "Tests/Fixtures/\(library)/Info.plist", name: "Logging.app")

        // Private values redacted by default, in what is stored.
        let (first, _) = try scratch.run(bundle, ["--task", "com.example.oslog.refresh"])
        #expect(first.task("com.example.oslog.refresh")?.outcome == .succeeded)
        let stored = try first.logText()
        for secret in ["alice@example.com", "tok-7f3a9", "hunter2", "db-secret", "never written"] {
            #expect(!stored.contains(secret), "\(secret) in \(stored)")
        }
        let lines = stored.split(separator: "\n").map(String.init)
        // The line format (docs/sdk.md, "Unified logging").
        let fetched = try #require(lines.first { $0.contains("Fetched") })
        #expect(fetched.hasPrefix("[bgtask info] [os:default] 20"), "\(fetched)")
        #expect(fetched.hasSuffix("Z com.example.oslog com.example.oslog/network: Fetched 12 items for <private> from <private>"), "\(fetched)")
        #expect(lines.contains { $0.hasPrefix("[bgtask error] [os:fault] ") && $0.hasSuffix(" com.example.oslog/FeedApp: critical is a fault") })
        #expect(lines.contains { $0.hasPrefix("[bgtask debug] [os:debug] ") && $0.hasSuffix(" com.example.oslog/FeedApp: trace is debug") })
        #expect(lines.contains { $0.hasSuffix(" com.example.oslog -/-: plain os_log entry") })
        #expect(lines.contains { $0.hasSuffix(" com.example.oslog/FeedApp: two\\nlines with a \\\\ backslash") })
        #expect(lines.contains { $0.hasSuffix("com.example.oslog/network: auth token <mask.hash: '3b/tC5teV1zAvr2K/LqacA=='>") })

        // Kept with --log-private; a sensitive value stays redacted.
        let (second, _) = try scratch.run(bundle, ["--task", "com.example.oslog.refresh", "--log-private"])
        let kept = try second.logText()
        for value in ["for alice@example.com from https://feeds.example.com/u/alice", "auth token tok-7f3a9",
                      "login <private> for Account(alice@example.com)", "Code 42 failed: db-secret (99.50%)"] {
            #expect(kept.contains(value), "\(value) not in \(kept)")
        }
        #expect(!kept.contains("hunter2"))

        // bgtask log: everything, oldest first, both launches.
        let all = try Self.entries(scratch, [])
        #expect(all.count == 2 * 21, "\(all.count) entries")
        #expect(Set(all.map { $0["launch_id"] }) == [first.launchID, second.launchID])
        #expect(all.first?["launch_id"] == first.launchID && all.last?["launch_id"] == second.launchID)
        #expect(all.map { $0["time"] ?? "" } == all.map { $0["time"] ?? "" }.sorted())
        let entry = try #require(all.first { $0["message"]?.hasPrefix("Fetched") == true })
        #expect(entry["app"] == Self.app && entry["subsystem"] == Self.app && entry["category"] == "network" && entry["level"] == "default")
        #expect(entry["message"] == "Fetched 12 items for <private> from <private>")
        #expect(all.contains { $0["message"] == "two\nlines with a \\ backslash" })
        #expect(all.contains { $0["category"] == "performance" && $0["message"]?.hasPrefix("signpost fetch: interval of ") == true })
        #expect(all.contains { $0["category"] == "PointsOfInterest" && $0["message"]?.hasSuffix(" ms: done ok") == true })

        // Filters.
        let errors = try Self.entries(scratch, ["--category", "network", "--level", "error"])
        #expect(errors.count == 4 && errors.allSatisfy { $0["level"] == "error" && $0["category"] == "network" })
        let notices = try Self.entries(scratch, ["--level", "notice", "--launch", first.launchID])
        #expect(notices.count == 10 && notices.allSatisfy { ["default", "error", "fault"].contains($0["level"]) && $0["launch_id"] == first.launchID },
                "\(notices)")
        let sync = try Self.entries(scratch, ["--subsystem", Self.app, "--category", "sync", "--app", Self.app])
        #expect(sync.map { $0["message"] ?? "" } == [
            "Legacy feed fetched 7 items for <private>", "Code 42 failed: <private> (99.50%)", "interpolated os_log 12 for <private>",
            "Legacy feed fetched 7 items for alice@example.com", "Code 42 failed: db-secret (99.50%)", "interpolated os_log 12 for alice@example.com",
        ])
        #expect(try Self.entries(scratch, ["--subsystem", ""]).count == 4)
        #expect(try Self.entries(scratch, ["--app", "com.example.other"]).isEmpty)
        #expect(try Self.entries(scratch, ["--last", "1h"]).count == all.count)

        // The text form: log show's columns.
        let text = try runCLI(["log", "--state", scratch.state.path, "--launch", second.launchID, "--category", "refresh"])
        let shown = text.stdout.split(separator: "\n")
        #expect(shown.count == 2, "\(text.stdout)")
        #expect(shown.first?.hasSuffix(" info    \(Self.app) \(second.launchID) [\(Self.app):refresh] Refresh started: com.example.oslog.refresh") == true,
                "\(text.stdout)")

        // Refused: a path for a launch, --timeout without --follow, a level that is none.
        for bad in [["--launch", "../x"], ["--timeout", "1s"], ["--level", "loud"]] {
            #expect(try runCLI(["log", "--state", scratch.state.path] + bad).status == 64, "\(bad)")
        }
    }

    /// `bgtask log --follow` under a host: entries of launches that start after it, as they are
    /// written, not older ones; the host's --log-private reaches its launches.
    @Test func followShowsWhatNewLaunchesWrite() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual", "--log-private"])
        try host.install("UnifiedLogging6", info: "Tests/Fixtures/UnifiedLogging6/Info.plist", as: "Logging.app")
        try host.start()
        defer { host.stop() }

        let launch = ["simulate-launch", "com.example.oslog.refresh", "--force", "--app", Self.app, "--type", "refresh", "--json"]
        let before = try host.cli(launch)
        try #require(before.status == 0, "\(before.stdout) \(before.stderr)")
        let older = try #require(try? RunRecord.decode(Data(before.stdout.utf8)))

        let follow = try FollowingProcess(["log", "--follow", "--json", "--app", Self.app, "--category", "network",
                                           "--timeout", "2m", "--state", scratch.state.path])
        defer { follow.interrupt() }
        usleep(1_500_000)
        let after = try host.cli(launch)
        try #require(after.status == 0, "\(after.stdout) \(after.stderr)")
        let newer = try #require(try? RunRecord.decode(Data(after.stdout.utf8)))

        let output = follow.read(until: "slow response", deadline: .now() + 30)
        let status = follow.interrupt()
        #expect(status == SIGINT, "bgtask log --follow ends when interrupted")
        let lines = output.split(separator: "\n")
        #expect(!output.contains(older.launchID), "\(output)")
        #expect(lines.count >= 5 && lines.allSatisfy { $0.contains(newer.launchID) }, "\(output)")
        #expect(output.contains("Fetched 12 items for alice@example.com from https://feeds.example.com/u/alice"), "\(output)")
    }
}

/// A CLI process whose output is read while it runs (`bgtask log --follow`), interrupted and
/// reaped by `interrupt()`.
final class FollowingProcess {
    private(set) var pid: pid_t = 0
    private let output: Int32
    private var text = ""

    init(_ arguments: [String]) throws {
        var pipe: [Int32] = [-1, -1]
        guard bgtask_pipe_cloexec(&pipe) == 0 else { throw POSIXError(.EIO) }
        defer { close(pipe[1]) }
        output = pipe[0]
        _ = fcntl(output, F_SETFL, fcntl(output, F_GETFL) | O_NONBLOCK)
        pid = try Subprocess.spawn([Products.cli] + arguments, environment: ProcessInfo.processInfo.environment, stdout: pipe[1])
    }

    deinit {
        interrupt()
        close(output)
    }

    /// What it printed until `marker` appears or the deadline passes.
    func read(until marker: String, deadline: DispatchTime) -> String {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !text.contains(marker) && DispatchTime.now() < deadline {
            var descriptor = pollfd(fd: output, events: Int16(POLLIN), revents: 0)
            _ = poll(&descriptor, 1, 100)
            let n = buffer.withUnsafeMutableBytes { Glibc.read(output, $0.baseAddress, $0.count) }
            if n > 0 { text += String(decoding: buffer[0..<n], as: UTF8.self) }
            if n == 0 { break }
        }
        return text
    }

    /// SIGINT, then its exit: the signal that ended it (0 if it exited by itself).
    @discardableResult
    func interrupt() -> Int32 {
        guard pid > 0 else { return 0 }
        kill(pid, SIGINT)
        let status = Subprocess.wait(pid) ?? 0
        kill(-pid, SIGKILL)
        pid = 0
        return status & 0x7f
    }
}

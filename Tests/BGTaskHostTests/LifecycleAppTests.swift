@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// An app's lifecycle through a real host (issue 29), with an app written around the work
/// public apps do after their last task or background-time assertion has ended
/// (Tests/Fixtures/LifecycleApp): a launch's process finishes that work, is then suspended, and
/// the app's next launch resumes it; `--app-lifecycle fresh` starts a new process per launch.
///
/// Read records as raw JSON as well as `RunRecord`s: `resumed`, `suspended_ms` and the
/// `suspended` termination are the lifecycle's additions to the record.
@Suite struct LifecycleAppTests {
    static let app = "com.example.lifecycle"
    static let lifecycleApp = TestBundle(library: "LifecycleApp", info: "Tests/Fixtures/LifecycleApp/Info.plist", name: "LifecycleApp.app")
    static let subsystem = "com.example.lifecycle"
    /// Ends its background-time assertion a few milliseconds after completing its task, then logs.
    static let outbox = "com.example.lifecycle.outbox"
    /// Ends its assertion in the assertion's expiration handler, then logs.
    static let outboxExpiring = "com.example.lifecycle.outbox-expiring"
    /// Adds a local notification from a `Task` started after `setTaskCompleted`.
    static let digest = "com.example.lifecycle.digest"
    static let digestNotification = "com.example.lifecycle.digest.ready"
    /// The line the app writes right after its last `endBackgroundTask`, in the same turn.
    static let sentLine = "outbox: 3 message(s) sent, background time given back"
    static let expiredLine = "outbox: out of time, 3 message(s) left for the next launch"

    /// One launch as the CLI printed it.
    struct Launch {
        /// The record, as printed (`--json`).
        var json: [String: Any]
        /// The record decoded, nil when `RunRecord` cannot read it (a key or value it does
        /// not know yet).
        var record: RunRecord?
        /// The launch's log.
        var log: String
        /// The app's process (the host's view of it).
        var pid: pid_t
        var termination: String? { json["termination"] as? String }
        var resumed: Bool? { json["resumed"] as? Bool }
    }

    /// A host on a virtual clock with the app installed, and no desktop (the tests' session
    /// bus, if any, is not theirs to post notifications to).
    private func started(_ scratch: Scratch, _ arguments: [String] = []) throws -> HostProcess {
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual"] + arguments)
        host.environment = ["DBUS_SESSION_BUS_ADDRESS": nil]
        try host.install(Self.lifecycleApp.library, info: Self.lifecycleApp.info, as: Self.lifecycleApp.name)
        try host.start()
        return host
    }

    /// Runs `arguments` (`simulate-launch ...` or `open ...`, with `--json`) and reads the
    /// launch's record and log.
    private func launch(_ host: HostProcess, _ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) throws -> Launch {
        let result = try host.cli(arguments + ["--json"])
        let object = try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8))
        let json = try #require(object as? [String: Any], "no record (status \(result.status)): \(result.stdout) \(result.stderr)", sourceLocation: sourceLocation)
        let logPath = try #require(json["log"] as? String, "the launch wrote a log: \(json)", sourceLocation: sourceLocation)
        let pid = try #require(json["pid"] as? Int, "the record has the app's pid: \(json)", sourceLocation: sourceLocation)
        return Launch(json: json, record: try? RunRecord.decode(Data(result.stdout.utf8)),
                      log: try String(contentsOfFile: logPath, encoding: .utf8), pid: pid_t(pid))
    }

    private func simulate(_ host: HostProcess, _ identifier: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> Launch {
        try launch(host, ["simulate-launch", identifier, "--force"], sourceLocation: sourceLocation)
    }

    /// The message part of the log's lines (what follows "subsystem/category: ").
    private func messages(_ log: String, of subsystem: String) -> [String] {
        log.split(separator: "\n").compactMap { line in
            guard let range = line.range(of: " \(subsystem)/") else { return nil }
            let rest = line[range.upperBound...]
            guard let colon = rest.range(of: ": ") else { return nil }
            return String(rest[colon.upperBound...])
        }
    }

    private func count(_ needle: String, in logs: [String]) -> Int {
        logs.map { $0.components(separatedBy: needle).count - 1 }.reduce(0, +)
    }

    // MARK: Work after the last end

    /// Pattern A, in both lifecycles: the assertion, ended from a main-actor turn after the
    /// task completed, is the launch's last work, and the line the app logs right after ending
    /// it, in the same turn, is in the launch's log. The launch then ends as its lifecycle
    /// says: suspended (ios) or exited (fresh).
    @Test(arguments: ["ios", "fresh"])
    func theLineLoggedAfterTheLastEndBackgroundTaskIsKept(lifecycle: String) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch, ["--app-lifecycle", lifecycle])
        defer { host.stop() }
        let sent = try simulate(host, Self.outbox)
        let lines = messages(sent.log, of: Self.subsystem)
        #expect(lines.contains(Self.sentLine), "the line logged after the last endBackgroundTask is missing: \(lines)")
        #expect(sent.termination == (lifecycle == "ios" ? "suspended" : "exited"), "\(sent.json)")
        let record = try #require(sent.record, "\(sent.json)")
        #expect(record.tasks.map(\.outcome) == [.succeeded], "\(record)")
        let assertion = try #require(record.backgroundTime?.first, "\(record)")
        #expect(record.backgroundTime?.count == 1 && assertion.name == "outbox-send" && assertion.outcome == .ended, "\(record.backgroundTime ?? [])")
        // The assertion, not the task, was the last work: it ended after the task completed.
        let completed = try #require(record.tasks.first?.completedMs)
        #expect((assertion.endedMs ?? 0) >= completed, "ended \(assertion.endedMs ?? -1) ms, task completed \(completed) ms")
        if lifecycle == "fresh" { #expect(processGone(sent.pid), "\(processState(sent.pid))") }
    }

    /// Pattern A from an expiration handler: the launch's time runs out (a 1 s budget), the
    /// handler (on the main queue) ends the last assertion and logs in the same turn; the line
    /// is kept, the assertion ended after its expiration, and the process is suspended, not
    /// killed by the watchdog.
    @Test func theLineAnExpirationHandlerLogsAfterEndingTheLastAssertionIsKept() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch, ["--budget", "1s", "--grace", "2s"])
        defer { host.stop() }
        let expired = try simulate(host, Self.outboxExpiring)
        let lines = messages(expired.log, of: Self.subsystem)
        #expect(lines.contains(Self.expiredLine), "the line the expiration handler logged after endBackgroundTask is missing: \(lines)")
        #expect(expired.termination == "suspended", "\(expired.json)")
        let record = try #require(expired.record, "\(expired.json)")
        #expect(record.backgroundTime?.map(\.outcome) == [.endedAfterExpiration], "\(record.backgroundTime ?? [])")
        #expect(record.backgroundTime?.first?.expirationHandled == true, "\(record.backgroundTime ?? [])")
    }

    /// Pattern B: the refresh resubmits itself and completes its task; the `Task` it started
    /// after `setTaskCompleted` then asks for the settings and the pending notifications and
    /// adds its notification. The host has the notification pending and the record lists it,
    /// and the next refresh is pending too.
    @Test func theNotificationATaskAddsAfterSetTaskCompletedIsAdded() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch, ["--allow-notifications"])
        defer { host.stop() }
        let refreshed = try simulate(host, Self.digest)
        let record = try #require(refreshed.record, "\(refreshed.json)")
        #expect(record.tasks.map(\.outcome) == [.succeeded], "\(record)")
        let lines = messages(refreshed.log, of: Self.subsystem)
        // When this fails, the launch ended (and its process was suspended) while the `Task`
        // was between host answers: the record says how soon after the task completed.
        #expect(lines.contains("digest: notification added"),
                "task completed at \(record.tasks.first?.completedMs ?? -1) ms, launch ended at \(record.wallMs) ms: \(lines)")
        let pending = try host.send(.pendingNotifications(app: Self.app)).notifications ?? []
        #expect(pending.map(\.request.identifier) == [Self.digestNotification], "\(pending)")
        if let content = pending.first?.request.content {
            #expect(content.title == "Today's digest" && content.body == "4 new items are waiting for you.", "\(content)")
        }
        #expect(record.notificationsAdded == [Self.digestNotification], "\(record)")
        let requests = try host.send(.pending(app: Self.app)).pending ?? []
        #expect(requests.map(\.request.identifier) == [Self.digest], "the refresh resubmitted itself: \(requests)")
        #expect(refreshed.termination == "suspended", "\(refreshed.json)")
    }

    // MARK: The lifecycle

    /// With the default lifecycle the first launch's process is suspended after its work (not
    /// exited, stopped or frozen), and the second launch resumes it: the same pid, the refresh
    /// counter it keeps in memory at 2, `didFinishLaunching` run once over both launches, and
    /// the record saying it was resumed and how long it had been suspended. A host that stops
    /// ends its suspended app.
    @Test func aSecondLaunchResumesTheSuspendedProcessWithItsMemory() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }
        let first = try simulate(host, Self.outbox)
        #expect(first.termination == "suspended", "\(first.json)")
        #expect(first.resumed == false, "\(first.json)")
        #expect(first.log.contains("refresh run 1 (\(Self.outbox))"), "\(first.log)")
        #expect(processIsSuspended(first.pid), "pid \(first.pid) after its launch: \(processState(first.pid))")

        let second = try simulate(host, Self.outbox)
        #expect(second.resumed == true, "\(second.json)")
        #expect(second.pid == first.pid, "first \(first.pid), second \(second.pid)")
        let suspendedMs = second.json["suspended_ms"] as? Double
        #expect(suspendedMs.map { $0 >= 0 } == true, "\(second.json)")
        #expect(second.log.contains("refresh run 2 (\(Self.outbox))"), "\(second.log)")
        #expect(messages(second.log, of: Self.subsystem).contains(Self.sentLine), "the resumed launch's work after its last end: \(second.log)")
        #expect(count("didFinishLaunching ", in: [first.log, second.log]) == 1, "\(first.log)\n\(second.log)")
        #expect(second.record?.tasks.map(\.outcome) == [.succeeded], "\(second.json)")

        host.stop()
        #expect(processGone(first.pid), "the suspended app outlived its host: \(processState(first.pid))")
    }

    /// `--app-lifecycle fresh`: every launch is a new process, which exits after its work.
    @Test func theFreshLifecycleStartsANewProcessPerLaunch() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch, ["--app-lifecycle", "fresh"])
        defer { host.stop() }
        let first = try simulate(host, Self.outbox)
        #expect(first.termination == "exited", "\(first.json)")
        #expect(processGone(first.pid), "\(processState(first.pid))")
        let second = try simulate(host, Self.outbox)
        #expect(second.termination == "exited", "\(second.json)")
        #expect(second.pid != first.pid)
        #expect(second.resumed != true, "\(second.json)")
        #expect(second.log.contains("refresh run 1 (\(Self.outbox))"), "\(second.log)")
        #expect(!second.log.contains("refresh run 2"), "\(second.log)")
        #expect(count("didFinishLaunching ", in: [first.log, second.log]) == 2, "\(first.log)\n\(second.log)")
    }

    // MARK: Process state

    /// /proc/PID/stat's state and the process's cgroup's `frozen`, for messages.
    private func processState(_ pid: pid_t) -> String {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return "no process \(pid)" }
        return "stat: \(stat.prefix(80)), frozen: \(cgroupFrozen(pid).map(String.init) ?? "n/a")"
    }

    /// Suspended as issue 29 says: stopped (state T), or frozen by its cgroup's freezer.
    private func processIsSuspended(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.range(of: ") ", options: .backwards) else { return false }
        if stat[close.upperBound...].first == "T" { return true }
        return cgroupFrozen(pid) == true
    }

    /// Whether the process's (v2) cgroup reports `frozen 1`; nil when it cannot be read.
    private func cgroupFrozen(_ pid: pid_t) -> Bool? {
        guard let cgroup = try? String(contentsOfFile: "/proc/\(pid)/cgroup", encoding: .utf8),
              let line = cgroup.split(separator: "\n").first(where: { $0.hasPrefix("0::") }),
              let events = try? String(contentsOfFile: "/sys/fs/cgroup\(line.dropFirst(3))/cgroup.events", encoding: .utf8)
        else { return nil }
        return events.split(separator: "\n").contains("frozen 1")
    }

    /// Waits (at most 5 s) for the process to be gone; kills it if it is not (a test reaps what
    /// it made), and says whether it went by itself.
    private func processGone(_ pid: pid_t) -> Bool {
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            if kill(pid, 0) == -1 && errno == ESRCH { return true }
            if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
               let close = stat.range(of: ") ", options: .backwards), stat[close.upperBound...].first == "Z" {
                return true // ended, waiting for its parent
            }
            usleep(20_000)
        }
        // Only the app's own runner: a pid is never killed on the chance that it is ours.
        if let comm = try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8), comm.hasPrefix("bgtask") {
            kill(pid, SIGKILL)
        }
        return false
    }
}

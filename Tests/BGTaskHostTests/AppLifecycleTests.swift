@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskModel
import BGTaskSystem
import BGTaskWire
import Foundation
import _BGTaskSystemShims
import Testing

/// The app lifecycle as iOS has it (docs/design.md, "The app lifecycle"): a launch's process is
/// suspended when its work is over and resumed by the app's next launch; suspended apps are
/// evicted least recently used first (then largest) over the host's budget, and when they die;
/// crashes and kills start the next launch fresh; `--app-lifecycle fresh` keeps none.
@Suite struct AppLifecycleTests {
    static let misbehaving = "com.example.misbehaving"

    func launch(_ host: HostProcess, _ identifier: String, type: String = "refresh") throws -> RunRecord {
        let result = try host.cli(["simulate-launch", identifier, "--force", "--type", type, "--json"])
        return try RunRecord.decode(Data(result.stdout.utf8))
    }

    func apps(_ host: HostProcess) throws -> [String: AppSummary] {
        Dictionary(uniqueKeysWithValues: (try host.send(.apps()).apps ?? []).map { ($0.identifier, $0) })
    }

    /// The state letter of `pid` in /proc (T: stopped), nil once it is gone.
    func processState(_ pid: pid_t) -> Character? {
        ProcessTree.status(of: pid).map { Character(UnicodeScalar($0.state)) }
    }

    @Test func aSecondLaunchResumesTheSuspendedProcess() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        #expect(first.termination == .suspended, "\(first)")
        #expect(first.resumed == false && first.processLaunches == 1 && first.suspendedMs == nil)
        // Suspended: its process (the host's child, and the app below a namespace's init) stopped.
        let app = ProcessTree.appProcess(of: first.pid) ?? first.pid
        #expect(processState(first.pid) == "T" && processState(app) == "T", "\(processState(first.pid) ?? "?") \(processState(app) ?? "?")")
        let listed = try #require(try apps(host)[Self.misbehaving])
        #expect(listed.process == "suspended" && listed.processID == first.pid && listed.processLaunches == 1, "\(listed)")

        usleep(100_000)
        let second = try launch(host, "\(Self.misbehaving).ok")
        #expect(second.termination == .suspended && second.pid == first.pid, "\(second)")
        #expect(second.resumed == true && second.processLaunches == 2)
        #expect((second.suspendedMs ?? 0) >= 100, "suspended for \(second.suspendedMs ?? -1) ms")
        #expect(second.task("\(Self.misbehaving).ok")?.outcome == .succeeded)
        // Its confinement is the process's, carried over.
        #expect(second.sandbox == first.sandbox && second.launcher == first.launcher)

        // The host stops: its suspended apps end with it.
        host.stop()
        #expect(eventually { processState(first.pid) == nil }, "the suspended app outlived its host")
    }

    @Test func theFreshLifecycleKeepsNoProcess() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--app-lifecycle", "fresh"], installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        let second = try launch(host, "\(Self.misbehaving).ok")
        #expect(first.termination == .exited && second.termination == .exited, "\(first) \(second)")
        #expect(first.pid != second.pid && first.resumed == nil && second.resumed == nil)
        #expect(try apps(host)[Self.misbehaving]?.process == nil)
    }

    /// Over `--max-suspended-apps`, the least recently used goes; its next launch is fresh and
    /// says why its previous process ended.
    @Test func theLeastRecentlyUsedIsEvictedAndItsNextLaunchSaysWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--max-suspended-apps", "1"], installing: [.misbehaving, .counter])
        defer { host.stop() }
        let old = try launch(host, "\(Self.misbehaving).ok")
        #expect(old.termination == .suspended)
        let recent = try launch(host, "com.example.counter.tick")
        #expect(recent.termination == .suspended)
        #expect(eventually { processState(old.pid) == nil }, "the least recently used was evicted")
        let listed = try apps(host)
        #expect(listed[Self.misbehaving]?.process == "not-running", "\(String(describing: listed[Self.misbehaving]))")
        #expect(listed[Self.misbehaving]?.lastEviction?.contains("--max-suspended-apps") == true)
        #expect(listed["com.example.counter"]?.process == "suspended")

        let again = try launch(host, "\(Self.misbehaving).ok")
        #expect(again.resumed == false && again.pid != old.pid, "\(again)")
        #expect(again.previousProcess?.hasPrefix("jetsam: more than 1 apps were suspended") == true, "\(again.previousProcess ?? "nil")")
        // Now the counter is the least recently used.
        #expect(eventually { processState(recent.pid) == nil })
    }

    /// Over `--suspended-memory`, even the app just suspended goes when it alone is over: the
    /// budget holds its private memory, measured at suspension.
    @Test func anAppOverTheSuspendedMemoryBudgetIsEvicted() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--suspended-memory", "4KiB"], installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        #expect(first.termination == .suspended)
        #expect(eventually { processState(first.pid) == nil })
        let listed = try #require(try apps(host)[Self.misbehaving])
        #expect(listed.process == "not-running" && listed.lastEviction?.contains("over the budget of") == true, "\(listed)")
        let next = try launch(host, "\(Self.misbehaving).ok")
        #expect(next.resumed == false && next.previousProcess?.contains("--suspended-memory") == true, "\(next)")
        // MetricKit counts each eviction as a memory-pressure exit of the day (two: the second
        // launch's process was evicted too); a launch that ended suspended is no exit.
        #expect(eventually {
            let day = (try? host.call(.metrics(app: Self.misbehaving)))?.first?.day
            return day?.exits.memoryPressure == 2 && day?.exits.normal == 0 && day?.launches == 2
        }, "\(String(describing: try? host.call(.metrics(app: Self.misbehaving)).first?.day.exits))")
        let exitData = MetricPayloadJSON.backgroundExitData((try host.call(.metrics(app: Self.misbehaving))).first!.day.exits)
        #expect(exitData["cumulativeMemoryPressureExitCount"] == 2)
    }

    /// A launch whose work is over holds no launch slot while it settles: with one slot, the
    /// next app's launch starts while the first app, its task done, still computes (and its
    /// process lingers) before it is suspended.
    @Test func aSettlingLaunchHoldsNoLaunchSlot() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--max-launches", "1"], installing: [.misbehaving, .counter])
        defer { host.stop() }
        #expect(try host.cli(["submit", Self.misbehaving, "\(Self.misbehaving).linger"]).status == 0)
        usleep(150_000)
        #expect(try host.cli(["submit", "com.example.counter", "com.example.counter.tick"]).status == 0)
        // A record is written when its launch has ended: the counter's, which started while
        // the lingering launch settled, ends first. (Held slot: it could not even start.)
        var records: [RunRecord] = []
        for _ in 0..<250 where records.isEmpty {
            records = try host.send(.history(limit: 10)).records ?? []
            if records.isEmpty { usleep(10_000) }
        }
        #expect(records.first?.app == "com.example.counter", "first to end: \(records.map { "\($0.app) \($0.wallMs) ms" })")
        for _ in 0..<250 where records.count < 2 {
            records = try host.send(.history(limit: 10)).records ?? []
            usleep(20_000)
        }
        let linger = try #require(records.first { $0.app == Self.misbehaving }, "\(records)")
        #expect(linger.termination == .suspended && linger.wallMs >= 500, "it lingered computing: \(linger.wallMs) ms")
    }

    /// `bgtask evict` ends a suspended app at the moment a test or an operator chooses.
    @Test func evictEndsASuspendedAppAtAChosenMoment() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        let evicted = try host.cli(["evict", Self.misbehaving])
        #expect(evicted.status == 0 && evicted.stdout.contains("its suspended process was ended"), "\(evicted.stdout) \(evicted.stderr)")
        #expect(processState(first.pid) == nil)
        #expect(try host.cli(["evict", Self.misbehaving]).stdout.contains("had no suspended process"))
        let next = try launch(host, "\(Self.misbehaving).ok")
        #expect(next.resumed == false && next.previousProcess?.hasPrefix("evicted by the operator") == true, "\(next)")
    }

    @Test func aSuspendedAppThatDiesIsRecordedAndItsNextLaunchIsFresh() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        try #require(first.termination == .suspended)
        // Killed from outside while stopped (an operator, the kernel's OOM killer).
        kill(ProcessTree.appProcess(of: first.pid) ?? first.pid, SIGKILL)
        #expect(eventually { (try? apps(host)[Self.misbehaving]?.process) == "not-running" })
        let next = try launch(host, "\(Self.misbehaving).ok")
        #expect(next.resumed == false && next.pid != first.pid && next.termination == .suspended, "\(next)")
        #expect(next.previousProcess?.contains("died while it was suspended") == true, "\(next.previousProcess ?? "nil")")
    }

    /// A crash or a kill in a resumed launch is recorded as in any launch, and the app's next
    /// launch starts a new process.
    @Test(arguments: [("segfault", RunRecord.Termination.crashed), ("spin", .watchdog)])
    func aResumedAppThatCrashesOrOverrunsStartsFreshNextTime(task: String, termination: RunRecord.Termination) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "1s", "--grace", "500ms"], installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        let broken = try launch(host, "\(Self.misbehaving).\(task)")
        #expect(broken.resumed == true && broken.pid == first.pid, "\(broken)")
        #expect(broken.termination == termination, "\(broken)")
        #expect(processState(first.pid) == nil, "the process is gone")
        let next = try launch(host, "\(Self.misbehaving).ok")
        #expect(next.resumed == false && next.pid != first.pid && next.previousProcess == nil, "\(next)")
        #expect(next.task("\(Self.misbehaving).ok")?.outcome == .succeeded)
    }

    /// Hostile: an app that says its launch is over while its task is still open is not taken at
    /// its word: the message is refused, the launch runs to its watchdog, nothing is suspended.
    @Test func aForgedIdleWithATaskOpenIsRefused() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual", "--budget", "1s", "--grace", "500ms"])
        try host.install("Hostile", info: "Tests/Fixtures/Hostile/Info.plist", as: "Hostile.app")
        try host.start()
        defer { host.stop() }
        let record = try launch(host, "com.example.hostile.forgeidle", type: "processing")
        #expect(record.termination == .watchdog, "\(record)")
        #expect(record.messagesRefused?["idle"] == 1, "\(String(describing: record.messagesRefused))")
        // Expired without an expiration handler: completed unsuccessfully by the system.
        #expect(record.task("com.example.hostile.forgeidle")?.outcome == .failed)
        #expect(processState(record.pid) == nil)
        #expect(try apps(host)["com.example.hostile"]?.process == "not-running")
    }

    /// A host that dies does not leave its suspended apps stopped for good. Each launch's process
    /// group is orphaned with stopped members, so the kernel continues it (SIGHUP, SIGCONT) and
    /// the runner, finding its channel closed, ends itself; where the group is not orphaned
    /// (the host's parent is a subreaper in its session, as this test process may be), the next
    /// host on the state directory ends it. The app's next launch, under that host, is fresh.
    @Test func aCrashedHostsSuspendedAppsEndThemselves() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let first = try launch(host, "\(Self.misbehaving).ok")
        try #require(first.termination == .suspended)
        let app = ProcessTree.appProcess(of: first.pid) ?? first.pid
        // This test process is a child subreaper in the host's session: the crashed host's
        // orphans come to it, and their groups are not orphaned (a parent in the same session),
        // so nothing continues them: the next host must end them.
        _ = bgtask_set_child_subreaper()
        host.crash()
        usleep(300_000)
        let leftStopped = processState(app) == "T"
        #expect(leftStopped, "\(processState(app) ?? "?")")
        try host.start()
        // Gone, or a zombie of this test process (a child subreaper, which its orphans reach).
        #expect(eventually { processState(app) == nil || processState(app) == "Z" }, "\(processState(app) ?? "?")")
        if leftStopped {
            let log = (try? String(contentsOfFile: host.logPath, encoding: .utf8)) ?? ""
            #expect(log.contains("ended an app's process a stopped host had left suspended"), "\(log.suffix(2000))")
        }
        var status: Int32 = 0
        for pid in [first.pid, app] { _ = waitpid(pid, &status, WNOHANG) }
        let next = try launch(host, "\(Self.misbehaving).ok")
        #expect(next.resumed == false && next.pid != first.pid && next.termination == .suspended, "\(next)")
    }

    /// A suspension counts the app by its resident memory (a bound: no page-table walk on the
    /// launch's path); its private memory is read once the bound is over the budget, and the
    /// budget then holds to what was read: nothing is evicted for the bound alone.
    @Test func aSuspendedAppsPrivateMemoryIsReadOnlyWhenItMatters() throws {
        let apps = SuspendedApps(budgetBytes: 256 << 20, maximumCount: .max, logger: .init(label: "test"))
        let sleeper = try Subprocess.spawn(["/bin/sleep", "30"], environment: [:])
        kill(sleeper, SIGSTOP)
        let key = SuspendedApp.Key(bundlePath: "/a/A.app", executable: [], appGroups: [], confine: false, uid: nil)
        func suspended(_ app: String, bound: UInt64) -> SuspendedApp {
            SuspendedApp(app: app, pid: sleeper, appPID: sleeper, channel: LaunchChannel(fd: -1), logReadEnd: -1, cgroup: nil, sandbox: nil,
                         launcher: "zygote", key: key, launches: 1, suspendedAtNs: bgtask_monotonic_ns(), suspendedAt: Date(),
                         residentBytes: bound, residentMeasured: false, lastLaunchID: "l", cpuNs: 0, hearsResumes: true)
        }
        // Under the budget on its bound: not read.
        apps.insertForTesting(suspended("small", bound: 100 << 20))
        apps.enforceBudget()
        #expect(apps.countedBytes == 100 << 20)
        // Suspended again with a bound over the budget: read, and it fits.
        apps.insertForTesting(suspended("small", bound: 1 << 30))
        apps.enforceBudget()
        let counted = apps.countedBytes
        #expect(counted > 0 && counted < 32 << 20, "\(counted)")
        #expect(apps.suspendedCount == 1 && apps.states().first { $0.app == "small" }?.residentBytes == counted)
        // Evicted (the test's end): killed and reaped; what it gave back is what was read.
        #expect(apps.evict("small", reason: "the test is over"))
        #expect(apps.states().first { $0.app == "small" }?.lastEviction?.residentBytes == counted)
        #expect(kill(sleeper, 0) != 0)
    }

    /// iOS's order: the least recently used band first, the largest first within a band.
    @Test func evictionOrderIsLeastRecentlyUsedThenLargest() throws {
        let apps = SuspendedApps(budgetBytes: .max, maximumCount: .max, logger: .init(label: "test"))
        let band = SuspendedApps.bandSeconds * 1_000_000_000
        let key = SuspendedApp.Key(bundlePath: "/a/A.app", executable: [], appGroups: [], confine: false, uid: nil)
        func suspended(_ app: String, at: UInt64, bytes: UInt64) -> SuspendedApp {
            SuspendedApp(app: app, pid: 0, appPID: 0, channel: LaunchChannel(fd: -1), logReadEnd: -1, cgroup: nil, sandbox: nil,
                         launcher: "zygote", key: key, launches: 1, suspendedAtNs: at, suspendedAt: Date(), residentBytes: bytes,
                         lastLaunchID: "l", cpuNs: 0, hearsResumes: true)
        }
        let base = 100 * band
        for process in [suspended("recent-small", at: base + 5 * band, bytes: 1),
                        suspended("old-small", at: base + 1, bytes: 10),
                        suspended("old-large", at: base + 2, bytes: 1000),
                        suspended("middle", at: base + 2 * band, bytes: 5)] {
            apps.insertForTesting(process)
        }
        #expect(apps.evictionOrder() == ["old-large", "old-small", "middle", "recent-small"])
    }
}

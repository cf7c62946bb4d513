@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskModel
import BGTaskSystem
import Foundation
import Logging
import _BGTaskSystemShims
import Testing

/// Supervision as event loops (docs/design.md, "Supervision"): every running launch is a source
/// of one of a few `SupervisionLoop`s (epoll over pidfds, channels, log pipes and wake pipes, one
/// timerfd for all deadlines), with the blocking steps on a few worker threads.
@Suite struct SupervisionLoopTests {
    /// A source with a deadline and, optionally, a descriptor; records when it fired and why.
    final class Probe: SupervisionLoop.Source, @unchecked Sendable {
        let lock = NSLock()
        var deadline: UInt64
        /// The deadline it was added with.
        let due: UInt64
        var fd: Int32 = -1
        var fired: [(at: UInt64, ready: UInt32)] = []
        var done = false
        var retired = 0
        /// Fire once at the deadline, then stop.
        var once = true

        init(deadline: UInt64) {
            self.deadline = deadline
            due = deadline
        }

        var descriptors: [(fd: Int32, events: UInt32)] { lock.withLock { done ? [] : [(fd, BGTASK_EPOLL_IN)] } }

        func fire(ready: UInt32, now: UInt64) -> Bool {
            lock.withLock {
                if ready != 0 || now >= deadline { fired.append((now, ready)) }
                if ready != 0, fd >= 0 {
                    var byte: UInt8 = 0
                    _ = read(fd, &byte, 1)
                }
                if once && now >= deadline { done = true }
                if now >= deadline { deadline = .max }
                return !done
            }
        }

        func retire() { lock.withLock { retired += 1 } }
        var snapshot: (fired: [(at: UInt64, ready: UInt32)], retired: Int) { lock.withLock { (fired, retired) } }
    }

    /// Hundreds of deadlines on one loop, added in random order: each fires once, never before
    /// it is due, and the loop then forgets the source (retired once).
    /// Runs the Misbehaving fixture's `name` behaviour as a refresh launch with short limits
    /// (a 300 ms budget, a 400 ms grace, 96 MiB), through `supervisor`.
    static func launch(_ name: String, of bundle: PluginBundle, by supervisor: LaunchSupervisor, scratch: Scratch) throws -> RunRecord {
        let id = LaunchPlan.newLaunchID()
        var limits = LaunchLimits.defaults(for: [.refresh])
        limits.budget = .milliseconds(300)
        limits.grace = .milliseconds(400)
        limits.memoryLimitBytes = 96 << 20
        let plan = LaunchPlan(
            bundle: bundle, tasks: [TaskAssignment(task: 1, identifier: "com.example.misbehaving.\(name)", kind: .refresh)],
            reason: "simulated", limits: limits, launchID: id,
            dataDirectory: scratch.state.appendingPathComponent("containers/\(bundle.identifier)"),
            logFile: scratch.state.appendingPathComponent("logs/\(id).log"))
        return try supervisor.run(plan, broker: InMemoryRequestBroker())
    }

    @Test func deadlinesFireWhenDueAndOnlyOnce() throws {
        let loop = try #require(SupervisionLoop(name: "test.loop"))
        let start = bgtask_monotonic_ns() + 20_000_000
        var probes = (0..<300).map { Probe(deadline: start + UInt64($0) * 300_000) }
        probes.shuffle()
        for probe in probes { loop.add(probe) }
        #expect(eventually { probes.allSatisfy { $0.snapshot.retired == 1 } }, "not every source fired and retired")
        for probe in probes {
            let (fired, retired) = probe.snapshot
            #expect(fired.count == 1 && retired == 1)
            // Never before its deadline.
            #expect(fired.allSatisfy { $0.at >= probe.due }, "fired \(fired.map(\.at)) before \(probe.due)")
        }
        #expect(eventually { loop.count == 0 })
    }

    /// A descriptor wakes its source with its slot's bit; once the source is done, a descriptor
    /// of the same number registered by another source wakes only that one.
    @Test func aReadyDescriptorWakesItsSourceAndARetiredOneIsOutOfTheSet() throws {
        let loop = try #require(SupervisionLoop(name: "test.loop"))
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        let first = Probe(deadline: .max)
        first.once = false
        first.fd = fds[0]
        loop.add(first)
        var byte: UInt8 = 1
        #expect(write(fds[1], &byte, 1) == 1)
        #expect(eventually { first.snapshot.fired.contains { $0.ready & 1 != 0 } })
        // Done at its next turn (a deadline now), out of the set, its pipe closed.
        first.lock.withLock {
            first.deadline = bgtask_monotonic_ns()
            first.once = true
        }
        #expect(write(fds[1], &byte, 1) == 1)
        #expect(eventually { first.snapshot.retired == 1 })
        close(fds[0])
        close(fds[1])
        let firedBefore = first.snapshot.fired.count

        var again: [Int32] = [-1, -1]
        #expect(pipe(&again) == 0)
        defer { again.forEach { close($0) } }
        let second = Probe(deadline: .max)
        second.once = false
        second.fd = again[0]
        loop.add(second)
        #expect(write(again[1], &byte, 1) == 1)
        #expect(eventually { !second.snapshot.fired.isEmpty })
        usleep(20_000)
        #expect(first.snapshot.fired.count == firedBefore, "a retired source was fired again")
    }

    /// An app that stops reading its channel and floods it with calls whose answers it never
    /// reads: the loop never blocks on it (its answers wait in the launch's outbox, its calls
    /// are read no faster than they are answered), its watchdog still ends it on time, and
    /// another app's launch runs meanwhile.
    @Test func anAppThatStopsReadingItsChannelIsStillEndedOnTime() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch, arguments: ["--budget", "2s", "--grace", "1s"])
        try host.install("Hostile", info: "Tests/Fixtures/Hostile/Info.plist", as: "Hostile.app")
        try host.install("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", as: "Misbehaving.app")
        try host.start()
        defer { host.stop() }
        let deaf = LockedValue<Result<CLIResult, Error>?>(nil)
        let thread = Thread {
            deaf.withLock { $0 = Result { try host.cli(["simulate-launch", "com.example.hostile.deafflood", "--force", "--type", "processing", "--json"]) } }
        }
        thread.start()
        usleep(700_000)
        let otherResult = try host.cli(["simulate-launch", "com.example.misbehaving.ok", "--force", "--type", "refresh", "--json"])
        let other = try #require(try? RunRecord.decode(Data(otherResult.stdout.utf8)), "\(otherResult.stdout) \(otherResult.stderr)")
        #expect(other.task("com.example.misbehaving.ok")?.outcome == .succeeded, "\(other)")
        #expect(eventually(within: 20) { deaf.withLock { $0 != nil } })
        let result = try #require(try deaf.withLock { $0 }?.get())
        let record = try #require(try? RunRecord.decode(Data(result.stdout.utf8)), "\(result.stdout) \(result.stderr)")
        #expect(record.termination == .watchdog || record.termination == .crashed, "\(record)")
        // Budget 2 s and grace 1 s: killed at the grace's end, not whenever the flood lets up.
        #expect(record.wallMs < 4_500, "ended after \(record.wallMs) ms")
        #expect(try record.logText().contains("hostile: deaf, flooding pending calls"))
    }
}

/// In `SupervisorTests` (serialized): its forty launches' sockets live in this process for
/// seconds, and `aLaunchLeaksNoDescriptorAndNoChildAndInheritsNothing` counts this process's
/// sockets; in a suite of its own it ran beside that test and was counted as a leak. The two
/// equivalence tests are here too: their launches (a jetsam kill, a lingering computation) ran
/// beside the forty and left one of them short of CPU on a loaded CI machine.
extension SupervisorTests {
    /// The loops against their plain reference, a thread per launch (`superviseAlone`,
    /// `supervision-event-loops.md`): the same plugin behaviours end in the same records.
    @Test func launchesOnTheLoopsRecordWhatLaunchesAloneRecord() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        let onLoops = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))
        var alone = onLoops
        alone.onLoops = false
        for name in RunRecord.behaviours {
            let looped = try SupervisionLoopTests.launch(name, of: bundle, by: onLoops, scratch: scratch)
            let threaded = try SupervisionLoopTests.launch(name, of: bundle, by: alone, scratch: scratch)
            #expect(looped.behaviour == threaded.behaviour, "\(name):\nloops:\n\(looped.behaviour)\nalone:\n\(threaded.behaviour)")
        }
    }

    /// Soft deadlines on the 5 ms grid against exact ones (`soft-deadline-grid.md`): launches
    /// that are sampled, expired, killed by the watchdog and by jetsam end the same way.
    @Test func softDeadlinesOnTheGridRecordWhatExactOnesRecord() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        let grid = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))
        var exact = grid
        exact.coalescesSoftDeadlines = false
        for name in ["ok", "linger-brief", "never", "noexpiry", "alloc"] {
            let onGrid = try SupervisionLoopTests.launch(name, of: bundle, by: grid, scratch: scratch)
            let exactly = try SupervisionLoopTests.launch(name, of: bundle, by: exact, scratch: scratch)
            #expect(onGrid.behaviour == exactly.behaviour, "\(name):\ngrid:\n\(onGrid.behaviour)\nexact:\n\(exactly.behaviour)")
            if name == "alloc" { #expect(onGrid.termination == .jetsam && exactly.termination == .jetsam) }
        }
    }

    /// Forty launches at once, each sleeping in its handler past its budget, are supervised by
    /// the loops and a few workers: no thread per launch. Every one is expired and ends with a
    /// record.
    @Test func manyLaunchesAtOnceTakeNoThreadEach() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        var supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))
        supervisor.zygote = Zygote(runnerPath: supervisor.runnerPath, logger: Logger(label: "test"), confine: true)
        defer { supervisor.zygote?.stop() }
        let records = LockedValue([RunRecord]())
        let count = 40
        for _ in 0..<count {
            var limits = LaunchLimits.defaults(for: [.processing])
            limits.budget = .milliseconds(2500)
            // A grace a loaded machine keeps: forty expiration handlers at once on a CI machine
            // running other suites took more than 500 ms, and one launch met its watchdog.
            limits.grace = .seconds(5)
            let id = LaunchPlan.newLaunchID()
            let plan = LaunchPlan(
                bundle: bundle, tasks: [TaskAssignment(task: 1, identifier: "com.example.misbehaving.never", kind: .processing)],
                reason: "simulated", limits: limits, launchID: id,
                dataDirectory: scratch.state.appendingPathComponent("containers/\(bundle.identifier)"),
                logFile: scratch.state.appendingPathComponent("logs/\(id).log"))
            supervisor.start(plan, broker: InMemoryRequestBroker()) { outcome in
                if case .success(let record) = outcome { records.withLock { $0.append(record) } }
            }
        }
        // While they sleep: the supervision's threads, by name (other suites share this process).
        usleep(1_500_000)
        let threads = Self.supervisionThreadNames().filter { $0.hasPrefix("bgtask.loop") || $0.hasPrefix("bgtask.launch") || $0.hasPrefix("bgtask.broker") }
        // The loops at least (named by the kernel: an empty list would be a count that cannot fail).
        #expect(threads.filter { $0.hasPrefix("bgtask.loop") }.count == SupervisionLoops.all.count, "\(threads)")
        #expect(threads.count <= SupervisionLoops.all.count + 8, "\(threads.count) supervision threads for \(count) launches: \(threads)")
        #expect(eventually(within: 30) { records.withLock { $0.count } == count }, "\(records.withLock { $0.count }) of \(count) records")
        for record in records.withLock({ $0 }) {
            #expect(record.termination == .exited, "\(record.termination): \(record.error ?? "")")
            #expect(record.tasks.first?.expiredMs != nil, "not expired: \(record)")
        }
    }

    static func supervisionThreadNames() -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap { try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) }
    }

}

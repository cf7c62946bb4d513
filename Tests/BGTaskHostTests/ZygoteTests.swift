@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskSystem
import BGTaskModel
import Foundation
import Logging
import Testing
import _BGTaskSystemShims

/// The zygote launcher in-process, as the host uses it: launches are handed to a spare the
/// zygote forked in advance, and every process it makes is this process's child.
/// Serialized, and the only suite that starts a zygote in this process: it counts the zygote's
/// processes among this process's children.
@Suite(.serialized) struct ZygoteTests {
    /// This process's children that are the zygote or one of its spares (a spare is a fork of
    /// the zygote that has not become a launch, so it has the zygote's command line).
    /// The zygote's processes among this process's children: what runs `--zygote` and is not
    /// stopped (an in-process host's suspended app keeps the zygote's command line in its
    /// outer process and its namespace's init, stopped).
    func zygoteProcesses() -> Set<pid_t> {
        Set(ProcessTree.children(of: getpid()).filter { pid in
            if ProcessTree.status(of: pid)?.state == UInt8(ascii: "T") { return false }
            let cmdline = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
            return String(decoding: cmdline, as: UTF8.self).contains("--zygote")
        })
    }

    func plan(_ bundle: PluginBundle, _ identifier: String, scratch: Scratch) -> LaunchPlan {
        let id = LaunchPlan.newLaunchID()
        return LaunchPlan(
            bundle: bundle, tasks: [TaskAssignment(task: 1, identifier: identifier, kind: .refresh)],
            reason: "simulated", limits: .defaults(for: [.refresh]), launchID: id,
            dataDirectory: scratch.state.appendingPathComponent("containers/\(bundle.identifier)"),
            logFile: scratch.state.appendingPathComponent("logs/\(id).log"))
    }

    /// The Misbehaving bundle, and a supervisor that launches through a zygote of its own.
    func launcher(_ scratch: Scratch) throws -> (PluginBundle, LaunchSupervisor, Zygote) {
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        let zygote = Zygote(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))
        var supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))
        supervisor.zygote = zygote
        return (bundle, supervisor, zygote)
    }

    /// Whether `child` (this process's) has exited with all its threads, so that waiting for it
    /// would succeed; it is left unreaped (WNOWAIT) for its owner.
    func wholeProcessExited(_ child: pid_t) -> Bool {
        var info = siginfo_t()
        guard waitid(P_PID, id_t(child), &info, WEXITED | WNOHANG | WNOWAIT) == 0 else { return false }
        return info._sifields._sigchld.si_pid == child
    }

    @Test func eachLaunchTakesTheSpareForkedBeforeItAndNothingOutlivesTheZygote() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (bundle, supervisor, zygote) = try launcher(scratch)
        defer { zygote.stop() }

        var pids: [pid_t] = []
        for _ in 0..<3 {
            // Before each launch but the first (which starts the zygote): the zygote and one
            // spare waiting for it.
            if !pids.isEmpty { #expect(eventually { zygoteProcesses().count == 2 }, "zygote and spare: \(zygoteProcesses())") }
            let before = zygoteProcesses()
            let record = try supervisor.run(plan(bundle, "com.example.misbehaving.fds", scratch: scratch), broker: InMemoryRequestBroker())
            #expect(record.termination == .exited)
            #expect(record.launcher == "zygote")
            #expect(record.task("com.example.misbehaving.fds")?.outcome == .succeeded)
            if !pids.isEmpty {
                // Launches after the first went to the spare that was waiting.
                #expect(before.contains(record.pid), "launch \(record.pid) was not the waiting spare (\(before))")
            }
            pids.append(record.pid)
            // A spare becomes an ordinary launch: descriptors 0-3 only, its own log.
            let log = try record.logText()
            #expect(log.contains("fd 3 -> socket:"), "the channel is fd 3: \(log)")
            #expect(log.contains("fd 1 -> pipe:") && log.contains("fd 2 -> pipe:"), "stdout and stderr go to the pipe into the launch log: \(log)")
            // Signal actions as a spawned runner has them: the zygote's own handlers (the Swift
            // runtime's crash handlers among them) reset to their defaults; the runner ignores
            // SIGPIPE itself. (Signals 32 and up are glibc's and the real-time ones: not looked
            // at. Blocked signals are per thread, and the handler runs on a Dispatch worker
            // while the main thread may be inside pthread_create, all signals blocked: not
            // looked at either.)
            func mask(_ name: String) -> UInt64? {
                log.split(separator: "\n").first { $0.hasPrefix(name + ":") }
                    .flatMap { UInt64($0.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces), radix: 16) }
            }
            let classic: UInt64 = 0x7FFF_FFFF // signals 1-31
            #expect(mask("SigIgn").map { $0 & classic } == 1 << (UInt64(SIGPIPE) - 1), "only SIGPIPE ignored: \(log)")
            #expect(mask("SigCgt").map { $0 & classic } == 0, "no handler the launch did not install: \(log)")
        }
        #expect(Set(pids).count == 3, "every launch is a fresh process: \(pids)")

        zygote.stop()
        // The zygote and its spare are gone and reaped (no zombie left among the children).
        #expect(zygoteProcesses().isEmpty, "left after stop: \(zygoteProcesses())")
    }

    @Test func aDeadSpareOrADeadZygoteDoesNotFailALaunch() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (bundle, supervisor, zygote) = try launcher(scratch)
        defer { zygote.stop() }

        let first = try supervisor.run(plan(bundle, "com.example.misbehaving.fds", scratch: scratch), broker: InMemoryRequestBroker())
        #expect(first.termination == .exited)
        #expect(eventually { zygoteProcesses().count == 2 })
        // Kill the spare: the zygote forks the next launch itself.
        let spare = try #require(zygote.spareIDs.first, "a spare is waiting")
        // In a PID namespace, the spare's app process (what holds its socket) is below it, and
        // dies with it (its init dies with the outer process, and the namespace with its init).
        let app = ProcessTree.appProcess(of: spare) ?? spare
        kill(spare, SIGKILL)
        #expect(eventually { app == spare || (kill(app, 0) != 0 && errno == ESRCH) }, "the killed spare's process \(app) is gone")
        // Dead, not merely signalled: a launch handed to a spare in the instant it dies fails
        // like any runner dying at its start. A zombie leader is not enough: the spare has
        // threads (its rehearsal's), and until the last of them is gone the descriptor table,
        // and with it the spare's socket, is still open and would take the launch.
        #expect(eventually { wholeProcessExited(spare) }, "the killed spare \(spare) is gone")
        let afterSpare = try supervisor.run(plan(bundle, "com.example.misbehaving.fds", scratch: scratch), broker: InMemoryRequestBroker())
        #expect(afterSpare.termination == .exited)
        #expect(afterSpare.launcher == "zygote")
        #expect(afterSpare.task("com.example.misbehaving.fds")?.outcome == .succeeded)
        #expect(afterSpare.pid != spare)

        // Kill the zygote: the next launch starts a new one.
        #expect(eventually { zygoteProcesses().count == 2 })
        let oldZygote = zygote.processID
        #expect(oldZygote > 0 && zygoteProcesses().contains(oldZygote))
        kill(oldZygote, SIGKILL)
        let afterZygote = try supervisor.run(plan(bundle, "com.example.misbehaving.fds", scratch: scratch), broker: InMemoryRequestBroker())
        #expect(afterZygote.termination == .exited)
        #expect(afterZygote.launcher == "zygote")
        #expect(afterZygote.task("com.example.misbehaving.fds")?.outcome == .succeeded)

        zygote.stop()
        #expect(zygoteProcesses().isEmpty, "left after stop (the killed spare and zygote included): \(zygoteProcesses())")
    }

    /// A zygote that stops answering (here: stopped with SIGSTOP) holds no launch for longer
    /// than its answer timeout: it is killed, and the launch goes to a new one.
    @Test func aZygoteThatDoesNotAnswerIsReplaced() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (bundle, supervisor, zygote) = try launcher(scratch)
        defer { zygote.stop() }
        zygote.answerTimeout = .milliseconds(500)
        let first = try supervisor.run(plan(bundle, "com.example.misbehaving.ok", scratch: scratch), broker: InMemoryRequestBroker())
        #expect(first.termination == .exited)
        let stuck = zygote.processID
        #expect(stuck > 0)
        kill(stuck, SIGSTOP)
        let started = Date()
        // The first launch after goes to the spare the host already holds: a stuck zygote does
        // not hold it up. The next one waits for the spare the stuck zygote never gives, for
        // `answerTimeout`, then a new zygote serves it.
        for _ in 0..<2 {
            let next = try supervisor.run(plan(bundle, "com.example.misbehaving.ok", scratch: scratch), broker: InMemoryRequestBroker())
            #expect(next.termination == .exited)
            #expect(next.launcher == "zygote")
            #expect(next.task("com.example.misbehaving.ok")?.outcome == .succeeded)
        }
        #expect(Date().timeIntervalSince(started) < 30)
        #expect(zygote.processID != stuck && zygote.processID > 0, "a new zygote serves")
        #expect(kill(stuck, 0) != 0, "the stuck zygote was killed and reaped")
    }

    /// A launch started while dozens of others run has its main run loop, and waits without
    /// burning CPU. The zygote holds two pidfds for every launch it started that is still
    /// running; each spare inherits them, so the descriptors its main run loop makes (an epoll
    /// set, an eventfd, a timerfd) come after all of them. They were found by looking below
    /// 256 with room for 64: with a few dozen launches running, `becomeLaunch` closed them, and
    /// every launch from then on spun in `RunLoop.run` for its whole life (at 300 launches at
    /// once, the runners' CPU held both cores and launches started at 40 a second).
    @Test func aLaunchAmongManyKeepsItsMainRunLoopAndWaitsWithoutCPU() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (bundle, supervisor, zygote) = try launcher(scratch)
        defer { zygote.stop() }
        let count = 40
        let started = LockedValue(0)
        let records = LockedValue([RunRecord]())
        let group = DispatchGroup()
        for _ in 0..<count {
            var open = plan(bundle, "com.example.misbehaving.never", scratch: scratch)
            open.expireAfter = .seconds(4)
            open.limits.grace = .seconds(2)
            let control = LaunchControl()
            control.onStart = { _ in started.withLock { $0 += 1 } }
            group.enter()
            Thread { [open] in
                defer { group.leave() }
                if let record = try? supervisor.run(open, broker: InMemoryRequestBroker(), control: control) {
                    records.withLock { $0.append(record) }
                }
            }.start()
        }
        #expect(eventually { started.withLock { $0 } == count }, "\(started.withLock { $0 }) of \(count) launches started")
        let probe = try supervisor.run(plan(bundle, "com.example.misbehaving.fds", scratch: scratch), broker: InMemoryRequestBroker())
        #expect(probe.launcher == "zygote")
        let log = try probe.logText()
        #expect(log.contains("anon_inode:[eventpoll]"), "the main run loop's epoll set is open in the launch: \(log)")
        #expect(log.contains("anon_inode:[timerfd]"), "and its timer: \(log)")
        #expect(group.wait(timeout: .now() + 60) == .success)
        let ended = records.withLock { $0 }
        #expect(ended.count == count)
        for record in ended {
            // About 4 s each, waiting on the main run loop for the expiration: a spinning one
            // takes a core's share of all of it.
            #expect(record.task("com.example.misbehaving.never")?.outcome == .expired, "\(record.launchID)")
            #expect(record.cpuMs < 500, "launch \(record.launchID) used \(record.cpuMs) ms of CPU in \(record.wallMs) ms")
        }
    }

    /// The zygote's launches against the plain reference, a runner spawned for each launch
    /// (`zygote-spares.md`): the same plugin behaviour gives the same record, but for what says
    /// how it was launched (the launcher, pids, times). Successes, failures, a double
    /// completion, an expiration handled, a watchdog kill, a crash, an exit and a late
    /// registration, each through both.
    @Test func aZygoteLaunchRecordsWhatASpawnedLaunchRecords() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (bundle, zygoteSupervisor, zygote) = try launcher(scratch)
        defer { zygote.stop() }
        let spawnSupervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))

        for name in RunRecord.behaviours {
            let identifier = "com.example.misbehaving.\(name)"
            func launch(_ supervisor: LaunchSupervisor) throws -> RunRecord {
                var plan = plan(bundle, identifier, scratch: scratch)
                plan.limits.budget = .milliseconds(300)
                plan.limits.grace = .milliseconds(400)
                return try supervisor.run(plan, broker: InMemoryRequestBroker())
            }
            let forked = try launch(zygoteSupervisor)
            let spawned = try launch(spawnSupervisor)
            #expect(forked.launcher == "zygote" && spawned.launcher == "spawn", "\(name): \(String(describing: forked.launcher)) / \(String(describing: spawned.launcher))")
            #expect(forked.behaviour == spawned.behaviour, "\(name):\nzygote:\n\(forked.behaviour)\nspawn:\n\(spawned.behaviour)")
        }
    }
}

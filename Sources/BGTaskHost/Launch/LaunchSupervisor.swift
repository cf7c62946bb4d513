import BGTaskSystem
import BGTaskModel
import BGTaskWire
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// Runs one launch in a child process and supervises it to the end: spawns the runner in its
/// own process group, hands it the launch over a socketpair, answers its requests, delivers
/// expiration at the budget's end, kills the group at the grace's end (watchdog) or when its
/// memory crosses the limit (jetsam), reaps it and writes the run record.
///
/// `run` blocks the calling thread for the life of the launch, in one `poll(2)` loop over the
/// channel and a pidfd with deadlines as timeouts: no sleeps. Call it from any thread of a
/// process that is not itself a launch child; it never loads plugin code.
public struct LaunchSupervisor: Sendable {
    public var runnerPath: String
    public var logger: Logger
    /// How often resident memory is sampled when a memory limit is set (sampler mechanism),
    /// while it grows. While it does not, the interval is the time a burst at
    /// `memoryBurstBytesPerSecond` would take to carry the launch from its resident memory to
    /// 10 % over its limit, at most `maximumMemorySampleInterval` (after the launch's first
    /// `maximumMemorySampleInterval`, sampled every `memorySampleInterval`): a launch that sleeps far
    /// below its limit costs the host a few samples a second instead of 200 (at a thousand
    /// launches, the difference between a host that keeps its deadlines and one that cannot).
    public var memorySampleInterval: Duration = .milliseconds(5)
    public var maximumMemorySampleInterval: Duration = .milliseconds(100)
    /// Faster than one thread touches fresh memory on the machines measured (1.5 GiB/s), and than
    /// two: the steady-state interval keeps the jetsam overshoot within 10 % up to this rate.
    public var memoryBurstBytesPerSecond: Double = 4 * 1_073_741_824
    /// How often the sampler looks for processes the launch started; between looks it reads
    /// the runner's and the known descendants' resident memory only. Each look asks the runner
    /// first (`probeChildren`, answered with waitid) and walks /proc/RUNNER/task/*/children only
    /// when it has a child, or did not answer the previous probe: the /proc entries a walk
    /// creates under a runner make its reap spin in the kernel for up to milliseconds (see
    /// docs/decisions/no-proc-on-the-launch-path.md), a cost a launch that starts no process should not pay. The first look
    /// comes this long after the launch starts; a descendant that races ahead of it still
    /// meets the runner's RLIMIT_DATA backstop.
    public var descendantSampleInterval: Duration = .milliseconds(20)
    /// How often the sampler walks a launch's tree whatever the runner answers to the probe (a
    /// forged "no child" hides a child for at most this long).
    public var descendantCheckInterval: Duration = .milliseconds(100)
    /// Confine every launch (Landlock, seccomp-bpf, no_new_privs; see the runner's Sandbox).
    /// Off only for debugging: records then say each layer is off.
    public var confine = true
    /// Confinement fails closed: a layer this machine offers (Landlock, seccomp, no_new_privs,
    /// a PID namespace for a root host) that cannot be applied fails the launch with the reason
    /// (`launch-failed`). False only when the operator asks for less (`--sandbox best-effort`):
    /// the record then says which layer is missing and why, and the launch runs.
    public var sandboxFailsClosed = true
    /// When set (the host runs as root), each app runs as its own uid from this table, its
    /// container is its own, and its app groups' gids are its supplementary groups.
    public var identities: AppIdentities?
    /// A delegated cgroup v2 directory: when set, every launch gets a child cgroup there, its
    /// memory limit is kernel-enforced (`memory.max`) instead of sampled, its process count is
    /// capped (`pids.max`) and it ends with `cgroup.kill`.
    public var cgroupRoot: URL?
    /// The `pids.max` of each launch's cgroup (threads count too), with a `cgroupRoot` whose
    /// children have the pids controller; and RLIMIT_NPROC of the app's uid when launches run
    /// as their own uids (`identities`). Nil for none.
    public var processLimit: Int? = LaunchSupervisor.defaultProcessLimit
    /// The fast path: fork launches from a pre-warmed zygote instead of spawning the runner.
    /// Falls back to posix_spawn when the zygote cannot serve.
    public var zygote: Zygote?
    /// Apps' processes kept between launches (`AppLifecycle.ios`): a launch whose work is over
    /// leaves its process suspended here, and the app's next launch resumes it. Nil: a fresh
    /// process per launch (`--app-lifecycle fresh`, `bgtask run`). Extensions are never kept.
    var suspendedApps: SuspendedApps?

    public init(runnerPath: String, logger: Logger) {
        self.runnerPath = runnerPath
        self.logger = logger
    }

    /// Checks that `directory` is a delegated cgroup v2 directory usable as `cgroupRoot`, and
    /// returns what launches under it will go without (e.g. no pids controller: no process limit).
    @discardableResult
    public static func validateCgroupRoot(_ directory: URL) throws(BGTaskError) -> [String] {
        try CgroupV2.LaunchGroup.validate(root: directory)
    }

    /// The runner next to the running executable, or `$BGTASK_RUNNER`.
    public static func defaultRunnerPath() -> String {
        if let path = ProcessInfo.processInfo.environment["BGTASK_RUNNER"], !path.isEmpty { return path }
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        return executable.deletingLastPathComponent().appendingPathComponent("bgtask-runner").path
    }

    /// What a launch comes to: its record, or why it could not be started at all.
    public typealias Completion = @Sendable (Result<RunRecord, BGTaskError>) -> Void

    /// Runs the launch and waits for its record (`start`, then a wait: for `bgtask run`, the
    /// benches and tests; the host itself never waits).
    public func run(_ plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl? = nil) throws(BGTaskError) -> RunRecord {
        let done = DispatchSemaphore(value: 0)
        let result = LockedValue<Result<RunRecord, BGTaskError>?>(nil)
        let completion: Completion = { outcome in
            result.withLock { $0 = outcome }
            done.signal()
        }
        // Prepared on this thread, which waits anyway (no hop to a worker first).
        do throws(BGTaskError) {
            try prepare(plan, broker: broker, control: control, completion: completion)
        } catch {
            completion(.failure(error))
        }
        done.wait()
        return try result.withLock { $0! }.get()
    }

    /// Starts the launch and returns at once; `completion` gets its record, on a worker thread.
    ///
    /// The blocking steps (its containers made, its disk use measured, its process spawned,
    /// and after it ends its reap and record) run on `workers`, a few threads for the whole
    /// host; between them the launch is a source of a supervision loop (`SupervisionLoops`),
    /// which supervises every running launch without a thread each.
    public func start(_ plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl? = nil, completion: @escaping Completion) {
        Self.workers.run { [self] in
            do throws(BGTaskError) {
                try prepare(plan, broker: broker, control: control, completion: completion)
            } catch {
                completion(.failure(error))
            }
        }
    }

    /// The threads for the blocking steps around launches (see `start`). Four: a walk of a
    /// large container for its disk quota must not hold up the next launch's fork.
    static let workers = WorkerPool(name: "bgtask.launch", size: 4)
    /// The threads that answer launches' calls (submit, pending, notifications, transfers):
    /// they wait on the store and the host's queue, which the loops must never do.
    static let brokers = WorkerPool(name: "bgtask.broker", size: 4)
    /// The threads that walk launches' containers for their disk quota and the disk reserve (a
    /// container of a million files takes about a second): never a loop, and not the workers
    /// that start and end launches.
    static let walkers = WorkerPool(name: "bgtask.walk", size: 2)

    /// On a worker: everything a launch needs before its process exists; then, once the host
    /// has recorded it (`LaunchControl.whenAdmitted`), its process is started or resumed.
    private func prepare(_ plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?, completion: @escaping Completion) throws(BGTaskError) {
        guard access(runnerPath, X_OK) == 0 else {
            throw BGTaskError(.launch, file: runnerPath, "the bgtask-runner executable is missing or not executable (set BGTASK_RUNNER)")
        }
        let (groups, refusedGroups, identity) = try prepareContainers(plan)
        // The app's disk quota, measured before anything of the launch exists: an app over it
        // is not launched (a `launch-failed` record that says why; its requests stay pending).
        var diskUseAtStart: DiskUse?
        if plan.limits.diskQuota.isOn {
            let use = DiskAccounting.use(of: plan)
            if let exceeded = plan.limits.diskQuota.exceeded(by: use) {
                var record = RunRecord.notStarted(plan, error: BGTaskError(
                    .launch, file: plan.dataDirectory.path,
                    "not launched: \(exceeded); it launches again once it holds less (remove files from its container, or raise --disk-quota or --disk-quota-inodes)"))
                record.disk = Self.diskRecord(plan, use: use, exceeded: exceeded, logError: nil)
                completion(.success(record))
                return
            }
            diskUseAtStart = use
        }

        // The app's suspended process, when it has one that can run this launch: resumed.
        let keeps = suspendedApps != nil && plan.role != .extension
        var key: SuspendedApp.Key?
        var previous: AppProcessEviction?
        if keeps, let apps = suspendedApps {
            let processKey = SuspendedApp.Key(plan: plan, groups: groups.map(\.identifier), confine: confine, uid: identity?.uid)
            key = processKey
            let bringsEvents = plan.role != .background || plan.eventJSON != nil || plan.reason == .remoteNotification || plan.reason == .backgroundTransfer
            let (process, eviction) = apps.take(plan.bundle.identifier, key: processKey, bringsEvents: bringsEvents)
            if let process {
                let log = LaunchLog(path: plan.logFile.path, limit: plan.limits.logLimitBytes,
                                    header: LaunchLogHeader(app: plan.bundle.identifier, launchID: plan.launchID), adopting: process.logReadEnd)
                for group in refusedGroups.keys.sorted() { log.append(level: 2, refusedGroups[group]!) }
                let resumption = Prepared(plan: plan, broker: broker, control: control, completion: completion, log: log,
                                          refusedGroups: refusedGroups, diskUseAtStart: diskUseAtStart)
                Self.whenAdmitted(control) { [self] allowed in resume(process, resumption, allowed: allowed, apps: apps) }
                return
            }
            previous = eviction
        }

        let channels: (parent: LaunchChannel, child: LaunchChannel)
        do { channels = try LaunchChannel.makePair() } catch {
            throw BGTaskError(.system, "\(error)")
        }
        // The child's stdout and stderr: a pipe into the launch log (see LaunchLog), whose
        // header says whose it is (the entries' app is the host's word, not the child's).
        let log: LaunchLog
        do {
            log = try LaunchLog(path: plan.logFile.path, limit: plan.limits.logLimitBytes,
                                header: LaunchLogHeader(app: plan.bundle.identifier, launchID: plan.launchID))
        } catch {
            channels.parent.close()
            channels.child.close()
            throw error
        }
        for group in refusedGroups.keys.sorted() { log.append(level: 2, refusedGroups[group]!) }
        let prepared = Prepared(plan: plan, broker: broker, control: control, completion: completion, log: log,
                                refusedGroups: refusedGroups, diskUseAtStart: diskUseAtStart)
        prepared.fresh = FreshProcess(channels: channels, groups: groups, identity: identity, keeps: keeps, key: key, previous: previous)
        Self.whenAdmitted(control) { [self] allowed in
            do throws(BGTaskError) {
                try spawn(prepared, allowed: allowed)
            } catch {
                completion(.failure(error))
            }
        }
    }

    /// What `prepare` hands to the step after admission.
    final class Prepared: @unchecked Sendable {
        let plan: LaunchPlan
        let broker: LaunchRequestBroker
        let control: LaunchControl?
        let completion: Completion
        let log: LaunchLog
        let refusedGroups: [String: String]
        let diskUseAtStart: DiskUse?
        var fresh: FreshProcess?

        init(plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?, completion: @escaping Completion, log: LaunchLog,
             refusedGroups: [String: String], diskUseAtStart: DiskUse?) {
            self.plan = plan
            self.broker = broker
            self.control = control
            self.completion = completion
            self.log = log
            self.refusedGroups = refusedGroups
            self.diskUseAtStart = diskUseAtStart
        }
    }

    struct FreshProcess {
        var channels: (parent: LaunchChannel, child: LaunchChannel)
        var groups: [AppGroup]
        var identity: LaunchIdentity?
        var keeps: Bool
        var key: SuspendedApp.Key?
        var previous: AppProcessEviction?
    }

    /// `body` once the host has recorded the launch: at once on this thread when it has (or
    /// needs no admission), else on a worker when it does.
    private static func whenAdmitted(_ control: LaunchControl?, _ body: @escaping @Sendable (Bool) -> Void) {
        guard let control else { return body(true) }
        if let allowed = control.admission(orWhenKnown: { allowed in workers.run { body(allowed) } }) { body(allowed) }
    }

    /// On a worker, once admitted: the runner started (forked from the zygote, or spawned), told
    /// its launch, and handed to a supervision loop.
    private func spawn(_ prepared: Prepared, allowed: Bool) throws(BGTaskError) {
        let plan = prepared.plan, log = prepared.log, control = prepared.control
        let fresh = prepared.fresh!
        let channels = fresh.channels
        var childEndOpen = true
        var parentKept = false
        defer {
            if childEndOpen { channels.child.close() }
            if !parentKept { channels.parent.close() }
        }
        guard allowed else {
            throw BGTaskError(.launch, "the launch could not be recorded in the store; it was not started")
        }
        let nullFD = try syscall("open /dev/null") { open("/dev/null", O_RDONLY | O_CLOEXEC) }
        defer { close(nullFD) }
        var logger = logger
        // Set on the logger in one assignment once the pid is known: a log handler may redo its
        // work on every metadata change (swift-log's StreamLogHandler prettifies all of it).
        var launchMetadata: Logger.Metadata = ["launch.id": "\(plan.launchID)", "bundle.id": "\(plan.bundle.identifier)"]

        // Orphans of a launch (a plugin's grandchildren whose parents died) come back to this
        // process instead of init, so they can be found and killed.
        _ = bgtask_set_child_subreaper()
        let startNs = bgtask_monotonic_ns()
        let startedAt = Date()
        // The launch, written into the channel before the child exists when no cgroup has to
        // take the child first: the runner finds it waiting instead of asking for it.
        let startFirst = cgroupRoot == nil
        func sendStart(_ cgroup: CgroupV2.LaunchGroup?) -> String? {
            var start = assignment(plan, cgroup: cgroup, groups: fresh.groups, identity: fresh.identity)
            start.expiresAtNs = startNs + UInt64((plan.expireAfter ?? plan.limits.budget).nanoseconds)
            start.backgroundRefreshStatus = plan.backgroundRefreshStatus
            start.reason = plan.reason.rawValue
            start.suspendable = fresh.keeps
            do { try channels.parent.send(ParentMessage.start(start)) } catch { return "\(error)" }
            return nil
        }
        var startError = startFirst ? sendStart(nil) : nil
        let started = startRunner(plan, channel: channels.child.fd, stdin: nullFD, log: log.childEnd, metadata: launchMetadata)
        channels.child.close()
        childEndOpen = false
        log.closeChildEnd()
        let (pid, forked) = try started.get()
        parentKept = true
        if fresh.keeps { suspendedApps?.started(plan.bundle.identifier, pid: pid) }
        launchMetadata["child.pid"] = "\(pid)"
        logger.handler.metadata.merge(launchMetadata) { $1 }
        // The runner waits for its launch before loading anything, so every plugin process
        // starts inside the launch's cgroup.
        let cgroup = cgroupRoot.flatMap { launchGroup(under: $0, for: pid, plan: plan) }
        logger.debug("launch started", metadata: ["tasks": "\(plan.tasks.map(\.identifier))"])

        var state = LaunchState(plan: plan, startNs: startNs, log: log)
        state.diskUseAtStart = prepared.diskUseAtStart
        state.launcher = forked ? "zygote" : "spawn"
        state.cgroup = cgroup
        state.keepsProcess = fresh.keeps
        state.previousProcess = fresh.previous.map { "\($0.reason) (\(RunRecord.iso8601($0.at)))" }
        if !startFirst { startError = sendStart(cgroup) }
        if let startError {
            logger.error("could not send the launch to its runner", metadata: ["error": "\(startError)"])
            // Without its launch the runner would wait for it until the budget ends.
            state.end(.launchFailed, error: "could not send the launch to the runner: \(startError)")
            state.killed = .launchFailed
            Self.terminate(pid, cgroup: cgroup)
        }

        control?.onStart?(pid)
        let loop = LaunchLoop(pid: pid, channel: channels.parent, plan: plan, broker: prepared.broker, control: control,
                              logger: logger, supervisor: self, state: state)
        let ending = SupervisedLaunch.Ending(
            key: fresh.keeps ? fresh.key : nil, apps: fresh.keeps ? suspendedApps : nil, launches: 1, cpuAtStartNs: 0, startedAt: startedAt,
            refusedGroups: prepared.refusedGroups, resumed: false)
        supervise(SupervisedLaunch(supervisor: self, logger: logger, pid: pid, channel: channels.parent, cgroup: cgroup, loop: loop, state: state,
                                   ending: ending, completion: prepared.completion))
    }

    /// Hands a started launch to the supervision loop with the fewest launches (or, when no
    /// loop could be made, out of descriptors, to a thread of its own that turns it).
    private func supervise(_ launch: SupervisedLaunch) {
        if let loop = SupervisionLoops.next() {
            launch.home = loop
            launch.loop.deferDiskWalks()
            loop.add(launch)
        } else {
            Thread { launch.superviseAlone() }.start()
        }
    }

    /// Waits for the launch's process (`pid`, the host's child) to be reaped, then cleans up
    /// after it and reads what it wrote and said last. Its wait status, its rusage, and when it
    /// ended (the launch ends when its child is reaped; cleaning up after it is the host's time).
    func reap(_ pid: pid_t, cgroup: CgroupV2.LaunchGroup?, _ loop: inout LaunchLoop, _ state: inout LaunchState,
              log: LaunchLog, exitedAtNs: UInt64? = nil) -> (status: Int32, usage: rusage, endNs: UInt64) {
        var status: Int32 = 0
        var usage = rusage()
        _ = try? syscall("wait4") { bgtask_wait4(pid, &status, 0, &usage) }
        let endNs = min(exitedAtNs ?? .max, bgtask_monotonic_ns())
        cleanUp(after: pid, cgroup: cgroup, &state)
        // What the launch wrote before it ended, then what it said on its channel.
        log.drain(budget: LaunchLog.finalDrainBytes)
        loop.drain(&state)
        log.finish()
        return (status, usage, endNs)
    }

    /// What every record gets once its launch is over, however it ended (reaped, or
    /// suspended): its cgroup's process limit, the app's disk use against its quota and a log
    /// that could not be kept, the app groups it was refused.
    func finish(_ record: inout RunRecord, _ state: LaunchState, plan: LaunchPlan, log: LaunchLog,
                        cgroup: CgroupV2.LaunchGroup?, refusedGroups: [String: String], logger: Logger) {
        record.processLimit = cgroup?.processLimit
        let logError = log.failure.map { "\($0): \(log.lostBytes) bytes of the launch's output were not kept" }
        if plan.limits.diskQuota.isOn || logError != nil {
            // What the app holds now, for the record (one walk; the quota's kill, if any, says
            // what it held then).
            let use = plan.limits.diskQuota.isOn ? DiskAccounting.use(of: plan) : nil
            record.disk = Self.diskRecord(plan, use: use, exceeded: state.diskQuotaExceeded, logError: logError)
        }
        if !refusedGroups.isEmpty { record.appGroupsRefused = refusedGroups }
        logger.debug("launch ended", metadata: ["termination": "\(record.termination.rawValue)"])
    }

    /// Runs the launch in the app's suspended `process`: continued (`SIGCONT`, its cgroup thawed),
    /// told the launch (`ParentMessage.resume`: no load, no launch entry; the app's resume
    /// handler, then its tasks), supervised as any launch (its own budget, expiration, watchdog,
    /// memory limit and log), then suspended again or reaped.
    private func resume(_ process: SuspendedApp, _ prepared: Prepared, allowed: Bool, apps: SuspendedApps) {
        let plan = prepared.plan, log = prepared.log, control = prepared.control
        var logger = logger
        logger.handler.metadata.merge(["launch.id": "\(plan.launchID)", "bundle.id": "\(plan.bundle.identifier)", "child.pid": "\(process.pid)"]) { $1 }
        guard allowed else {
            // Not recorded, not run: the process goes back to sleep as it was (or ends, when
            // the host is stopping). Either way its descriptors are no longer this launch's.
            // Its log pipe as the launch's log left it: closed when it found the process dead
            // (every writer gone), and then not closed again by number later.
            var process = process
            process.logReadEnd = log.detachReadEnd()
            if process.logReadEnd < 0 || !apps.suspend(process) { apps.endUnkept(process) }
            prepared.completion(.failure(BGTaskError(.launch, "the launch could not be recorded in the store; it was not started")))
            return
        }
        let startNs = bgtask_monotonic_ns()
        let startedAt = Date()
        var state = LaunchState(plan: plan, startNs: startNs, log: log)
        // Loaded and launched long ago: a death from here on is the app's crash.
        state.phase = .launched
        state.diskUseAtStart = prepared.diskUseAtStart
        state.sandbox = process.sandbox
        state.launcher = process.launcher
        state.cgroup = process.cgroup
        state.keepsProcess = true
        state.resumed = (startNs > process.suspendedAtNs ? startNs - process.suspendedAtNs : 0, process.launches + 1)
        var start = assignment(plan, cgroup: process.cgroup, groups: [], identity: nil)
        start.expiresAtNs = startNs + UInt64((plan.expireAfter ?? plan.limits.budget).nanoseconds)
        start.backgroundRefreshStatus = plan.backgroundRefreshStatus
        start.reason = plan.reason.rawValue
        start.suspendable = true
        process.cgroup?.freeze(false)
        kill(-process.pid, SIGCONT)
        kill(process.pid, SIGCONT)
        // Never blocking: a suspended process's channel holds nothing of the host's, and one
        // that cannot take the launch now is not waited for.
        if !LaunchLoop.trySend(ParentMessage.resume(start), on: process.channel) {
            state.end(.crashed, error: "could not send the launch to the app's suspended process: \(String(cString: strerror(errno)))")
            state.killed = .crashed
            Self.terminate(process.pid, cgroup: process.cgroup)
        }
        control?.onStart?(process.pid)
        logger.debug("launch resumed a suspended process", metadata: ["tasks": "\(plan.tasks.map(\.identifier))"])
        let loop = LaunchLoop(pid: process.pid, channel: process.channel, plan: plan, broker: prepared.broker, control: control,
                              logger: logger, supervisor: self, state: state)
        let ending = SupervisedLaunch.Ending(
            key: process.key, apps: apps, launches: process.launches + 1, cpuAtStartNs: process.cpuNs, startedAt: startedAt,
            refusedGroups: prepared.refusedGroups, resumed: true)
        supervise(SupervisedLaunch(supervisor: self, logger: logger, pid: process.pid, channel: process.channel, cgroup: process.cgroup,
                                   loop: loop, state: state, ending: ending, completion: prepared.completion))
    }

    /// On a worker, once the launch's loop is over: the process suspended when its work is
    /// over and it stays, else reaped; the record.
    func conclude(_ launch: SupervisedLaunch) -> RunRecord {
        let plan = launch.loop.plan, pid = launch.pid, ending = launch.ending, log = launch.state.log
        if let key = ending.key, let apps = ending.apps,
           let record = suspendIfOver(&launch.loop, &launch.state, pid: pid, channel: launch.channel, log: log, cgroup: launch.cgroup,
                                      plan: plan, key: key, launches: ending.launches, cpuAtStartNs: ending.cpuAtStartNs,
                                      startedAt: ending.startedAt, refusedGroups: ending.refusedGroups, apps: apps, logger: launch.logger) {
            return record
        }
        ending.apps?.ended(plan.bundle.identifier)
        defer {
            launch.channel.close()
            launch.cgroup?.remove()
        }
        // A process that went idle and is not kept after all (its launch was ended by garbage
        // or a crash report after it said so) is ended before the reap waits for it.
        if bgtask_has_exited(pid) == 0 { Self.terminate(pid, cgroup: launch.cgroup) }
        let (status, usage, endNs) = reap(pid, cgroup: launch.cgroup, &launch.loop, &launch.state, log: log, exitedAtNs: launch.exitedAtNs)
        var record: RunRecord
        if ending.resumed {
            // rusage covers the process's whole life: this launch's CPU is what it used since it resumed.
            let cpuNs = UInt64(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1_000_000_000 + UInt64(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000
            record = launch.state.record(status: status, usage: Self.usage(cpuNs: cpuNs > ending.cpuAtStartNs ? cpuNs - ending.cpuAtStartNs : 0),
                                         pid: pid, wallNs: endNs - launch.state.startNs, startedAt: ending.startedAt)
        } else {
            record = launch.state.record(status: status, usage: usage, pid: pid, wallNs: endNs - launch.state.startNs, startedAt: ending.startedAt)
            // A runner that died before it could report (its namespace, its channel) said why on
            // its stderr, the launch log: the record carries those words, not only a status.
            if record.termination == .launchFailed, let error = record.error, error.hasSuffix("before loading the plugin"),
               let said = Self.lastRunnerLine(log.path) {
                record.error = error + " (it said: \(said))"
            }
        }
        finish(&record, launch.state, plan: plan, log: log, cgroup: launch.cgroup, refusedGroups: ending.refusedGroups, logger: launch.logger)
        return record
    }

    /// After a launch's loop: when its work is over and its process stays (`idle`), the process
    /// is suspended (its group stopped, its cgroup frozen, what it started killed) and put in
    /// `apps`, and the launch's record is returned (termination `suspended`). Nil when the
    /// process does not stay (it exited, was killed, or the host is stopping): the caller reaps it.
    func suspendIfOver(_ loop: inout LaunchLoop, _ state: inout LaunchState, pid: pid_t, channel: LaunchChannel, log: LaunchLog,
                               cgroup: CgroupV2.LaunchGroup?, plan: LaunchPlan, key: SuspendedApp.Key, launches: Int, cpuAtStartNs: UInt64,
                               startedAt: Date, refusedGroups: [String: String], apps: SuspendedApps, logger: Logger) -> RunRecord? {
        // Not with answers of the host's still unsent or calls unanswered (an app that sent
        // calls after it said it was over, or stopped reading): they would wait in a loop's
        // outbox that no longer exists while the app sleeps; it ends instead.
        guard state.idleNs != nil, state.killed == nil, state.forcedTermination == nil, !loop.wantsToWrite, loop.calls.isEmpty else { return nil }
        let endNs = bgtask_monotonic_ns()
        kill(-pid, SIGSTOP)
        kill(pid, SIGSTOP)
        cgroup?.freeze(true)
        // Nothing the launch started outlives its launch (the runner killed them before it said
        // `idle`; a forged one would leave them running while the app sleeps).
        let app = ProcessTree.appProcess(of: pid) ?? pid
        for descendant in ProcessTree.descendants(of: app) { Glibc.kill(descendant, SIGKILL) }
        guard bgtask_has_exited(pid) == 0 else { return nil }
        log.drain()
        loop.drain(&state)
        log.finish()
        // The process's CPU so far: /proc's figure is in 10 ms ticks; the app's own (getrusage,
        // microseconds) is taken when it is not less, so a short launch is not recorded as 0.
        let ticks = ProcessTree.cpuNanoseconds(of: app) ?? cpuAtStartNs
        let cpuNs = max(ticks, state.reportedCPUNs ?? 0)
        let unique = ProcessTree.uniqueBytes(ofProcess: app)
        state.suspendedAfter = true
        state.peakRSS = max(state.peakRSS, ProcessTree.residentBytes(ofProcess: app))
        var record = state.record(status: 0, usage: Self.usage(cpuNs: cpuNs > cpuAtStartNs ? cpuNs - cpuAtStartNs : 0), pid: pid,
                                  wallNs: endNs - state.startNs, startedAt: startedAt)
        finish(&record, state, plan: plan, log: log, cgroup: cgroup, refusedGroups: refusedGroups, logger: logger)
        let process = SuspendedApp(
            app: plan.bundle.identifier, pid: pid, appPID: app, channel: channel, logReadEnd: log.detachReadEnd(), cgroup: cgroup,
            sandbox: state.sandbox, launcher: state.launcher, key: key, launches: launches, suspendedAtNs: bgtask_monotonic_ns(),
            suspendedAt: Date(), residentBytes: unique, lastLaunchID: plan.launchID, cpuNs: cpuNs, hearsResumes: state.hearsResumes)
        if !apps.suspend(process) {
            // The host is stopping: the process ends instead, its launch over all the same.
            apps.endUnkept(process)
            record.termination = .exited
        }
        logger.debug("its process is suspended", metadata: ["unique.bytes": "\(unique)"])
        return record
    }

    /// A `rusage` that says only `cpuNs` of CPU time (user), for records of kept processes,
    /// which are not reaped.
    static func usage(cpuNs: UInt64) -> rusage {
        var usage = rusage()
        usage.ru_utime.tv_sec = Int(cpuNs / 1_000_000_000)
        usage.ru_utime.tv_usec = Int(cpuNs % 1_000_000_000 / 1000)
        return usage
    }

    /// The last line the runner wrote to the launch log (its own `bgtask-runner:` words, up to
    /// 512 bytes read from the file's end), or nil. Only for a launch that failed before it
    /// loaded the plugin: no app code has written there.
    static func lastRunnerLine(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_size > 0 else { return nil }
        let length = min(Int(info.st_size), 512)
        var bytes = [UInt8](repeating: 0, count: length)
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, length, off_t(info.st_size) - off_t(length)) }
        guard count > 0 else { return nil }
        let line = String(decoding: bytes[..<count], as: UTF8.self).split(separator: "\n").last.map(String.init)
        guard let line, line.hasPrefix("bgtask-runner:") else { return nil }
        return line
    }

    /// The record's `disk`: the app's use against its quota, how it is enforced, and a log lost.
    static func diskRecord(_ plan: LaunchPlan, use: DiskUse?, exceeded: String?, logError: String?) -> RunRecord.DiskRecord {
        let quota = plan.limits.diskQuota
        return RunRecord.DiskRecord(
            bytes: use?.bytes, inodes: use?.inodes, quotaBytes: quota.bytes, quotaInodes: quota.inodes,
            enforcement: quota.isOn ? ProjectQuotas.cachedEnforcement(plan.dataDirectory.deletingLastPathComponent().path) : nil,
            exceeded: exceeded, logError: logError)
    }

    /// The app's container laid out as on iOS (its HOME), the containers of the app groups it
    /// is granted (`AppGroupOwners`: the group's owner, its extensions, the operator's grant;
    /// the rest refused, with why) and the log directory; the identity the launch runs as.
    /// Paths as strings once (URL operations are a measurable part of a short launch).
    private func prepareContainers(_ plan: LaunchPlan) throws(BGTaskError) -> (groups: [AppGroup], refused: [String: String], identity: LaunchIdentity?) {
        let dataPath = plan.dataDirectory.path
        let logPath = plan.logFile.path
        let made = try prepareContainer(dataPath, subdirectories: AppContainer.directories)
        let decision = try AppGroupOwners(stateDirectory: plan.groupsDirectory.deletingLastPathComponent())
            .decide(app: plan.bundle.containingApp ?? plan.bundle.identifier, groups: plan.bundle.appGroups, claim: true)
        let groups = try decision.granted.map { identifier throws(BGTaskError) in
            let directory = AppContainer.groupDirectory(root: plan.groupsDirectory.path, identifier: identifier)
            _ = try prepareContainer(directory, subdirectories: AppContainer.groupDirectories)
            return AppGroup(identifier: identifier, directory: directory)
        }
        try makeDirectories(logPath.lastIndex(of: "/").map { String(logPath[..<$0]) } ?? ".")
        let identity = try identity(for: plan, container: dataPath, groups: groups)
        // A directory the app had removed and the host made again is the host's (root's): the
        // app's again, or it could not write its own Caches. (A new container is given whole.)
        if let identity { for path in made { lchown(path, identity.uid, identity.gid) } }
        return (groups, decision.refused, identity)
    }

    /// What a prepared container looked like: its directory's and its Library's identity and
    /// modification time. Every directory a container must have lives in one of the two (see
    /// `AppContainer.directories`), so while neither changed, none was removed or replaced.
    struct ContainerStamp: Equatable {
        var root: [Int]
        var library: [Int]

        init?(_ path: String) {
            func read(_ path: String) -> [Int]? {
                var info = stat()
                guard fstatat(AT_FDCWD, path, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFDIR else { return nil }
                return [Int(info.st_dev), Int(info.st_ino), info.st_mtim.tv_sec, info.st_mtim.tv_nsec]
            }
            guard let root = read(path), let library = read(path + "/Library") else { return nil }
            (self.root, self.library) = (root, library)
        }
    }

    /// Containers as this process last prepared them, by path: one unchanged since is not made
    /// again (two stat calls instead of a score of opens and mkdirs before every launch).
    static let preparedContainers = LockedValue([String: ContainerStamp]())

    /// What a launch's environment changes over the host's own.
    private func environment(_ plan: LaunchPlan) -> [String: String] {
        var overrides = AppContainer.environment(container: plan.dataDirectory.path)
        overrides["BGTASK_LAUNCH_ID"] = plan.launchID
        overrides["BGTASK_BUNDLE_ID"] = plan.bundle.identifier
        if getenv("SWIFT_BACKTRACE") == nil { overrides["SWIFT_BACKTRACE"] = "enable=no" }
        for (key, value) in plan.environment { overrides[key] = value }
        if !confine { overrides[AppContainer.pidNamespaceSwitch] = "off" }
        if confine && !sandboxFailsClosed { overrides[AppContainer.sandboxModeVariable] = SandboxMode.bestEffort.rawValue }
        return overrides
    }

    /// Starts the launch's runner: forked from the zygote (the fast path), or spawned when the
    /// zygote cannot serve. Its pid, and whether it was forked; it is in `activeRunners` before
    /// anyone may look for orphans.
    private func startRunner(_ plan: LaunchPlan, channel: Int32, stdin: Int32, log: Int32,
                             metadata: Logger.Metadata) -> Result<(pid: pid_t, forked: Bool), BGTaskError> {
        let overrides = environment(plan)
        return Self.spawnLock.withLock {
            if let zygote {
                do {
                    let pid = try zygote.launch(channel: channel, stdin: stdin, log: log, environment: overrides)
                    _ = Self.activeRunners.withLock { $0.insert(pid) }
                    return .success((pid, true))
                } catch {
                    logger.warning("zygote unavailable; spawning the runner instead", metadata: metadata.merging(["error": "\(error)"]) { $1 })
                }
            }
            var environment = ProcessInfo.processInfo.environment
            for (key, value) in overrides { environment[key] = value }
            do {
                let pid = try Subprocess.spawn([runnerPath, plan.bundle.identifier], environment: environment,
                                               stdin: stdin, stdout: log, stderr: log, descriptor3: channel)
                _ = Self.activeRunners.withLock { $0.insert(pid) }
                return .success((pid, false))
            } catch let error as SystemError {
                return .failure(BGTaskError(.launch, file: runnerPath, errno: error.errno, "cannot spawn the runner"))
            } catch {
                return .failure(BGTaskError(.launch, file: runnerPath, "cannot spawn the runner: \(error)"))
            }
        }
    }

    /// The launch's cgroup under `root` with `pid` in it, or nil (logged) when it cannot be had:
    /// memory is then sampled, and there is no process limit.
    private func launchGroup(under root: URL, for pid: pid_t, plan: LaunchPlan) -> CgroupV2.LaunchGroup? {
        do {
            let group = try CgroupV2.LaunchGroup.create(
                under: root, launchID: plan.launchID,
                memoryMax: plan.limits.memoryLimitBytes > 0 ? plan.limits.memoryLimitBytes : nil, processMax: processLimit)
            Self.reportOnce(group.fallbacks, logger: logger)
            do {
                try group.add(pid)
                return group
            } catch {
                group.remove()
                throw error
            }
        } catch {
            logger.warning("launch cgroup unavailable: memory is sampled, no process limit", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// After the runner `pid` was reaped: what its cgroup saw, and whatever the plugin left
    /// behind dies with the launch: its process group, and every orphan re-parented to this
    /// process (setsid cannot escape a subreaper).
    private func cleanUp(after pid: pid_t, cgroup: CgroupV2.LaunchGroup?, _ state: inout LaunchState) {
        _ = Self.activeRunners.withLock { $0.remove(pid) }
        if let cgroup {
            if cgroup.oomKills > 0, state.killed == nil { state.killed = .jetsam }
            state.peakRSS = max(state.peakRSS, cgroup.peakBytes ?? 0)
            cgroup.killAll()
        }
        kill(-pid, SIGKILL)
        // A runner that ended its launch itself and never had a child left nothing to find
        // (its orphans would have been its children: it is their subreaper).
        if !state.finished || state.hadDescendants || state.killed != nil {
            Self.reapOrphans(sparing: zygote?.processes ?? [], launchGroup: pid)
        }
    }

    /// What the runner is told about its launch. Without a cgroup, an `RLIMIT_DATA` backstop
    /// well above the limit catches a runaway between two samples.
    private func assignment(_ plan: LaunchPlan, cgroup: CgroupV2.LaunchGroup?, groups: [AppGroup], identity: LaunchIdentity?) -> LaunchAssignment {
        LaunchAssignment(
            launchID: plan.launchID, role: plan.role, bundleIdentifier: plan.bundle.identifier,
            bundlePath: plan.bundle.url.path, executablePath: plan.bundle.executableURL.path,
            dataDirectory: plan.dataDirectory.path, permittedIdentifiers: plan.bundle.permittedIdentifiers,
            tasks: plan.tasks, mappedHandlers: plan.bundle.mappedHandlers, eventJSON: plan.eventJSON,
            supportedResources: plan.supportedResources,
            memoryBackstopBytes: cgroup == nil && plan.limits.memoryLimitBytes > 0
                ? max(plan.limits.memoryLimitBytes * 4, plan.limits.memoryLimitBytes + (2 << 30)) : nil,
            appGroups: groups, confine: confine, identity: identity,
            processLimit: identity == nil ? nil : processLimit.map { UInt32(clamping: $0) })
    }

    /// The uid, gid and groups the launch runs as, with its container and its groups'
    /// containers given to them; nil unless the host may choose (it is root and confines).
    private func identity(for plan: LaunchPlan, container: String, groups: [AppGroup]) throws(BGTaskError) -> LaunchIdentity? {
        guard let identities, confine else { return nil }
        // The app's uid must reach its container through the state directory: traverse (x),
        // never list or read, for others; what is in it stays owner-only.
        let containers = (container as NSString).deletingLastPathComponent
        AppIdentities.allowTraversal([(containers as NSString).deletingLastPathComponent, containers, plan.groupsDirectory.path])
        let uid = try identities.uid(forApp: plan.bundle.containingApp ?? plan.bundle.identifier)
        AppIdentities.giveContainer(container, uid: uid, gid: uid)
        var gids: [UInt32] = []
        for group in groups {
            let gid = try identities.gid(forGroup: group.identifier)
            AppIdentities.giveGroupContainer(group.directory, subdirectories: AppContainer.groupDirectories, gid: gid)
            gids.append(gid)
        }
        return LaunchIdentity(uid: uid, gid: uid, groups: gids)
    }

    /// Makes `path` and its `subdirectories` (relative, parents first), never through a link:
    /// the container is the app's, and an app that swapped its `Library` for a symbolic link
    /// to /etc must not make the host (root) create `/etc/Caches`. Each directory is reached
    /// from its parent's descriptor with O_NOFOLLOW and made with mkdirat; a link, or anything
    /// but a directory, where one is expected is left alone (the app broke its own layout).
    /// A few system calls each: this runs before every launch, unless the container is as this
    /// process last left it (`preparedContainers`). Returns the directories it made.
    private func prepareContainer(_ path: String, subdirectories: [String]) throws(BGTaskError) -> [String] {
        let stamp = ContainerStamp(path)
        if let stamp, Self.preparedContainers.withLock({ $0[path] == stamp }) { return [] }
        var made: [String] = []
        if mkdir(path, 0o755) == 0 { made.append(path) } else { try makeDirectories(path) }
        let root = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard root >= 0 else {
            throw BGTaskError(.system, file: path, errno: errno, "the app container is not a directory (a symbolic link is refused)")
        }
        defer { close(root) }
        for subdirectory in subdirectories {
            let parts = subdirectory.split(separator: "/").map(String.init)
            var parent = root
            var opened: [Int32] = []
            defer { opened.forEach { close($0) } }
            for part in parts.dropLast() {
                let fd = openat(parent, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                guard fd >= 0 else { break }
                opened.append(fd)
                parent = fd
            }
            guard opened.count == parts.count - 1, let name = parts.last else { continue }
            if mkdirat(parent, name, 0o755) == 0 {
                made.append(path + "/" + subdirectory)
            } else if errno != EEXIST {
                throw BGTaskError(.system, file: path + "/" + subdirectory, errno: errno, "cannot create the app container's directory")
            }
        }
        // Remembered once made (a failure above is tried again at the next launch).
        let prepared = ContainerStamp(path)
        Self.preparedContainers.withLock { $0[path] = prepared }
        return made
    }


    /// Kills the launch: its process group (or its cgroup), in one syscall.
    ///
    /// What left the group (setsid) is not looked for here: when the runner dies, it is
    /// re-parented to this process (a child subreaper) and killed as an orphan once the runner
    /// is reaped (`reapOrphans`). A walk of the runner's threads while they die would make the
    /// runner's reap spin in the kernel for milliseconds (the /proc entries the walk creates;
    /// see docs/decisions/no-proc-on-the-launch-path.md), and the watchdog's kill is measured to the reap.
    static func terminate(_ pid: pid_t, cgroup: CgroupV2.LaunchGroup?) {
        cgroup?.killAll()
        kill(-pid, SIGKILL)
        // The runner by pid too: a child the zygote forked a moment ago may not have made its
        // process group yet, and the group kill would miss it.
        kill(pid, SIGKILL)
    }

}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
    var milliseconds: Double { Double(nanoseconds) / 1_000_000 }
    /// In seconds, for Date and Dispatch arithmetic.
    public var timeInterval: TimeInterval { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

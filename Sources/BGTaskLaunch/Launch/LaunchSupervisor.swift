import BGTaskControl
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
    package var suspendedApps: SuspendedApps?
    /// Launches are supervised on the shared loops (`SupervisionLoops`); false: each on a thread
    /// of its own (`SupervisedLaunch.superviseAlone`, the loops' plain reference, which the
    /// host falls back to when the kernel refuses an epoll set; tests compare the two).
    package var onLoops = true
    /// Soft deadlines (memory samples, disk looks) more than 20 ms away on a shared 5 ms grid
    /// (`LaunchLoop.nextWake`); false: each exactly when asked, the grid's plain reference.
    package var coalescesSoftDeadlines = true

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
    package static let workers = WorkerPool(name: "bgtask.launch", size: 4)
    /// The threads that answer launches' calls (submit, pending, notifications, transfers):
    /// they wait on the store and the host's queue, which the loops must never do.
    package static let brokers = WorkerPool(name: "bgtask.broker", size: 4)
    /// The threads that walk launches' containers for their disk quota and the disk reserve (a
    /// container of a million files takes about a second): never a loop, and not the workers
    /// that start and end launches.
    package static let walkers = WorkerPool(name: "bgtask.walk", size: 2)

    /// On a worker: everything a launch needs before its process exists; then, once the host
    /// has recorded it (`LaunchControl.whenAdmitted`), its process is started or resumed.
    package func prepare(_ plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?, completion: @escaping Completion) throws(BGTaskError) {
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
    package final class Prepared: @unchecked Sendable {
        package let plan: LaunchPlan
        package let broker: LaunchRequestBroker
        package let control: LaunchControl?
        package let completion: Completion
        package let log: LaunchLog
        package let refusedGroups: [String: String]
        package let diskUseAtStart: DiskUse?
        package var fresh: FreshProcess?

        package init(plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?, completion: @escaping Completion, log: LaunchLog,
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

    package struct FreshProcess {
        package var channels: (parent: LaunchChannel, child: LaunchChannel)
        package var groups: [AppGroup]
        package var identity: LaunchIdentity?
        package var keeps: Bool
        package var key: SuspendedApp.Key?
        package var previous: AppProcessEviction?

        /// The memberwise initializer, for the modules above this one.
        package init(channels: (parent: LaunchChannel, child: LaunchChannel), groups: [AppGroup], identity: LaunchIdentity? = nil, keeps: Bool, key: SuspendedApp.Key? = nil, previous: AppProcessEviction? = nil) {
            self.channels = channels
            self.groups = groups
            self.identity = identity
            self.keeps = keeps
            self.key = key
            self.previous = previous
        }
    }

    /// `body` once the host has recorded the launch: at once on this thread when it has (or
    /// needs no admission), else on a worker when it does.
    package static func whenAdmitted(_ control: LaunchControl?, _ body: @escaping @Sendable (Bool) -> Void) {
        guard let control else { return body(true) }
        if let allowed = control.admission(orWhenKnown: { allowed in workers.run { body(allowed) } }) { body(allowed) }
    }

    /// On a worker, once admitted: the runner started (forked from the zygote, or spawned), told
    /// its launch, and handed to a supervision loop.
    package func spawn(_ prepared: Prepared, allowed: Bool) throws(BGTaskError) {
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
            start.thermalState = plan.thermalState
            start.lowPowerMode = plan.lowPowerMode
            start.metricsJSON = plan.metricsJSON
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
    package func supervise(_ launch: SupervisedLaunch) {
        if onLoops, let loop = SupervisionLoops.next() {
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
    package func reap(_ pid: pid_t, cgroup: CgroupV2.LaunchGroup?, _ loop: inout LaunchLoop, _ state: inout LaunchState,
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
    package func finish(_ record: inout RunRecord, _ state: LaunchState, plan: LaunchPlan, log: LaunchLog,
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
    package func resume(_ process: SuspendedApp, _ prepared: Prepared, allowed: Bool, apps: SuspendedApps) {
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
        state.energyAtStart = process.energy
        state.traffic = process.traffic
        var start = assignment(plan, cgroup: process.cgroup, groups: [], identity: nil)
        start.expiresAtNs = startNs + UInt64((plan.expireAfter ?? plan.limits.budget).nanoseconds)
        start.backgroundRefreshStatus = plan.backgroundRefreshStatus
        start.thermalState = plan.thermalState
        start.lowPowerMode = plan.lowPowerMode
        start.metricsJSON = plan.metricsJSON
        start.reason = plan.reason.rawValue
        start.suspendable = true
        // The launch is in the channel before the process runs again, so its reader finds it as
        // it wakes. Continued first, the two SIGCONTs (about 65 µs of this thread, traced over
        // `bgtask-bench --only e2e`: every thread of the app is woken) let the app's threads run
        // on the other core while the message was not yet there. Never blocking: a suspended
        // process's channel holds nothing of the host's, and one that cannot take the launch
        // now is not waited for (the process is killed, still stopped).
        if !LaunchLoop.trySend(ParentMessage.resume(start), on: process.channel) {
            state.end(.crashed, error: "could not send the launch to the app's suspended process: \(String(cString: strerror(errno)))")
            state.killed = .crashed
            Self.terminate(process.pid, cgroup: process.cgroup)
        }
        process.cgroup?.freeze(false)
        kill(-process.pid, SIGCONT)
        kill(process.pid, SIGCONT)
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
    package func conclude(_ launch: SupervisedLaunch) -> RunRecord {
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
        if bgtask_has_exited(pid) == 0 {
            launch.loop.lookBeforeKill(&launch.state)
            Self.terminate(pid, cgroup: launch.cgroup)
        }
        let (status, usage, endNs) = reap(pid, cgroup: launch.cgroup, &launch.loop, &launch.state, log: log, exitedAtNs: launch.exitedAtNs)
        // rusage covers the process's whole life and the children it reaped. A killed launch's
        // app process in its PID namespace dies with the namespace, unreaped by the runner: what
        // it used is what the last look before the kill saw. A resumed launch counts from its resume.
        var cpuNs = UInt64(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1_000_000_000 + UInt64(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000
        var energy = EnergyCounters(usage: usage)
        if let look = launch.state.lookBeforeKill {
            cpuNs = max(cpuNs, look.cpuNs ?? 0)
            if let counters = look.energy { energy = energy.atLeast(counters) }
        }
        launch.state.energy = energy.since(launch.state.energyAtStart)
        var record: RunRecord
        if ending.resumed || launch.state.lookBeforeKill != nil {
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
    package func suspendIfOver(_ loop: inout LaunchLoop, _ state: inout LaunchState, pid: pid_t, channel: LaunchChannel, log: LaunchLog,
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
        // The app's word refines the ticks, never more than by their rounding (50 ms): a figure
        // far above them would be the baseline of every later launch of the process, each then
        // recorded (and summed into its day's energy) as using nothing.
        let cpuNs = max(ticks, min(state.reportedCPUNs ?? 0, ticks + 50_000_000))
        // Counted by its resident memory until its private memory is wanted (see
        // `SuspendedApp.residentMeasured`).
        let resident = ProcessTree.residentBytes(ofProcess: app)
        // Storage from /proc (the kernel's word, one file); wake-ups the app's own count of all its
        // threads (getrusage: no /proc file sums them), never below its main thread's.
        var energy = EnergyCounters.of(app, allThreads: false) ?? state.energyAtStart
        energy.wakeups = max(energy.wakeups, state.reportedWakeups ?? 0)
        state.energy = energy.since(state.energyAtStart)
        state.suspendedAfter = true
        state.peakRSS = max(state.peakRSS, resident)
        var record = state.record(status: 0, usage: Self.usage(cpuNs: cpuNs > cpuAtStartNs ? cpuNs - cpuAtStartNs : 0), pid: pid,
                                  wallNs: endNs - state.startNs, startedAt: startedAt)
        finish(&record, state, plan: plan, log: log, cgroup: cgroup, refusedGroups: refusedGroups, logger: logger)
        var process = SuspendedApp(
            app: plan.bundle.identifier, pid: pid, appPID: app, channel: channel, logReadEnd: log.detachReadEnd(), cgroup: cgroup,
            sandbox: state.sandbox, launcher: state.launcher, key: key, launches: launches, suspendedAtNs: bgtask_monotonic_ns(),
            suspendedAt: Date(), residentBytes: resident, residentMeasured: false, lastLaunchID: plan.launchID, cpuNs: cpuNs, hearsResumes: state.hearsResumes)
        process.energy = energy
        process.traffic = state.traffic.continued()
        if !apps.suspend(process) {
            // The host is stopping: the process ends instead, its launch over all the same.
            apps.endUnkept(process)
            record.termination = .exited
        }
        logger.debug("its process is suspended", metadata: ["resident.bytes": "\(resident)"])
        return record
    }

}

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
    /// How often resident memory is sampled when a memory limit is set (sampler mechanism).
    public var memorySampleInterval: Duration = .milliseconds(5)
    /// How often the sampler looks for processes the launch started; between looks it reads
    /// the runner's and the known descendants' resident memory only. Each look asks the runner
    /// first (`probeChildren`, answered with waitid) and walks /proc/RUNNER/task/*/children only
    /// when it has a child, or did not answer the previous probe: the /proc entries a walk
    /// creates under a runner make its reap spin in the kernel for up to milliseconds (see
    /// docs/benchmark-history.md), a cost a launch that starts no process should not pay. The first look
    /// comes this long after the launch starts; a descendant that races ahead of it still
    /// meets the runner's RLIMIT_DATA backstop.
    public var descendantSampleInterval: Duration = .milliseconds(20)
    /// How often the sampler walks a launch's tree whatever the runner answers to the probe (a
    /// forged "no child" hides a child for at most this long).
    public var descendantCheckInterval: Duration = .milliseconds(100)
    /// Confine every launch (Landlock, seccomp-bpf, no_new_privs; see the runner's Sandbox).
    /// Off only for debugging: records then say each layer is off.
    public var confine = true
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

    public func run(_ plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl? = nil) throws(BGTaskError) -> RunRecord {
        var logger = logger
        // Set on the logger in one assignment once the pid is known: a log handler may redo its
        // work on every metadata change (swift-log's StreamLogHandler prettifies all of it).
        var launchMetadata: Logger.Metadata = ["launch.id": "\(plan.launchID)", "bundle.id": "\(plan.bundle.identifier)"]

        guard access(runnerPath, X_OK) == 0 else {
            throw BGTaskError(.launch, file: runnerPath, "the bgtask-runner executable is missing or not executable (set BGTASK_RUNNER)")
        }
        // The app's container laid out as on iOS (its HOME), its app groups' containers and the
        // log directory. Paths as strings once (URL operations are a measurable part of a short
        // launch).
        let dataPath = plan.dataDirectory.path
        let logPath = plan.logFile.path
        try prepareContainer(dataPath, subdirectories: AppContainer.directories)
        let groups = try plan.bundle.appGroups.map { identifier throws(BGTaskError) in
            let directory = AppContainer.groupDirectory(root: plan.groupsDirectory.path, identifier: identifier)
            try prepareContainer(directory, subdirectories: AppContainer.groupDirectories)
            return AppGroup(identifier: identifier, directory: directory)
        }
        try makeDirectories(logPath.lastIndex(of: "/").map { String(logPath[..<$0]) } ?? ".")
        let identity = try identity(for: plan, container: dataPath, groups: groups)

        let channels: (parent: LaunchChannel, child: LaunchChannel)
        do { channels = try LaunchChannel.makePair() } catch {
            throw BGTaskError(.system, "\(error)")
        }
        defer { channels.parent.close() }
        var childEndOpen = true
        defer { if childEndOpen { channels.child.close() } }
        // The child's stdout and stderr: a pipe into the launch log (see LaunchLog).
        let log = try LaunchLog(path: logPath, limit: plan.limits.logLimitBytes)
        let nullFD = try syscall("open /dev/null") { open("/dev/null", O_RDONLY | O_CLOEXEC) }
        defer { close(nullFD) }

        // What a launch's environment changes over the host's own.
        var overrides = AppContainer.environment(container: dataPath)
        overrides["BGTASK_LAUNCH_ID"] = plan.launchID
        overrides["BGTASK_BUNDLE_ID"] = plan.bundle.identifier
        if getenv("SWIFT_BACKTRACE") == nil { overrides["SWIFT_BACKTRACE"] = "enable=no" }
        for (key, value) in plan.environment { overrides[key] = value }
        if !confine { overrides[AppContainer.pidNamespaceSwitch] = "off" }

        // Orphans of a launch (a plugin's grandchildren whose parents died) come back to this
        // process instead of init, so they can be found and killed.
        _ = bgtask_set_child_subreaper()
        let startNs = bgtask_monotonic_ns()
        let startedAt = Date()
        // The launch, written into the channel before the child exists when no cgroup has to
        // take the child first: the runner finds it waiting instead of asking for it.
        let startFirst = cgroupRoot == nil
        func sendStart(_ cgroup: CgroupV2.LaunchGroup?) -> String? {
            do { try channels.parent.send(ParentMessage.start(assignment(plan, cgroup: cgroup, groups: groups, identity: identity))) } catch { return "\(error)" }
            return nil
        }
        var startError = startFirst ? sendStart(nil) : nil
        Self.spawnLock.lock()
        var pid: pid_t = 0
        var spawnError: Int32 = 0
        var forked = false
        if let zygote {
            do {
                pid = try zygote.launch(channel: channels.child.fd, stdin: nullFD, log: log.childEnd, environment: overrides)
                forked = true
            } catch {
                logger.warning("zygote unavailable; spawning the runner instead", metadata: launchMetadata.merging(["error": "\(error)"]) { $1 })
            }
        }
        if !forked {
            var environment = ProcessInfo.processInfo.environment
            for (key, value) in overrides { environment[key] = value }
            do {
                pid = try Subprocess.spawn([runnerPath, plan.bundle.identifier], environment: environment,
                                           stdin: nullFD, stdout: log.childEnd, stderr: log.childEnd, descriptor3: channels.child.fd)
            } catch {
                spawnError = error.errno
            }
        }
        if spawnError == 0 { _ = Self.activeRunners.withLock { $0.insert(pid) } }
        Self.spawnLock.unlock()
        channels.child.close()
        childEndOpen = false
        log.closeChildEnd()
        guard spawnError == 0 else {
            throw BGTaskError(.launch, file: runnerPath, errno: spawnError, "cannot spawn the runner")
        }
        launchMetadata["child.pid"] = "\(pid)"
        logger.handler.metadata.merge(launchMetadata) { $1 }
        // The runner waits for its launch before loading anything, so every plugin process
        // starts inside the launch's cgroup.
        var cgroup: CgroupV2.LaunchGroup?
        if let root = cgroupRoot {
            do {
                let group = try CgroupV2.LaunchGroup.create(
                    under: root, launchID: plan.launchID,
                    memoryMax: plan.limits.memoryLimitBytes > 0 ? plan.limits.memoryLimitBytes : nil, processMax: processLimit)
                Self.reportOnce(group.fallbacks, logger: logger)
                do {
                    try group.add(pid)
                    cgroup = group
                } catch {
                    group.remove()
                    throw error
                }
            } catch {
                logger.warning("launch cgroup unavailable: memory is sampled, no process limit", metadata: ["error": "\(error)"])
            }
        }
        defer { cgroup?.remove() }
        logger.debug("launch started", metadata: ["tasks": "\(plan.tasks.map(\.identifier))"])

        var state = LaunchState(plan: plan, startNs: startNs, log: log)
        state.launcher = forked ? "zygote" : "spawn"
        state.cgroup = cgroup
        if !startFirst { startError = sendStart(cgroup) }
        if let startError {
            logger.error("could not send the launch to its runner", metadata: ["error": "\(startError)"])
            // Without its launch the runner would wait for it until the budget ends.
            state.end(.launchFailed, error: "could not send the launch to the runner: \(startError)")
            state.killed = .launchFailed
            Self.terminate(pid, cgroup: cgroup)
        }

        control?.onStart?(pid)
        supervise(pid: pid, channel: channels.parent, plan: plan, broker: broker, control: control, state: &state, logger: logger)

        var status: Int32 = 0
        var usage = rusage()
        _ = try? syscall("wait4") { bgtask_wait4(pid, &status, 0, &usage) }
        // The launch ends when its child is reaped; cleaning up after it is the host's time.
        let endNs = bgtask_monotonic_ns()
        _ = Self.activeRunners.withLock { $0.remove(pid) }
        if let cgroup {
            if cgroup.oomKills > 0, state.killed == nil { state.killed = .jetsam }
            state.peakRSS = max(state.peakRSS, cgroup.peakBytes ?? 0)
            cgroup.killAll()
        }
        // Whatever the plugin left behind dies with the launch: its process group, and every
        // orphan re-parented to this process (setsid cannot escape a subreaper).
        kill(-pid, SIGKILL)
        // A runner that ended its launch itself and never had a child left nothing to find
        // (its orphans would have been its children: it is their subreaper).
        if !state.finished || state.hadDescendants || state.killed != nil {
            Self.reapOrphans(sparing: zygote?.processes ?? [], launchGroup: pid)
        }
        // What the launch wrote before it ended, then what it said on its channel.
        log.drain(budget: LaunchLog.finalDrainBytes)
        drain(channel: channels.parent, plan: plan, broker: broker, control: control, state: &state)

        var record = state.record(
            status: status, usage: usage, pid: pid, wallNs: endNs - startNs, startedAt: startedAt)
        record.processLimit = cgroup?.processLimit
        logger.debug("launch ended", metadata: ["termination": "\(record.termination.rawValue)"])
        return record
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
    /// A few system calls each: this runs before every launch.
    private func prepareContainer(_ path: String, subdirectories: [String]) throws(BGTaskError) {
        if mkdir(path, 0o755) != 0 { try makeDirectories(path) }
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
            if mkdirat(parent, name, 0o755) != 0 && errno != EEXIST {
                throw BGTaskError(.system, file: path + "/" + subdirectory, errno: errno, "cannot create the app container's directory")
            }
        }
    }

    // MARK: The loop

    private func supervise(
        pid: pid_t, channel: LaunchChannel, plan: LaunchPlan, broker: LaunchRequestBroker,
        control: LaunchControl?, state: inout LaunchState, logger: Logger
    ) {
        let pidfd = bgtask_pidfd_open(pid)
        defer { if pidfd >= 0 { close(pidfd) } }
        let expireAt = state.startNs + UInt64((plan.expireAfter ?? plan.limits.budget).nanoseconds)
        var killAt: UInt64?
        var channelOpen = true
        var channelClosedAt: UInt64?
        var memory = MemorySampler(
            limit: plan.limits.memoryLimitBytes, startNs: state.startNs, sampleInterval: UInt64(memorySampleInterval.nanoseconds),
            descendantInterval: UInt64(descendantSampleInterval.nanoseconds), checkInterval: UInt64(descendantCheckInterval.nanoseconds))
        let sampling = plan.limits.memoryLimitBytes > 0 && state.cgroup == nil
        var disk = DiskReserveWatch(
            reserve: plan.limits.diskReserveBytes,
            containers: [plan.dataDirectory.path] + plan.bundle.appGroups.map { AppContainer.groupDirectory(root: plan.groupsDirectory.path, identifier: $0) },
            startNs: state.startNs, checkInterval: UInt64(descendantCheckInterval.nanoseconds))

        while true {
            let now = bgtask_monotonic_ns()
            if state.expiredAtNs == nil, now >= expireAt {
                state.expiredAtNs = now
                try? channel.send(ParentMessage.expire(task: nil, reason: plan.expireAfter == nil ? "budget" : "simulated"))
                killAt = now + UInt64(plan.limits.grace.nanoseconds)
                logger.debug("expiration sent")
            }
            // The child's word never disarms the watchdog: a launch is over when its process is
            // gone (reaped), not when it says so. One that said its tasks had ended has
            // `exitAfterFinished` to be gone.
            if let deadline = killAt, now >= deadline, state.killed == nil {
                state.killed = .watchdog
                Self.terminate(pid, cgroup: state.cgroup)
                logger.info("watchdog kill: grace period over")
            }
            if let finishedNs = state.finishedNs, now >= finishedNs + Self.exitAfterFinished, state.killed == nil {
                state.killed = .watchdog
                state.lingering = "the launch said its tasks had ended but its process was still running \(Self.exitAfterFinished / 1_000_000) ms later"
                Self.terminate(pid, cgroup: state.cgroup)
                logger.info("watchdog kill: still running after it said it had finished")
            }
            // A task expired on its own (stalled, cancelled, conditions lost) that is still open
            // when its grace ends takes the launch down with it, as on iOS.
            if state.killed == nil,
               let (task, _) = state.taskKillAt.first(where: { now >= $0.value && state.tasks[$0.key]?.completedNs == nil }) {
                state.killed = .watchdog
                Self.terminate(pid, cgroup: state.cgroup)
                logger.info("watchdog kill: an expired task did not complete within the grace", metadata: ["task": "\(task)"])
            }
            if state.killed == nil, let exhaustion = disk.check(at: now) {
                state.killed = .disk
                state.diskExhaustion = exhaustion
                Self.terminate(pid, cgroup: state.cgroup)
                logger.info("disk kill", metadata: ["reserve": "\(disk.reserve)"])
            }
            if sampling, state.killed == nil,
               let rss = memory.sample(at: now, runner: pid, state: &state, probe: { (try? channel.send(ParentMessage.probeChildren)) != nil }),
               rss > plan.limits.memoryLimitBytes {
                state.killed = .jetsam
                Self.terminate(pid, cgroup: nil)
                logger.info("jetsam kill", metadata: ["rss": "\(rss)", "limit": "\(plan.limits.memoryLimitBytes)"])
            }

            var next = state.expiredAtNs == nil ? expireAt : (killAt ?? UInt64.max)
            if state.killed != nil { next = UInt64.max }
            if sampling && state.killed == nil { next = min(next, max(memory.nextSampleNs, now)) }
            if let closedAt = channelClosedAt, state.killed == nil { next = min(next, closedAt + Self.exitAfterHangUp) }
            if let finishedNs = state.finishedNs, state.killed == nil { next = min(next, finishedNs + Self.exitAfterFinished) }
            if disk.isOn, state.killed == nil { next = min(next, max(disk.nextCheckNs, now)) }
            if state.killed == nil {
                for (task, deadline) in state.taskKillAt where state.tasks[task]?.completedNs == nil { next = min(next, deadline) }
            }
            let timeoutNs: Int64 = next == UInt64.max ? -1 : Int64(clamping: next > now ? next - now : 0)

            var fds = [pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: control?.wakeFD ?? -1, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: state.log.readEnd, events: Int16(POLLIN), revents: 0)]
            if channelOpen { fds.append(pollfd(fd: channel.fd, events: Int16(POLLIN), revents: 0)) }
            // Without a pidfd the child's exit cannot wake the loop: look every 10 ms.
            let ready = bgtask_poll_ns(&fds, UInt(fds.count), pidfd >= 0 ? timeoutNs : (timeoutNs < 0 ? 10_000_000 : min(timeoutNs, 10_000_000)))
            if ready < 0 && errno != EINTR { break }

            if let control, fds[1].revents != 0 {
                for command in control.take() {
                    switch command {
                    case let .expire(task, reason):
                        if state.expiredAtNs == nil && task == nil {
                            // Expiring the whole launch early starts its grace, as the budget would.
                            let now = bgtask_monotonic_ns()
                            state.expiredAtNs = now
                            killAt = min(killAt ?? UInt64.max, now + UInt64(plan.limits.grace.nanoseconds))
                        }
                        if let task, state.taskKillAt[task] == nil {
                            state.taskKillAt[task] = bgtask_monotonic_ns() + UInt64(plan.limits.grace.nanoseconds)
                        }
                        try? channel.send(ParentMessage.expire(task: task, reason: reason))
                        logger.debug("expiration sent", metadata: ["reason": "\(reason)", "task": "\(task.map(String.init) ?? "all")"])
                    case let .startTask(task):
                        state.addTask(task)
                        try? channel.send(ParentMessage.startTask(task))
                    case .close:
                        try? channel.send(ParentMessage.close)
                    case let .shutdown(reason):
                        let now = bgtask_monotonic_ns()
                        if state.expiredAtNs == nil { state.expiredAtNs = now }
                        try? channel.send(ParentMessage.expire(task: nil, reason: reason))
                        killAt = min(killAt ?? UInt64.max, now + UInt64(plan.limits.grace.nanoseconds))
                    }
                }
            }
            // The launch's output before its messages: what it printed before it sent them.
            if fds[2].revents != 0 { state.log.drain() }
            if channelOpen, fds.count > 3, fds[3].revents != 0 {
                let wasFinished = state.finished
                channelOpen = receive(channel: channel, plan: plan, broker: broker, control: control, state: &state)
                if state.finished && !wasFinished && state.hadDescendants {
                    // All tasks ended: nothing the launch started may outlive it. (The runner
                    // killed them itself before it said so; this is the host making sure.)
                    // Below the app's process (not the namespace's init, whose death is the app's).
                    if let app = memory.app ?? ProcessTree.appProcess(of: pid) {
                        for descendant in ProcessTree.descendants(of: app) { kill(descendant, SIGKILL) }
                    }
                }
                if !channelOpen { channelClosedAt = bgtask_monotonic_ns() }
            }
            if let closedAt = channelClosedAt, state.killed == nil, !state.finished, state.forcedTermination != nil
                || bgtask_monotonic_ns() >= closedAt + Self.exitAfterHangUp {
                // Garbage on the channel, or a child that hung up on its supervisor and did not
                // exit (a dying process closes its channel a moment before it can be reaped):
                // it can no longer be trusted.
                state.end(.crashed, error: "the launch closed its channel to the host before its tasks ended")
                state.killed = .crashed
                Self.terminate(pid, cgroup: state.cgroup)
            }
            if pidfd >= 0 ? fds[0].revents != 0 : bgtask_has_exited(pid) != 0 { break }
        }
    }

    /// How long a child that closed its channel has to exit before it counts as hung up.
    static let exitAfterHangUp: UInt64 = 250_000_000
    /// How long a child that said its tasks had ended has to be gone before it is killed.
    static let exitAfterFinished: UInt64 = 250_000_000

    /// Kills the launch: its process group (or its cgroup), in one syscall.
    ///
    /// What left the group (setsid) is not looked for here: when the runner dies, it is
    /// re-parented to this process (a child subreaper) and killed as an orphan once the runner
    /// is reaped (`reapOrphans`). A walk of the runner's threads while they die would make the
    /// runner's reap spin in the kernel for milliseconds (the /proc entries the walk creates;
    /// see docs/benchmark-history.md), and the watchdog's kill is measured to the reap.
    static func terminate(_ pid: pid_t, cgroup: CgroupV2.LaunchGroup?) {
        cgroup?.killAll()
        kill(-pid, SIGKILL)
        // The runner by pid too: a child the zygote forked a moment ago may not have made its
        // process group yet, and the group kill would miss it.
        kill(pid, SIGKILL)
    }

    /// Reads the packets available, at most `limit` (so a child flooding its channel cannot keep
    /// the loop from its deadlines). Returns false once the channel is closed or unusable.
    private func receive(channel: LaunchChannel, plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?,
                         state: inout LaunchState, limit: Int = 64) -> Bool {
        for _ in 0..<limit {
            let packet: [UInt8]?
            do {
                packet = try channel.receivePacket(nonBlocking: true)
            } catch let error as ChannelError where error.code == .wouldBlock {
                return true
            } catch {
                state.end(.crashed, error: "launch channel: \(error)")
                return false
            }
            guard let packet else { return false }
            let message: ChildMessage
            do {
                message = try LaunchChannel.decode(ChildMessage.self, from: packet)
            } catch {
                state.end(.crashed, error: "the launch wrote garbage to its channel: \(error)")
                return false
            }
            handle(message, channel: channel, plan: plan, broker: broker, control: control, state: &state)
        }
        return true
    }

    private func drain(channel: LaunchChannel, plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?, state: inout LaunchState) {
        _ = receive(channel: channel, plan: plan, broker: broker, control: control, state: &state, limit: 100_000)
    }

    private func handle(_ message: ChildMessage, channel: LaunchChannel, plan: LaunchPlan, broker: LaunchRequestBroker,
                        control: LaunchControl?, state: inout LaunchState) {
        switch message {
        case .submit(let seq, let request):
            let rejection = broker.submit(request, app: plan.bundle)
            if rejection == nil { state.submitted.append(request) }
            try? channel.send(ParentMessage.reply(seq: seq, status: rejection?.status.rawValue ?? 0, message: rejection?.message, requests: nil))
        case .cancel(let seq, let identifier):
            broker.cancel(identifier: identifier, app: plan.bundle)
            try? channel.send(ParentMessage.reply(seq: seq, status: 0, message: nil, requests: nil))
        case .pending(let seq):
            try? channel.send(ParentMessage.reply(seq: seq, status: 0, message: nil, requests: broker.pending(app: plan.bundle)))
        case .log(let level, let text):
            state.log.append(level: level, text)
        default:
            state.apply(message)
        }
        guard let onEvent = control?.onEvent else { return }
        switch message {
        case .launched: onEvent(.launched)
        case .taskBegan(let task, _): onEvent(.taskBegan(task: task))
        case .taskCompleted(let task, _, _):
            if let (completed, total) = state.pendingProgress.removeValue(forKey: task) {
                onEvent(.progress(task: task, completed: completed, total: total))
            }
            onEvent(.taskEnded(task: task))
        case .taskNotRegistered(let task): onEvent(.taskEnded(task: task))
        case .progress(let task, let completed, let total):
            // At most 20 updates a second per task reach the host: a plugin reporting in a
            // tight loop must not flood it. The last one before completion always does.
            let now = bgtask_monotonic_ns()
            state.pendingProgress[task] = (completed, total)
            if now >= (state.lastProgressForward[task] ?? 0) + 50_000_000 {
                state.lastProgressForward[task] = now
                state.pendingProgress[task] = nil
                onEvent(.progress(task: task, completed: completed, total: total))
            }
        case .title(let task, let title, let subtitle): onEvent(.title(task: task, title: title, subtitle: subtitle))
        default: break
        }
    }

    // MARK: Processes

    /// Runner pids of launches this process is supervising, so that orphan reaping never
    /// touches another launch's runner.
    private static let activeRunners = LockedValue(Set<pid_t>())

    /// The process this host started that `pid` is, or descends from (a launch's runner, the
    /// zygote or a spare), or nil. Every launch is the host's child (spawned, or forked by the
    /// zygote with CLONE_PARENT), and a launch's processes cannot leave its runner's tree (the
    /// system-call filter refuses CLONE_PARENT and giving up the subreaper; orphans come back
    /// to the runner, or to the host, a subreaper too), so the parent chain finds it, even for a
    /// launch the host has not finished recording yet: how the control socket recognises a
    /// launch whatever its uid.
    public static func launchRunner(containing pid: pid_t) -> pid_t? {
        let host = getpid()
        guard pid != host else { return nil }
        var current = pid
        for _ in 0..<256 {
            guard current > 1, let parent = ProcessTree.parent(of: current), parent != current else { return nil }
            if parent == host { return current }
            current = parent
        }
        return nil
    }

    /// Whether every child of this process that is not a running launch's runner, the zygote or
    /// a spare is a launch's leftover, as in the host daemon and `bgtask run`, which start
    /// nothing else: then every zombie child is reaped, whatever it was. An embedding process
    /// (the tests) leaves it false: its own children are not this code's to reap, so a zombie
    /// is reaped only when its process group was the launch's.
    public static var adoptsEveryChild: Bool {
        get { adoptsEveryChildValue.withLock { $0 } }
        set { adoptsEveryChildValue.withLock { $0 = newValue } }
    }
    private static let adoptsEveryChildValue = LockedValue(false)

    /// Kills and reaps processes re-parented to this process (it is a child subreaper) that
    /// are descendants of launches whose runner died: children that are not the runner of a
    /// running launch and carry a launch's `BGTASK_LAUNCH_ID` in their environment or are in
    /// the process group of the launch that ended (`launchGroup`: its runner's pid), with
    /// everything below them; and zombies: a killed launch's processes die as zombies of their
    /// parents, which die too, and come here already dead, with no environment left to
    /// recognise (hundreds of them after a fork-happy launch was killed, until no pid was left).
    /// A zombie is reaped when its group was the launch's (or an orphan's killed here), or
    /// whatever it was with `adoptsEveryChild`. Other children of an embedding process are left
    /// alone.
    ///
    /// `sparing`: the zygote and its spares, which are this process's children too. They are
    /// not even looked at: reading a spare's /proc entries would make its reaping slower once
    /// it has become a launch.
    static func reapOrphans(sparing: Set<pid_t> = [], launchGroup: pid_t? = nil) {
        let everyChild = adoptsEveryChild
        // Under the lock that spawning holds, so a runner spawned a moment ago (not yet in
        // activeRunners) is never taken for an orphan.
        spawnLock.withLock {
            var groups = Set(launchGroup.map { [$0] } ?? [])
            var zombies: [(pid: pid_t, group: pid_t)] = []
            for child in ProcessTree.children(of: getpid())
            where !sparing.contains(child) && !activeRunners.withLock({ $0.contains(child) }) {
                guard let (state, group) = ProcessTree.status(of: child) else { continue }
                if state == UInt8(ascii: "Z") {
                    zombies.append((child, group))
                    continue
                }
                // Still alive, or dying: a process of the launch's group may be past the point
                // where its environment can be read, and is the launch's all the same.
                guard groups.contains(group) || ProcessTree.isLaunchProcess(child) else { continue }
                groups.insert(group)
                reapKilled(child, ProcessTree.killTree(child))
            }
            var status: Int32 = 0
            for (zombie, group) in zombies where everyChild || groups.contains(group) {
                _ = bgtask_wait4(zombie, &status, WNOHANG, nil)
            }
        }
    }

    /// Reaps `orphan`, killed, then its `descendants` (killed with it): each comes to this
    /// process (the nearest subreaper) when its parent dies, so they are waited for in passes,
    /// each pass reaping those that are this process's children by then, until a pass finds
    /// none (the rest were reaped by parents of their own before those died).
    private static func reapKilled(_ orphan: pid_t, _ descendants: Set<pid_t>) {
        var status: Int32 = 0
        _ = bgtask_wait4(orphan, &status, 0, nil)
        // Never a running launch's runner, should a pid have been reused since.
        var left = descendants.subtracting(activeRunners.withLock { $0 })
        while !left.isEmpty {
            let reaped = left.filter { bgtask_wait4($0, &status, 0, nil) == $0 }
            if reaped.isEmpty { break }
            left.subtract(reaped)
        }
    }

    /// Held from starting a runner until it is in `activeRunners`, and while reaping orphans.
    static let spawnLock = NSLock()
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

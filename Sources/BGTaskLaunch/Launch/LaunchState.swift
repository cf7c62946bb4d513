import BGTaskControl
import BGTaskSystem
import BGTaskModel
import BGTaskWire
import Foundation
import Glibc
import _BGTaskSystemShims

/// What the supervisor has learned about a launch so far, folded from the child's messages;
/// turns into the run record once the child is reaped.
package struct LaunchState {
    package enum Phase { case spawned, loading, launched }

    package struct TaskProgress {
        package var assignment: TaskAssignment
        package var startedNs: UInt64?
        package var completedNs: UInt64?
        package var success: Bool?
        package var expiredNs: UInt64?
        package var expirationHandled: Bool?
        package var notRegistered = false
    }

    package let plan: LaunchPlan
    package let startNs: UInt64
    package var phase = Phase.spawned
    package var tasks: [UInt64: TaskProgress]
    /// Identifiers registered, as the record lists them (the first
    /// `InputLimits.recordListEntries`; `listEntriesOmitted["registered"]` counts the rest).
    package var registered: [String] = []
    /// Entries left out of the record's lists, by list (`registered`, `background_time`,
    /// `notifications_added`, `transfers_delivered`): counted, never listed.
    package var listEntriesOmitted: [String: Int] = [:]
    /// Messages of the child's the host refused to keep, by kind: each kind's bound was
    /// reached (`refuse`), or the message names what the launch does not have.
    package var messagesRefused: [String: Int] = [:]
    // Listed up to `InputLimits.recordListEntries`, counted after (whoever appends).
    package var refused: [String] = [] {
        didSet { if refused.count > InputLimits.recordListEntries { refused.removeLast(); refusedOmitted += 1 } }
    }
    package var refusedOmitted = 0
    package var submitted: [TaskRequest] = [] {
        didSet { if submitted.count > InputLimits.recordListEntries { submitted.removeLast(); submittedOmitted += 1 } }
    }
    package var submittedOmitted = 0
    /// Local notifications the app added (the first `InputLimits.recordListEntries`).
    /// Background transfers the app was told of (`delivered`) in the launch.
    package var transfersDelivered: [String] = [] {
        didSet {
            if transfersDelivered.count > InputLimits.recordListEntries { transfersDelivered.removeLast(); listEntriesOmitted["transfers_delivered", default: 0] += 1 }
        }
    }
    package var notificationsAdded: [String] = [] {
        didSet {
            if notificationsAdded.count > InputLimits.recordListEntries { notificationsAdded.removeLast(); listEntriesOmitted["notifications_added", default: 0] += 1 }
        }
    }
    /// Notifications delivered while the app was in the foreground, handed to it (its delegate's
    /// `willPresent`), and how it presented each (identifier → options' names, or "not shown").
    package var notificationsHanded = Set<String>()
    package var notificationsPresented: [String: String] = [:]
    package var metricsTaken = false
    package var finished = false
    /// When the child said every task had ended: it must be gone soon after, or it is killed.
    package var finishedNs: UInt64?
    /// The confinement the runner reported before loading the plugin.
    package var sandbox: [String: SandboxLayer]?
    /// The launch started processes of its own (the runner said so, or the supervisor saw
    /// one): what it left behind must be looked for after the runner is reaped.
    package var hadDescendants = false
    /// The runner's last answer to `probeChildren` (nil: none since the last probe).
    package var childrenAnswer: Bool?
    package var launchFailure: String?
    /// Why the watchdog killed a launch that said it had finished.
    package var lingering: String?
    /// Why a launch was killed for writing under the disk reserve.
    package var diskExhaustion: String?
    /// Why the launch was killed over its app's disk quota (`disk-quota`).
    package var diskQuotaExceeded: String?
    /// Why the launch was killed over the background CPU limit (`cpu-limit`).
    package var cpuLimitExceeded: String?
    /// Why the host expired the launch or one of its tasks before its budget ran out (the
    /// first reason: simulated, conditions lost, the device too hot); nil: the budget ran out.
    package var expirationReason: String?
    /// What the app's containers and staging held before the launch (nil: no quota).
    package var diskUseAtStart: DiskUse?
    package var fatal: String?
    package var error: String?
    package var forcedTermination: RunRecord.Termination?
    package var killed: RunRecord.Termination?
    package var expiredAtNs: UInt64?
    package var peakRSS: UInt64 = 0
    /// The app's own peak, from its `finished` report (bounded by the machine's memory).
    package var reportedPeakRSS: UInt64 = 0
    package var cgroup: CgroupV2.LaunchGroup?
    package var launcher = "spawn"
    /// Per task: when its expiration's grace ends (single-task expirations).
    package var taskKillAt: [UInt64: UInt64] = [:]
    /// Per task: the last progress forwarded, and when.
    package var lastProgressForward: [UInt64: UInt64] = [:]
    /// Per task: progress received but not yet forwarded.
    package var pendingProgress: [UInt64: (Int64, Int64)] = [:]
    /// Tasks added to a running (foreground) launch, in order.
    package var addedTasks: [TaskAssignment] = []
    /// Background-time assertions, in the order taken (at most `InputLimits.recordListEntries`
    /// listed; a launch may take any number).
    package var backgroundTime: [RunRecord.BackgroundTimeRecord] = []
    /// Assertions held now (taken, not ended), listed or not: at most
    /// `heldBackgroundTimeLimit`; a `began` past it is refused (`messagesRefused`).
    package var backgroundTimeHeld = Set<UInt64>()
    /// Background-time assertions a launch may hold at once, as far as the host keeps count.
    /// The runner numbers them one by one and an app holds a handful; what is past this is a
    /// flood of forged messages (3.6 million in 20 s grew the host by 97 MiB before it).
    package static let heldBackgroundTimeLimit = 1024
    /// When the runner said its launch's work was over and its process waits to be suspended
    /// (`ChildMessage.idle`, taken only from a suspendable launch whose tasks and assertions
    /// are over as far as the host has heard).
    package var idleNs: UInt64?
    /// The process's CPU time when it said `idle` (its own, precise word; see `suspendIfOver`).
    package var reportedCPUNs: UInt64?
    /// Its wake-ups (voluntary switches of all its threads, getrusage) when it said `idle`.
    package var reportedWakeups: UInt64?
    /// The plugin set a resume handler (see `ChildMessage.idle`).
    package var hearsResumes = false
    /// The process was suspended after the launch (termination `suspended`).
    package var suspendedAfter = false
    /// The launch resumed the app's suspended process: how long it was suspended, and how many
    /// launches the process has run with this one.
    package var resumed: (suspendedNs: UInt64, launches: Int)?
    /// The launch started a new process (a kept one is possible); why the previous one ended.
    package var previousProcess: String?
    /// Whether the host keeps this launch's process afterwards (`resumed`, `process_launches`
    /// are recorded).
    package var keepsProcess = false
    /// The energy counters of the process when the launch began (a resumed one's at its
    /// suspension; zero for a new process) and what the launch used (set before `record`).
    package var energyAtStart = EnergyCounters()
    package var energy: EnergyCounters?
    /// The bytes the app's own TCP connections moved (`SocketTraffic`), sampled while it runs
    /// and when it says its work is over.
    package var traffic = SocketTraffic()
    package var trafficSampledAtEnd = false
    /// The app process's CPU time and energy counters read just before the host killed it: in
    /// a PID namespace the app process dies with its namespace, never reaped by the runner, so
    /// the runner's rusage does not hold what the app used.
    package var lookBeforeKill: (cpuNs: UInt64?, energy: EnergyCounters?)?
    /// The push's completion handler: its result (BGTASK_FETCH_RESULT_*) and when.
    package var pushCompletion: (result: UInt32, at: UInt64)?

    /// The launch's log (its output and the supervisor's lines).
    package let log: LaunchLog

    package init(plan: LaunchPlan, startNs: UInt64, log: LaunchLog) {
        self.plan = plan
        self.startNs = startNs
        self.log = log
        tasks = Dictionary(uniqueKeysWithValues: plan.tasks.map { ($0.task, TaskProgress(assignment: $0)) })
    }

    /// Tasks the launch has that have not ended (completed, or not registered), as the host has
    /// heard.
    package var openTaskCount: Int { tasks.values.reduce(0) { $0 + ($1.completedNs == nil && !$1.notRegistered ? 1 : 0) } }

    package mutating func addTask(_ task: TaskAssignment) {
        addedTasks.append(task)
        tasks[task.task] = TaskProgress(assignment: task)
    }

    /// Records a reason to end the launch; the first one wins.
    package mutating func end(_ termination: RunRecord.Termination, error: String) {
        guard forcedTermination == nil else { return }
        forcedTermination = termination
        self.error = error
    }

    package mutating func apply(_ message: ChildMessage) {
        switch message {
        case .loading: phase = .loading
        case .registered(let identifier, _):
            // The runner registers only what the bundle permits, once each: a forged one that
            // names anything else is not the app's registration.
            guard identifier.utf8.count <= InputLimits.identifierBytes, plan.bundle.permits(identifier) else {
                refuse("registered", "a registration the bundle does not permit (\(identifier.utf8.count) bytes)")
                break
            }
            if registered.count < InputLimits.recordListEntries {
                if !registered.contains(identifier) { registered.append(identifier) }
            } else {
                listEntriesOmitted["registered", default: 0] += 1
            }
        case .registerRefused(let identifier, let reason):
            refused.append(identifier)
            log.append(level: 2, "register(forTaskWithIdentifier: \"\(identifier)\") returned false: \(reason)")
        case .launched: phase = .launched
        case .launchFailed(let error): launchFailure = error
        case .taskBegan(let task, let at): tasks[task]?.startedNs = at
        case .taskNotRegistered(let task): tasks[task]?.notRegistered = true
        case .expirationDelivered(let task, let at, let toApp):
            tasks[task]?.expiredNs = at
            tasks[task]?.expirationHandled = toApp
        case .taskCompleted(let task, let success, let at):
            tasks[task]?.completedNs = at
            tasks[task]?.success = success
        case .fatal(let error): fatal = error
        case let .finished(_, descendants, peak):
            reportedPeakRSS = max(reportedPeakRSS, min(peak, Self.physicalMemoryBytes))
            if !finished { finishedNs = bgtask_monotonic_ns() }
            finished = true
            if descendants { hadDescendants = true }
        case .children(let has):
            childrenAnswer = has
            if has { hadDescendants = true }
        case .sandbox(let layers):
            // Only from the runner itself: once it reports loading, plugin code may be talking.
            if phase == .spawned && sandbox == nil { sandbox = layers }
        case let .backgroundTimeBegan(id, name, at):
            guard backgroundTimeHeld.count < Self.heldBackgroundTimeLimit || backgroundTimeHeld.contains(id) else {
                refuse("background_time_began", "more than \(Self.heldBackgroundTimeLimit) background-time assertions held at once")
                break
            }
            backgroundTimeHeld.insert(id)
            if backgroundTime.count < InputLimits.recordListEntries {
                backgroundTime.append(.init(id: id, name: name.map { RunRecord.bounded($0, InputLimits.titleBytes) }, outcome: .notEnded, beganMs: ms(at) ?? 0))
            } else {
                listEntriesOmitted["background_time", default: 0] += 1
            }
        case let .backgroundTimeEnded(id, at):
            backgroundTimeHeld.remove(id)
            if let index = backgroundTime.lastIndex(where: { $0.id == id }) {
                backgroundTime[index].endedMs = ms(at)
                backgroundTime[index].outcome = backgroundTime[index].expiredMs == nil ? .ended : .endedAfterExpiration
            }
        case let .backgroundTimeExpired(id, at, toApp):
            if let index = backgroundTime.lastIndex(where: { $0.id == id }) {
                backgroundTime[index].expiredMs = ms(at)
                backgroundTime[index].expirationHandled = toApp
            }
        case let .remoteNotificationCompleted(result, at):
            if pushCompletion == nil { pushCompletion = (result, at) }
        case .progress, .title, .log, .submit, .cancel, .pending, .deviceToken, .idle: break
        case .notificationAuthorization, .notificationAdd, .notificationList, .notificationRemove, .transferCall: break
        case let .notificationPresented(identifier, options):
            // Only for a notification the host handed this launch: a forged one names nothing.
            guard notificationsHanded.contains(identifier) else {
                refuse("notification_presented", "an answer for a notification the launch was not handed")
                break
            }
            notificationsPresented[identifier] = RunRecord.presentationText(options)
        case .metricsTaken:
            // Only a launch that was offered some took them.
            if plan.metricsJSON != nil { metricsTaken = true }
        }
    }

    /// Counts a refused message of `kind`; the first of each kind says why in the launch's log
    /// (once: a flood of them writes one line).
    package mutating func refuse(_ kind: String, _ why: String) {
        messagesRefused[kind, default: 0] += 1
        if messagesRefused[kind] == 1 {
            log.append(level: 2, "the host refused a \(kind) message from the launch: \(why); later ones are counted in the record's messages_refused")
        }
    }


    /// The launch's peak resident memory. ru_maxrss of a posix_spawned child starts at its
    /// parent's size (the vfork shares the parent's memory until exec), so it counts only for
    /// zygote children; the samples count always, and so does the app's own peak, which it
    /// reports as it finishes (a launch shorter than the first sample's interval has no sample
    /// of its app at all). That report is the app's word: it can raise the figure, never lower
    /// it, and never above the machine's memory.
    package func peak(_ usage: rusage) -> UInt64 {
        let sampled = max(peakRSS, reportedPeakRSS)
        guard launcher == "zygote" else { return sampled }
        return max(sampled, UInt64(max(usage.ru_maxrss, 0)) * 1024)
    }

    package static let physicalMemoryBytes = ProcessInfo.processInfo.physicalMemory

    private func ms(_ ns: UInt64?) -> Double? {
        guard let ns else { return nil }
        return (Double(ns > startNs ? ns - startNs : 0) / 1_000_000 * 1000).rounded() / 1000
    }

    package func record(status: Int32, usage: rusage, pid: pid_t, wallNs: UInt64, startedAt: Date) -> RunRecord {
        var termination: RunRecord.Termination
        var signal: String?
        var exitStatus: Int32?
        var error = self.error
        let signaled = bgtask_wifsignaled(status) != 0
        if signaled { signal = SignalName.of(bgtask_wtermsig(status)) }
        if bgtask_wifexited(status) != 0 { exitStatus = bgtask_wexitstatus(status) }
        let openTasks = openTaskCount > 0

        if let killed, killed == .watchdog || killed == .jetsam || killed == .disk || killed == .diskQuota || killed == .cpuLimit {
            termination = killed
            signal = "SIGKILL"
            if killed == .cpuLimit {
                error = cpuLimitExceeded
            } else if killed == .disk {
                error = diskExhaustion
            } else if killed == .diskQuota {
                error = diskQuotaExceeded
            } else if killed == .watchdog, let lingering {
                error = lingering
            } else if killed == .watchdog {
                let open = openTaskCount
                let held = backgroundTimeHeld.isEmpty ? "" : " and \(backgroundTimeHeld.count) background-time assertion(s) not ended (endBackgroundTask)"
                error = "killed \(RunRecord.ms(plan.limits.grace.milliseconds)) after expiration with \(open) task(s) still open\(held)"
            } else {
                error = "resident memory crossed the limit of \(RunRecord.mib(plan.limits.memoryLimitBytes)) (peak \(RunRecord.mib(peak(usage))))"
            }
        } else if let launchFailure {
            termination = .launchFailed
            error = launchFailure
        } else if let fatal {
            // Breaking a registration rule during the launch entry is a failed launch; after it,
            // a crash of the running app.
            termination = phase == .launched ? .crashed : .launchFailed
            error = fatal
        } else if let forced = forcedTermination {
            termination = forced
        } else if phase != .launched && (signaled || exitStatus != 0 || !finished) {
            termination = .launchFailed
            let how = signal.map { "crashed with \($0)" } ?? "exited with status \(exitStatus ?? -1)"
            error = phase == .loading
                ? "\(how) while loading \(plan.bundle.executableName) (in a library constructor or the launch entry)"
                : "the runner \(how) before loading the plugin"
        } else if signaled {
            termination = .crashed
        } else if exitStatus == RunnerExitStatus.channelLost {
            termination = .crashed
            error = "the app closed or broke its launch channel (fd 3), so the runner ended the launch"
        } else if exitStatus != 0 {
            termination = .crashed
            error = "exited with status \(exitStatus ?? -1)"
        } else if openTasks || !finished {
            termination = .crashed
            error = "exited with status 0 while \(openTaskCount) task(s) were still open"
        } else {
            termination = suspendedAfter ? .suspended : .exited
        }

        let taskRecords = (plan.tasks + addedTasks).map { assignment -> RunRecord.TaskRecord in
            let progress = tasks[assignment.task] ?? TaskProgress(assignment: assignment)
            let outcome: RunRecord.Outcome
            if progress.notRegistered {
                outcome = .notRegistered
            } else if progress.completedNs == nil {
                outcome = termination == .launchFailed && progress.startedNs == nil ? .notRegistered : .unfinished
            } else if progress.expiredNs != nil && progress.expirationHandled == true {
                outcome = .expired
            } else {
                outcome = progress.success == true ? .succeeded : .failed
            }
            return RunRecord.TaskRecord(
                identifier: assignment.identifier, type: assignment.kind, outcome: outcome,
                startedMs: ms(progress.startedNs), completedMs: ms(progress.completedNs),
                expiredMs: ms(progress.expiredNs), expirationHandled: progress.expirationHandled,
                success: progress.success)
        }
        let cpuMs = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000
        var record = RunRecord(
            app: plan.bundle.identifier, launchID: plan.launchID, reason: plan.reason.rawValue, tasks: taskRecords,
            termination: termination, signal: signal, exitStatus: exitStatus, error: error,
            wallMs: (Double(wallNs) / 1_000).rounded() / 1000, cpuMs: (cpuMs * 1000).rounded() / 1000,
            peakRSSBytes: peak(usage),
            memoryLimitBytes: plan.limits.memoryLimitBytes, memoryMechanism: cgroup == nil ? "sampler" : "cgroup",
            budgetMs: plan.limits.budget.milliseconds, graceMs: plan.limits.grace.milliseconds,
            expiredAtMs: ms(expiredAtNs), pid: pid, startedAt: startedAt, bundlePath: plan.bundle.url.path,
            log: log.written ? plan.logFile.path : nil, registered: registered, refusedRegistrations: refused, submitted: submitted,
            launcher: launcher)
        record.sandbox = sandbox
        record.expirationReason = expirationReason
        if let energy {
            record.energy = RunRecord.EnergyRecord(
                diskWrittenBytes: energy.diskWrittenBytes, diskReadBytes: energy.diskReadBytes, wakeups: energy.wakeups,
                networkSentBytes: traffic.total.sent, networkReceivedBytes: traffic.total.received,
                cpuLimit: plan.limits.cpuLimit.map(\.description) ?? plan.limits.cpuLimitExemption.map { "none: \($0)" } ?? "none")
        }
        if keepsProcess {
            record.resumed = resumed != nil
            record.suspendedMs = resumed.map { (Double($0.suspendedNs) / 1_000).rounded() / 1000 }
            record.processLaunches = resumed?.launches ?? 1
            record.previousProcess = previousProcess
        }
        if !backgroundTime.isEmpty { record.backgroundTime = backgroundTime }
        if let push = plan.push {
            let results = ["new-data", "no-data", "failed"]
            record.push = RunRecord.PushRecord(
                id: push.id, receivedAt: push.receivedAt,
                deliveredAfterMs: ((startedAt.timeIntervalSince(push.receivedAt)) * 1000).rounded() / 1,
                result: pushCompletion.map { Int($0.result) < results.count ? results[Int($0.result)] : "unknown(\($0.result))" },
                completedMs: ms(pushCompletion?.at))
        }
        if !notificationsAdded.isEmpty { record.notificationsAdded = notificationsAdded }
        if !notificationsPresented.isEmpty { record.notificationsPresented = notificationsPresented }
        if metricsTaken { record.metricsDelivered = true }
        var sessions: [String]?
        if plan.reason == .backgroundTransfer, let json = plan.eventJSON {
            sessions = (try? JSONDecoder().decode(TransferLaunchEvent.self, from: Data(json.utf8)))?.sessions
        }
        if !transfersDelivered.isEmpty || sessions != nil {
            record.transfers = RunRecord.TransfersRecord(delivered: transfersDelivered, sessions: sessions)
        }
        if log.truncated { (record.logTruncated, record.logBytesDropped) = (true, log.droppedBytes) }
        if refusedOmitted > 0 { record.refusedRegistrationsOmitted = refusedOmitted }
        if submittedOmitted > 0 { record.submittedOmitted = submittedOmitted }
        if !listEntriesOmitted.isEmpty { record.listEntriesOmitted = listEntriesOmitted }
        if !messagesRefused.isEmpty { record.messagesRefused = messagesRefused }
        record.fitToFrame()
        return record
    }
}

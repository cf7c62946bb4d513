import BGTaskControl
import BGTaskModel
import BGTaskSystem
import BGTaskWire
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// The supervision of one running launch, one turn at a time on a supervision loop (see
/// `SupervisedLaunch`, which owns the descriptors: the launch's pidfd, its channel, its log pipe
/// and its control's wake pipe). Each turn carries out the host's commands, reads the log and
/// answers the channel, then enforces what is due (expiry, the watchdogs, the disk reserve, the
/// memory limit) and names the next deadline (no sleeps, no thread of its own). It ends when
/// the launch's process has exited or gone idle; `drain` then reads what it said last.
package struct LaunchLoop {
    package let pid: pid_t
    package let channel: LaunchChannel
    package let plan: LaunchPlan
    package let broker: LaunchRequestBroker
    package let control: LaunchControl?
    package let logger: Logger

    /// Deadlines and moments, in monotonic nanoseconds: the budget's end (expiration), the
    /// watchdog's kill (the grace's end after expiration), the channel's hang-up.
    private var expireAt: UInt64
    private let grace: UInt64
    private var killAt: UInt64?
    private var channelOpen = true
    private var workOverSaid = false // `control.onWorkOver` was called
    private var channelClosedAt: UInt64?
    /// Resident memory, sampled when there is a limit and no cgroup enforces it.
    fileprivate(set) var memory: MemorySampler
    private let sampling: Bool
    private var points: LaunchSamples.Writer // its memory and CPU over time, at the memory samples
    private var disk: DiskReserveWatch
    /// The background CPU limit (`LaunchLimits.cpuLimit`), nil without one.
    var cpu: CPUMonitor?
    /// The app's disk quota (its use measured before the launch: `LaunchState.diskUseAtStart`).
    package private(set) var quota: DiskQuotaWatch

    /// How long a child that closed its channel has to exit before it counts as hung up, and
    /// one that said its tasks had ended has to be gone before it is killed. A dying process
    /// (its descendants killed, its PID namespace torn down) is gone in milliseconds; 250 ms
    /// killed healthy launches on a loaded two-core machine (parallel builds), so a second.
    package static let exitAfterHangUp: UInt64 = 1_000_000_000
    package static let exitAfterFinished: UInt64 = 1_000_000_000

    package init(pid: pid_t, channel: LaunchChannel, plan: LaunchPlan, broker: LaunchRequestBroker, control: LaunchControl?,
         logger: Logger, supervisor: LaunchSupervisor, state: LaunchState) {
        self.pid = pid
        self.channel = channel
        self.plan = plan
        self.broker = broker
        self.control = control
        self.logger = logger
        coalesces = supervisor.coalescesSoftDeadlines
        expireAt = state.startNs + UInt64((plan.expireAfter ?? plan.limits.budget).nanoseconds)
        grace = UInt64(plan.limits.grace.nanoseconds)
        memory = MemorySampler(
            limit: plan.limits.memoryLimitBytes, startNs: state.startNs, sampleInterval: UInt64(supervisor.memorySampleInterval.nanoseconds),
            maximumInterval: UInt64(supervisor.maximumMemorySampleInterval.nanoseconds), burstBytesPerNs: supervisor.memoryBurstBytesPerSecond / 1e9,
            descendantInterval: UInt64(supervisor.descendantSampleInterval.nanoseconds), checkInterval: UInt64(supervisor.descendantCheckInterval.nanoseconds))
        (sampling, points) = (plan.limits.memoryLimitBytes > 0 && state.cgroup == nil, LaunchSamples.Writer(log: plan.logFile.path))
        disk = DiskReserveWatch(
            reserve: plan.limits.diskReserveBytes,
            containers: [plan.dataDirectory.path] + plan.bundle.appGroups.map { AppContainer.groupDirectory(root: plan.groupsDirectory.path, identifier: $0) },
            startNs: state.startNs, checkInterval: UInt64(supervisor.descendantCheckInterval.nanoseconds))
        cpu = plan.limits.cpuLimit.map { CPUMonitor(limit: $0, startNs: state.startNs) }
        quota = DiskQuotaWatch(
            quota: state.diskUseAtStart == nil ? .none : plan.limits.diskQuota, directories: DiskAccounting.directories(of: plan),
            app: plan.bundle.identifier, startNs: state.startNs, use: state.diskUseAtStart ?? DiskUse(),
            lookInterval: UInt64(supervisor.descendantCheckInterval.nanoseconds))
    }

    /// One turn on the supervision loop (`SupervisedLaunch.fire`): the host's commands, the
    /// launch's output, its messages (`channelReady`), then what is due.
    /// Returns when the loop must turn next whatever the descriptors do (monotonic ns; `.max`:
    /// never), or nil once the launch's process has exited (`exited`), or its work is over and
    /// the process stays (the supervisor suspends it). (The deadline is computed here, on the
    /// launch's state in place: passed by value, its copy was a measurable part of a turn.)
    package mutating func turn(_ state: inout LaunchState, now: UInt64, commands: Bool, logReady: Bool, channelReady: Bool, exited: Bool) -> UInt64? {
        if let control, commands { apply(control.take(), &state) }
        // The launch's output before its messages: what it printed before it sent them.
        if logReady { state.log.drain() }
        if channelOpen, channelReady {
            flush()
            readChannel(&state)
            noteWorkOver(state)
        }
        if outboxOverflowed, state.killed == nil {
            state.end(.crashed, error: "the launch did not read its channel: \(outbox.count) message(s) of the host's (\(outboxBytes) bytes) were waiting")
            kill(.crashed, &state, "killed: the launch stopped reading its channel")
        }
        checkHangUp(&state)
        if exited { return nil }
        // The launch's work is over and its process stays: the supervisor suspends it.
        if state.idleNs != nil && state.killed == nil { return nil }
        let at = bgtask_monotonic_ns()
        enforce(at: at, &state)
        let wake = nextWake(after: at, state)
        return wake < 0 ? .max : at + UInt64(wake)
    }

    /// The channel waits to be written to: messages of the host's are queued (`outbox`).
    package var wantsToWrite: Bool { !outbox.isEmpty }
    package var isChannelOpen: Bool { channelOpen }

    // MARK: Sending

    /// The host's messages to the launch, never blocking the loop: sent at once when the
    /// channel has room, queued when it has not (the runner reads its channel on a thread of
    /// its own, so a full one is a launch that stopped reading). More than `outboxLimit` bytes
    /// queued kill the launch (`outboxOverflowed`): before the loop, a launch that stopped
    /// reading held its supervising thread in send(2), its watchdog with it.
    private var outbox: [[UInt8]] = []
    private var outboxBytes = 0
    private var outboxOverflowed = false
    package static let outboxLimit = 4 << 20

    private mutating func send(_ message: ParentMessage) throws(ChannelError) {
        var writer = WireWriter()
        message.write(to: &writer)
        let bytes = writer.bytes
        guard bytes.count <= LaunchChannel.maximumMessageBytes else {
            throw ChannelError(.oversized, "message of \(bytes.count) bytes exceeds \(LaunchChannel.maximumMessageBytes)")
        }
        guard channelOpen else { throw ChannelError(.closed, "the launch closed its channel") }
        if outbox.isEmpty {
            let sent = bytes.withUnsafeBytes { bgtask_send_nonblocking(channel.fd, $0.baseAddress, UInt($0.count)) }
            if sent >= 0 { return }
            let e = errno
            guard e == EAGAIN || e == EWOULDBLOCK else {
                throw ChannelError(e == EPIPE || e == ECONNRESET ? .closed : .system, "send: \(String(cString: strerror(e)))")
            }
        }
        outbox.append(bytes)
        outboxBytes += bytes.count
        if outboxBytes > Self.outboxLimit { outboxOverflowed = true }
    }

    /// Sends what is queued while the channel has room.
    private mutating func flush() {
        while let first = outbox.first {
            let sent = first.withUnsafeBytes { bgtask_send_nonblocking(channel.fd, $0.baseAddress, UInt($0.count)) }
            if sent < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK { return }
                // Closed: nothing more reaches it (its end is noticed by the reader).
                outbox.removeAll()
                outboxBytes = 0
                return
            }
            outbox.removeFirst()
            outboxBytes -= first.count
        }
    }

    /// What the launch said after the loop ended (its last messages, up to 100,000).
    package mutating func drain(_ state: inout LaunchState) {
        points.flush()
        answerWaitingCalls(&state)
        _ = receive(&state, limit: 100_000)
    }

    // MARK: Deadlines

    /// Expiration at the budget's end; the kills that are due: the watchdog (grace over, a
    /// finished launch still there, an expired task still open), the disk reserve, jetsam.
    private mutating func enforce(at now: UInt64, _ state: inout LaunchState) {
        if state.expiredAtNs == nil, now >= expireAt {
            state.expiredAtNs = now
            try? send(ParentMessage.expire(task: nil, reason: plan.expireAfter == nil ? "budget" : "simulated"))
            // The grace runs from the deadline, not from this thread's wake-up: the runner
            // expired itself at the deadline (its parent reader: Runner.untilDeadline), and a
            // host that woke late must not kill late.
            killAt = expireAt + grace
            logger.debug("expiration sent")
        }
        guard state.killed == nil else { return }
        if sampling, !state.finished, memory.app != nil, now >= state.traffic.sampledAtNs + Self.trafficInterval(after: now - state.startNs, sockets: state.traffic.hasOpenSockets) { // its connections' bytes
            sampleTraffic(&state, now: now)
        }
        // The child's word never disarms the watchdog: a launch is over when its process is
        // gone (reaped), not when it says so. One that said its tasks had ended has
        // `exitAfterFinished` to be gone.
        if let deadline = graceKillAt(state), now >= deadline {
            kill(.watchdog, &state, "watchdog kill: grace period over")
        } else if let finishedNs = state.finishedNs, now >= finishedNs + Self.exitAfterFinished {
            state.lingering = "the launch said its tasks had ended but its process was still running \(Self.exitAfterFinished / 1_000_000) ms later"
            kill(.watchdog, &state, "watchdog kill: still running after it said it had finished")
        } else if let (task, _) = state.taskKillAt.first(where: { now >= $0.value && state.tasks[$0.key]?.completedNs == nil }) {
            // A task expired on its own (stalled, cancelled, conditions lost) that is still open
            // when its grace ends takes the launch down with it, as on iOS.
            kill(.watchdog, &state, "watchdog kill: an expired task did not complete within the grace", ["task": "\(task)"])
        } else if let exhaustion = disk.check(at: now) {
            state.diskExhaustion = exhaustion
            kill(.disk, &state, "disk kill", ["reserve": "\(disk.reserve)"])
        } else if let exceeded = quota.check(at: now) {
            state.diskQuotaExceeded = "\(exceeded) while it ran"
            kill(.diskQuota, &state, "disk quota kill", ["bytes": "\(quota.use.bytes)", "inodes": "\(quota.use.inodes)"])
        } else if let exceeded = checkCPU(at: now, state) {
            state.cpuLimitExceeded = exceeded
            kill(.cpuLimit, &state, "cpu limit kill")
        } else if sampling,
                  let rss = memory.sample(at: now, runner: pid, state: &state, probe: { [channel] in Self.trySend(ParentMessage.probeChildren, on: channel) }) {
            control?.sampled(residentBytes: rss)
            points.sample(resident: rss, nowNs: now, startNs: state.startNs) { [app = memory.app] in app.flatMap(ProcessTree.cpuClockNanoseconds(of:)) }
            if rss > plan.limits.memoryLimitBytes {
                kill(.jetsam, &state, "jetsam kill", ["rss": "\(rss)", "limit": "\(plan.limits.memoryLimitBytes)"], cgroup: false)
            }
        }
    }

    // MARK: Disk walks, off the loop

    /// A loop's launch has its disk walks (the quota's, the reserve's) made on a worker: see
    /// `DiskQuotaWatch.deferWalks`.
    package mutating func deferDiskWalks() {
        disk.deferWalks = true
        quota.deferWalks = true
    }

    package var wantsQuotaWalk: Bool { quota.walkWanted }
    package var wantsReserveWalk: Bool { disk.walkWanted != nil }
    package var quotaWalkInputs: (directories: [String], app: String) { (quota.directories, quota.app) }
    package var reserveContainers: [String] { disk.containers }

    /// A quota walk made on a worker, kept: the launch is killed when it is over its quota.
    package mutating func quotaWalked(_ walk: DiskQuotaWatch.Walk, _ state: inout LaunchState) {
        guard let exceeded = quota.walked(walk, at: bgtask_monotonic_ns()), state.killed == nil else { return }
        state.diskQuotaExceeded = "\(exceeded) while it ran"
        kill(.diskQuota, &state, "disk quota kill", ["bytes": "\(quota.use.bytes)", "inodes": "\(quota.use.inodes)"])
    }

    /// What the containers hold, measured on a worker under the reserve: the launch is killed
    /// when it grew past what is allowed.
    package mutating func reserveWalked(held: UInt64, _ state: inout LaunchState) {
        let free = disk.walkWanted?.free ?? 0
        guard let exhaustion = disk.walked(held: held, free: free), state.killed == nil else { return }
        state.diskExhaustion = exhaustion
        kill(.disk, &state, "disk kill", ["reserve": "\(disk.reserve)"])
    }

    /// A message sent only if the channel has room now, never waiting: the memory sampler's
    /// probe (one lost is a probe not answered, and the sampler walks the launch's tree
    /// instead), and a resume to a suspended process (whose channel holds nothing of the
    /// host's; one that cannot take it is ended). False with errno set when it was not sent.
    package static func trySend(_ message: ParentMessage, on channel: LaunchChannel) -> Bool {
        var writer = WireWriter()
        message.write(to: &writer)
        return writer.bytes.withUnsafeBytes { bgtask_send_nonblocking(channel.fd, $0.baseAddress, UInt($0.count)) } >= 0
    }

    private func kill(_ termination: RunRecord.Termination, _ state: inout LaunchState, _ message: Logger.Message,
                      _ metadata: Logger.Metadata = [:], cgroup: Bool = true) {
        state.killed = termination
        lookBeforeKill(&state)
        LaunchSupervisor.terminate(pid, cgroup: cgroup ? state.cgroup : nil)
        logger.info(message, metadata: metadata)
    }

    /// When the grace's end kills the launch: `killAt`, unless the launch said its tasks had all
    /// ended before it, with every task completed as far as the host has heard. Such a launch is
    /// on its way out (its runner `_exit`s right after saying so): it gets what any launch that
    /// said so gets, `exitAfterFinished` to be gone, then the same watchdog kill. Before, a
    /// launch whose last task ended at its expiration, on a machine where a process took long
    /// to go (1,000 launches ending at once), was killed at the grace's end and recorded as a
    /// watchdog kill "with 0 task(s) still open", and penalized for it.
    private func graceKillAt(_ state: LaunchState) -> UInt64? {
        guard let killAt else { return nil }
        if let finishedNs = state.finishedNs, finishedNs < killAt,
           state.tasks.values.allSatisfy({ $0.completedNs != nil }) { return nil }
        return killAt
    }

    /// Nanoseconds until the next deadline (-1: none; the pidfd, the channel or a command wakes
    /// the loop). Hard deadlines (expiry, the watchdogs, a hang-up) are exact. Soft ones (the
    /// memory sampler's next sample, the disk reserve's and the quota's next looks) more than
    /// `coalesceAfterNs` away are rounded up to the next multiple of `coalesceGridNs` of the
    /// monotonic clock, so that the looks of many launches fall on the same wake-ups of their
    /// loop, as the kernel's timer slack does: at a hundred sleeping launches each woke its loop
    /// on its own about seventeen times a second. A sample comes at most 5 ms later than its
    /// adaptive interval (20 ms to 100 ms in the steady state) asked.
    private func nextWake(after now: UInt64, _ state: LaunchState) -> Int64 {
        // Killed: nothing is due any more; the pidfd wakes the loop when the process is gone
        // (a deadline left in the past would turn the loop again and again until then).
        guard state.killed == nil else { return -1 }
        var hard = state.expiredAtNs == nil ? expireAt : (graceKillAt(state) ?? UInt64.max)
        var soft = UInt64.max
        if sampling { soft = min(soft, max(memory.nextSampleNs, now)) }
        if let closedAt = channelClosedAt { hard = min(hard, closedAt + Self.exitAfterHangUp) }
        if let finishedNs = state.finishedNs { hard = min(hard, finishedNs + Self.exitAfterFinished) }
        if disk.isOn { soft = min(soft, max(disk.nextCheckNs, now)) }
        if quota.isOn { soft = min(soft, max(quota.nextCheckNs, now)) }
        if let cpu { soft = min(soft, max(cpu.nextCheckNs, now)) }
        for (task, deadline) in state.taskKillAt where state.tasks[task]?.completedNs == nil { hard = min(hard, deadline) }
        if coalesces, soft != UInt64.max, soft > now + Self.coalesceAfterNs {
            soft = (soft + Self.coalesceGridNs - 1) / Self.coalesceGridNs * Self.coalesceGridNs
        }
        let next = min(hard, soft)
        return next == UInt64.max ? -1 : Int64(clamping: next > now ? next - now : 0)
    }

    package static let coalesceGridNs: UInt64 = 5_000_000
    /// Soft deadlines on the grid (`LaunchSupervisor.coalescesSoftDeadlines`); false: exact.
    private let coalesces: Bool
    package static let coalesceAfterNs: UInt64 = 20_000_000

    // MARK: The host's commands

    private mutating func apply(_ commands: [LaunchControl.Command], _ state: inout LaunchState) {
        for command in commands {
            switch command {
            case let .expire(task, reason):
                if state.expirationReason == nil { state.expirationReason = reason }
                if state.expiredAtNs == nil && task == nil {
                    // Expiring the whole launch early starts its grace, as the budget would.
                    let now = bgtask_monotonic_ns()
                    state.expiredAtNs = now
                    killAt = min(killAt ?? UInt64.max, now + grace)
                }
                if let task, state.taskKillAt[task] == nil {
                    state.taskKillAt[task] = bgtask_monotonic_ns() + grace
                }
                try? send(ParentMessage.expire(task: task, reason: reason))
                logger.debug("expiration sent", metadata: ["reason": "\(reason)", "task": "\(task.map(String.init) ?? "all")"])
            case let .startTask(task):
                state.addTask(task)
                try? send(ParentMessage.startTask(task))
            case .close:
                // A foreground launch leaves the foreground: what it still holds (background
                // time) has what iOS gives an app entering the background, at most.
                let now = bgtask_monotonic_ns()
                let deadline = now + UInt64(LaunchLimits.backgroundTimeAfterForeground.nanoseconds)
                if state.expiredAtNs == nil && deadline < expireAt {
                    expireAt = deadline
                    try? send(ParentMessage.deadline(expiresAtNs: deadline))
                }
                try? send(ParentMessage.close)
            case let .shutdown(reason):
                if state.expirationReason == nil { state.expirationReason = reason }
                let now = bgtask_monotonic_ns()
                if state.expiredAtNs == nil { state.expiredAtNs = now }
                try? send(ParentMessage.expire(task: nil, reason: reason))
                killAt = min(killAt ?? UInt64.max, now + grace)
            case let .transferEvent(json):
                do { try send(ParentMessage.transferEvent(json: json)) } catch {
                    logger.warning("a transfer event did not fit the launch channel", metadata: ["error": "\(error)"])
                }
            case let .device(thermalState, lowPowerMode):
                try? send(ParentMessage.device(thermalState: thermalState, lowPowerMode: lowPowerMode))
            case let .presentNotification(entry):
                // At most as many as a record lists: a flood of deliveries is not the app's to answer.
                guard state.notificationsHanded.count < InputLimits.recordListEntries else { break }
                state.notificationsHanded.insert(entry.request.identifier)
                try? send(ParentMessage.notificationDelivered(entry))
            }
        }
    }

    // MARK: The launch's calls

    /// Calls of the launch's that wait for a worker's answer (`answer`), oldest first.
    package var calls: [ChildMessage] = []
    /// Calls waiting beyond this many stop the loop reading the launch's channel until they
    /// are answered: a launch that floods calls (each a store read or write) is slowed to the
    /// host's pace instead of queueing without bound in the host's memory.
    package static let callsWaitingLimit = 16
    package var readsPaused: Bool { calls.count >= Self.callsWaitingLimit }
    /// Calls are answered where they are read (after the loop: `drain`, on a worker; or a
    /// launch turned by a thread of its own).
    package var synchronousCalls = false

    /// The host's answer to one call, with what it changes in the launch's record.
    package struct CallAnswer: @unchecked Sendable {
        package var reply: ParentMessage?
        /// Sent instead when `reply` does not fit the channel.
        package var fallback: ParentMessage?
        package var submitted: TaskRequest?
        package var notificationAdded: String?
        package var transferDelivered: String?

        /// The memberwise initializer, for the modules above this one.
        package init(reply: ParentMessage? = nil, fallback: ParentMessage? = nil, submitted: TaskRequest? = nil, notificationAdded: String? = nil, transferDelivered: String? = nil) {
            self.reply = reply
            self.fallback = fallback
            self.submitted = submitted
            self.notificationAdded = notificationAdded
            self.transferDelivered = transferDelivered
        }
    }

    /// Answers a request (submit, cancel, pending, notifications, transfers, the device token)
    /// through the broker. Any thread: it touches no state of the loop's.
    package static func answer(_ message: ChildMessage, broker: LaunchRequestBroker, plan: LaunchPlan, control: LaunchControl?) -> CallAnswer {
        var answer = CallAnswer()
        switch message {
        case .submit(let seq, let request):
            let rejection = broker.submit(request, app: plan.bundle)
            if rejection == nil { answer.submitted = request }
            answer.reply = .reply(seq: seq, status: rejection?.status.rawValue ?? 0, message: rejection?.message, requests: nil)
        case .cancel(let seq, let identifier):
            broker.cancel(identifier: identifier, app: plan.bundle)
            answer.reply = .reply(seq: seq, status: 0, message: nil, requests: nil)
        case .pending(let seq):
            answer.reply = .reply(seq: seq, status: 0, message: nil, requests: broker.pending(app: plan.bundle))
        case .notificationAuthorization(let seq, _, _), .notificationAdd(let seq, _), .notificationList(let seq, _), .notificationRemove(let seq, _, _):
            guard let call = NotificationCall(message) else { break }
            let result = broker.notifications(call, app: plan.bundle)
            if case let .add(request) = call, result.status == 0 { answer.notificationAdded = request.identifier }
            answer.reply = .notificationReply(seq: seq, status: result.status, message: result.message,
                                              authorization: result.authorization.rawValue, notifications: result.entries)
            // A list too large for one frame (64 requests of 16 KiB): answered with an error
            // rather than never.
            answer.fallback = .notificationReply(seq: seq, status: 101, message: "the list is too large for the launch channel",
                                                 authorization: result.authorization.rawValue, notifications: [])
        case .transferCall(let seq, let json):
            // Background URL sessions: the host's transfers part answers (BackgroundTransfers).
            // The runner bounds the call, but a hostile child can send anything: checked again.
            let result: TransferCallAnswer
            if json.utf8.count > TransferLimits.callBytes {
                result = .failure(TransferCallAnswer.invalidArgument, "the call is \(json.utf8.count) bytes, over the limit of \(TransferLimits.callBytes)")
            } else {
                switch TransferCall.decode(Data(json.utf8)) {
                case .success(let call): result = broker.transfer(call, app: plan.bundle, launchID: plan.launchID, control: control)
                case .failure(let problem): result = .failure(TransferCallAnswer.invalidArgument, problem.message)
                }
            }
            answer.transferDelivered = result.delivered
            let reply = result.reply.flatMap { try? JSONEncoder.transferJSON.encode($0) }.map { String(decoding: $0, as: UTF8.self) }
            answer.reply = .transferReply(seq: seq, status: result.status, message: result.message, json: reply)
            answer.fallback = .transferReply(seq: seq, status: TransferCallAnswer.failed, message: "the answer does not fit the launch channel", json: nil)
        case .deviceToken(let seq):
            switch broker.deviceToken(app: plan.bundle) {
            case .success(let token): answer.reply = .reply(seq: seq, status: 0, message: token, requests: nil)
            case .failure(let rejection): answer.reply = .reply(seq: seq, status: rejection.status.rawValue, message: rejection.message, requests: nil)
            }
        default:
            break
        }
        return answer
    }

    /// On the loop: an answer kept in the launch's state and sent.
    package mutating func deliver(_ answer: CallAnswer, _ state: inout LaunchState) {
        if let request = answer.submitted { state.submitted.append(request) }
        if let added = answer.notificationAdded { state.notificationsAdded.append(added) }
        if let delivered = answer.transferDelivered { state.transfersDelivered.append(delivered) }
        guard let reply = answer.reply else { return }
        do { try send(reply) } catch {
            if error.code == .oversized, let fallback = answer.fallback { try? send(fallback) }
        }
    }

    /// After the loop (on a worker): the calls still waiting, answered where they are.
    package mutating func answerWaitingCalls(_ state: inout LaunchState) {
        synchronousCalls = true
        let waiting = calls
        calls = []
        for call in waiting { deliver(Self.answer(call, broker: broker, plan: plan, control: control), &state) }
    }

    // MARK: The channel

    private mutating func readChannel(_ state: inout LaunchState) {
        let wasFinished = state.finished
        channelOpen = receive(&state)
        if state.finished && !wasFinished && state.hadDescendants {
            // All tasks ended: nothing the launch started may outlive it. (The runner
            // killed them itself before it said so; this is the host making sure.)
            // Below the app's process (not the namespace's init, whose death is the app's).
            if let app = memory.app ?? ProcessTree.appProcess(of: pid) {
                for descendant in ProcessTree.descendants(of: app) { Glibc.kill(descendant, SIGKILL) }
            }
        }
        if !channelOpen { channelClosedAt = bgtask_monotonic_ns() }
    }

    /// Tells the host, once, that the launch's work is over (the host's view: every task ended,
    /// no background time held), so that its slot goes to the next launch while this one
    /// settles. The app's word can only give its slot up early, never hold one longer.
    private mutating func noteWorkOver(_ state: LaunchState) {
        guard !workOverSaid, let onWorkOver = control?.onWorkOver, state.phase == .launched, state.backgroundTimeHeld.isEmpty,
              state.openTaskCount == 0 else { return }
        workOverSaid = true
        onWorkOver()
    }

    /// Garbage on the channel, or a child that hung up on its supervisor and did not exit (a
    /// dying process closes its channel a moment before it can be reaped): it can no longer be
    /// trusted.
    private func checkHangUp(_ state: inout LaunchState) {
        guard let closedAt = channelClosedAt, state.killed == nil, !state.finished,
              state.forcedTermination != nil || bgtask_monotonic_ns() >= closedAt + Self.exitAfterHangUp else { return }
        state.end(.crashed, error: "the launch closed its channel to the host before its tasks ended")
        state.killed = .crashed
        lookBeforeKill(&state)
        LaunchSupervisor.terminate(pid, cgroup: state.cgroup)
    }

    /// Reads the packets available, at most `limit` (so a child flooding its channel cannot keep
    /// the loop from its deadlines). Returns false once the channel is closed or unusable.
    private mutating func receive(_ state: inout LaunchState, limit: Int = 64) -> Bool {
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
            handle(message, &state)
        }
        return true
    }

    /// Answers a request (submit, cancel, pending) through the broker, keeps what the launch
    /// reports in its state, and passes events on to the host.
    private mutating func handle(_ message: ChildMessage, _ state: inout LaunchState) {
        switch message {
        case .submit, .cancel, .pending, .notificationAuthorization, .notificationAdd, .notificationList, .notificationRemove,
             .transferCall, .deviceToken:
            // The host's answer may wait on its store and its queue: answered on a worker
            // (`SupervisedLaunch`), one call at a time per launch, in order, never on the loop.
            if synchronousCalls {
                deliver(Self.answer(message, broker: broker, plan: plan, control: control), &state)
            } else {
                calls.append(message)
            }
        case .log(let level, let text):
            state.log.append(level: level, text)
        case let .idle(_, peak, cpu, hears, wakeups):
            // Taken only from a launch whose process the host keeps, with its tasks over as far
            // as the host has heard: a forged `idle` cannot end a launch whose tasks are open
            // (it is then supervised to its end as any other). Background time is the app's
            // own word both ways (as for `finished`): an app that says it is over while it
            // holds some only loses that time.
            let open = state.openTaskCount
            guard state.keepsProcess, state.idleNs == nil, open == 0 else {
                state.refuse("idle", state.keepsProcess
                             ? "the launch said it was over with \(open) task(s) still open"
                             : "this launch's process is not kept (--app-lifecycle fresh, an extension, or bgtask run)")
                break
            }
            state.reportedPeakRSS = max(state.reportedPeakRSS, min(peak, LaunchState.physicalMemoryBytes))
            state.idleNs = bgtask_monotonic_ns()
            state.reportedCPUNs = cpu
            state.reportedWakeups = wakeups
            state.hearsResumes = hears
            state.finished = true
        default:
            state.apply(message)
        }
        // Its work is over (`idle`, `finished`): its connections' bytes now, before its process
        // is suspended or closes them on its way out.
        if state.finished, !state.trafficSampledAtEnd {
            state.trafficSampledAtEnd = true
            sampleTraffic(&state, now: bgtask_monotonic_ns())
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
            // Kept per task the launch has: a forged progress for any other id is refused, or
            // the host would keep an entry for every id a flood names.
            guard state.tasks[task] != nil else {
                state.refuse("progress", "progress for task \(task), which the launch does not have")
                break
            }
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
}

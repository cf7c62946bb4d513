import BGTaskWire
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// A running launch as a source of a supervision loop (`SupervisionLoop`): its pidfd, its control's
/// wake pipe, its log pipe and its channel, and the next deadline its `LaunchLoop` names. When
/// the loop is over (the process exited, or went idle to be suspended), the rest (reap, clean
/// up, record, suspension) runs on a worker (`LaunchSupervisor.workers`), never on the loop.
package final class SupervisedLaunch: SupervisionLoop.Source, @unchecked Sendable {
    /// What the launch's end needs to know about how it began.
    package struct Ending {
        /// The app's process is kept between launches: these are its key and table.
        package var key: SuspendedApp.Key?
        package var apps: SuspendedApps?
        /// Launches this process has run, this one included.
        package var launches: Int
        /// The process's CPU before this launch (a resumed process: what it used before).
        package var cpuAtStartNs: UInt64
        package var startedAt: Date
        package var refusedGroups: [String: String]
        package var resumed: Bool

        /// The memberwise initializer, for the modules above this one.
        package init(key: SuspendedApp.Key? = nil, apps: SuspendedApps? = nil, launches: Int, cpuAtStartNs: UInt64, startedAt: Date, refusedGroups: [String: String], resumed: Bool) {
            self.key = key
            self.apps = apps
            self.launches = launches
            self.cpuAtStartNs = cpuAtStartNs
            self.startedAt = startedAt
            self.refusedGroups = refusedGroups
            self.resumed = resumed
        }
    }

    package let supervisor: LaunchSupervisor
    package let logger: Logger
    package let pid: pid_t
    package let channel: LaunchChannel
    package let cgroup: CgroupV2.LaunchGroup?
    package var loop: LaunchLoop
    package var state: LaunchState
    package let ending: Ending
    private let completion: LaunchSupervisor.Completion
    /// The process's exit wakes the loop; without one (the kernel refused: out of descriptors)
    /// the loop looks every `exitPollNs`.
    private let pidfd: Int32
    package static let exitPollNs: UInt64 = 10_000_000
    package private(set) var deadline: UInt64 = .max
    /// When the loop saw the process exit: the launch's end (its reap, on a worker, may come
    /// later when many launches end at once; the record's wall time is not the queue's).
    package private(set) var exitedAtNs: UInt64?
    /// The loop the launch is on (nil: a thread of its own, `superviseAlone`).
    package weak var home: SupervisionLoop?
    /// A call of the launch's is being answered on a broker thread.
    private var answering = false
    /// A disk walk of the launch's (its quota's, its reserve's) is being made on a walker.
    private var quotaWalking = false
    private var reserveWalking = false
    /// Work for the launch is out (an answer, a walk): its result comes back to the loop, so
    /// the launch does not end before it is in.
    private var outstanding: Bool { answering || quotaWalking || reserveWalking }
    /// The process is gone (or idle) and work is still out: the launch ends once it is in.
    private var winding = false

    package init(supervisor: LaunchSupervisor, logger: Logger, pid: pid_t, channel: LaunchChannel, cgroup: CgroupV2.LaunchGroup?, loop: LaunchLoop,
         state: LaunchState, ending: Ending, completion: @escaping LaunchSupervisor.Completion) {
        self.supervisor = supervisor
        self.logger = logger
        self.pid = pid
        self.channel = channel
        self.cgroup = cgroup
        self.loop = loop
        self.state = state
        self.ending = ending
        self.completion = completion
        pidfd = bgtask_pidfd_open(pid)
    }

    private enum Slot: UInt32 { case exit = 0, commands, log, channel }

    package var descriptors: [(fd: Int32, events: UInt32)] {
        if winding { return [] }
        return [(pidfd, BGTASK_EPOLL_IN),
         (loop.control?.wakeFD ?? -1, BGTASK_EPOLL_IN),
         (state.log.readEnd, BGTASK_EPOLL_IN),
         (loop.isChannelOpen ? channel.fd : -1, (loop.readsPaused ? 0 : BGTASK_EPOLL_IN) | (loop.wantsToWrite ? BGTASK_EPOLL_OUT : 0))]
    }

    package func fire(ready: UInt32, now: UInt64) -> Bool {
        if winding {
            deadline = .max
            return outstanding
        }
        func has(_ slot: Slot) -> Bool { ready & (1 << slot.rawValue) != 0 }
        let exited = pidfd >= 0 ? has(.exit) : bgtask_has_exited(pid) != 0
        if exited { exitedAtNs = now }
        let next = loop.turn(&state, now: now, commands: has(.commands), logReady: has(.log), channelReady: has(.channel), exited: exited)
        if !answering, !loop.calls.isEmpty { answerNext() }
        guard var next else {
            // Out of the loop once the work out for it is in (the rest: `conclude`).
            winding = outstanding
            deadline = .max
            return outstanding
        }
        walkWhenWanted()
        if pidfd < 0 { next = min(next, now + Self.exitPollNs) }
        deadline = next
        return true
    }

    /// The oldest waiting call, answered on a broker thread; its answer comes back to the loop.
    private func answerNext() {
        guard let home else { return }
        let call = loop.calls.removeFirst()
        answering = true
        let (broker, plan, control) = (loop.broker, loop.plan, loop.control)
        LaunchSupervisor.brokers.run { [self] in
            let answer = LaunchLoop.answer(call, broker: broker, plan: plan, control: control)
            home.execute { [self] in
                answering = false
                loop.deliver(answer, &state)
                home.refire(self)
            }
        }
    }

    /// The disk walks the launch's watches want, each on a walker (one of each at a time); the
    /// result is kept on the loop, unless the launch has ended meanwhile.
    private func walkWhenWanted() {
        guard let home else { return }
        if loop.wantsQuotaWalk, !quotaWalking {
            quotaWalking = true
            let (directories, app) = loop.quotaWalkInputs
            LaunchSupervisor.walkers.run { [self] in
                let walk = DiskQuotaWatch.walk(directories, app: app, now: bgtask_monotonic_ns())
                home.execute { [self] in
                    quotaWalking = false
                    if !winding { loop.quotaWalked(walk, &state) }
                    home.refire(self)
                }
            }
        }
        if loop.wantsReserveWalk, !reserveWalking {
            reserveWalking = true
            let containers = loop.reserveContainers
            LaunchSupervisor.walkers.run { [self] in
                let held = DiskReserveWatch.bytesHeld(containers)
                home.execute { [self] in
                    reserveWalking = false
                    if !winding { loop.reserveWalked(held: held, &state) }
                    home.refire(self)
                }
            }
        }
    }

    /// Out of the loop's set: the end runs on a worker.
    package func retire() {
        LaunchSupervisor.workers.run { [self] in
            if pidfd >= 0 { close(pidfd) }
            completion(.success(supervisor.conclude(self)))
        }
    }

    /// Without a supervision loop (none could be made: the host is out of descriptors), the
    /// launch is turned by a thread of its own, polling what the loop would have watched.
    package func superviseAlone() {
        loop.synchronousCalls = true
        var going = fire(ready: 0, now: bgtask_monotonic_ns())
        while going {
            let named = descriptors
            var fds = named.map { pollfd(fd: $0.fd, events: Int16($0.events & BGTASK_EPOLL_OUT != 0 ? POLLIN | POLLOUT : POLLIN), revents: 0) }
            let now = bgtask_monotonic_ns()
            let timeout: Int64 = deadline == .max ? -1 : Int64(clamping: deadline > now ? deadline - now : 0)
            _ = bgtask_poll_ns(&fds, UInt(fds.count), timeout)
            var ready: UInt32 = 0
            for (slot, fd) in fds.enumerated() where fd.fd >= 0 && fd.revents != 0 { ready |= 1 << UInt32(slot) }
            going = fire(ready: ready, now: bgtask_monotonic_ns())
        }
        retire()
    }
}

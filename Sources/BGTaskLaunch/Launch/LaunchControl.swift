import BGTaskModel
import Foundation
import Glibc

/// Commands for a running launch from outside its supervising thread: deliver expiration
/// (`bgtask simulate-expire`, power lost, device no longer idle) or shut it down gracefully
/// (expire now, kill after the grace). Wakes the supervisor's poll loop through a pipe.
///
/// Any thread may call its methods. `onStart` is called on a launch worker once the runner's
/// pid is known; `onEvent` and `onWorkOver` on the launch's supervision loop.
public final class LaunchControl: @unchecked Sendable {
    public enum Command: Sendable, Equatable {
        case expire(task: UInt64?, reason: String)
        case shutdown(reason: String)
        /// Foreground launches: run one more task in the process.
        case startTask(TaskAssignment)
        /// Foreground launches: no more tasks will come.
        case close
        /// Background URL sessions: a `TransferEvent`'s JSON for the launch (`ParentMessage.transferEvent`).
        case transferEvent(json: String)
        /// The device's thermal state (`ProcessInfo.ThermalState`'s raw value) or Low Power Mode
        /// changed (`ParentMessage.device`).
        case device(thermalState: UInt32, lowPowerMode: Bool)
        /// A notification delivered while the app is in the foreground (`willPresent`).
        case presentNotification(NotificationEntry)
    }

    /// What a running launch reports, for its host's live views and decisions.
    public enum Event: Sendable, Equatable {
        case launched
        case taskBegan(task: UInt64)
        case taskEnded(task: UInt64)
        case progress(task: UInt64, completed: Int64, total: Int64)
        case title(task: UInt64, title: String, subtitle: String?)
    }

    private let lock = NSLock()
    private var commands: [Command] = []
    private var sampledResident: UInt64?

    /// The launch's resident memory at the memory sampler's last sample (nil before the first,
    /// or under a cgroup's limit, where the kernel enforces it and nothing is sampled): what the
    /// dashboard and `bgtask top` show, with no /proc read of their own.
    public var residentBytes: UInt64? { lock.withLock { sampledResident } }

    package func sampled(residentBytes: UInt64) { lock.withLock { sampledResident = residentBytes } }
    private var pipeFDs: [Int32] = [-1, -1]
    public var onStart: (@Sendable (Int32) -> Void)?
    /// Called once on the supervision loop when the launch's work is over as far as the host
    /// has heard (every task ended, no background time held): from then on the launch only
    /// settles (its main queue's turn, quiet) and is suspended or exits, which takes no launch
    /// slot of the host's.
    public var onWorkOver: (@Sendable () -> Void)?

    /// Admission: a host that records each launch before its process exists (durable against
    /// its own crash) starts the supervising thread first, so that the thread's preparation
    /// (containers, channel, log) overlaps the recording, and admits the launch once recorded.
    /// The supervisor waits for it just before it starts the child. Unused (nil) otherwise.
    private let admission = NSCondition()
    private var admitted: Bool?
    private var needsAdmission = false
    private var onAdmission: (@Sendable (Bool) -> Void)?

    /// Before the supervising thread starts: it must wait for `admit`.
    public func requireAdmission() { admission.withLock { needsAdmission = true } }

    /// The launch may start (true) or must not (false: it could not be recorded). Any thread.
    public func admit(_ allowed: Bool) {
        let waiting = admission.withLock { () -> (@Sendable (Bool) -> Void)? in
            admitted = allowed
            admission.broadcast()
            defer { onAdmission = nil }
            return onAdmission
        }
        waiting?(allowed)
    }

    /// Whether the launch may start, when that is known now (true when no admission was
    /// required); nil when it is not, and `later` is then called with the answer, on the
    /// thread that calls `admit`.
    package func admission(orWhenKnown later: @escaping @Sendable (Bool) -> Void) -> Bool? {
        admission.withLock {
            guard needsAdmission else { return true }
            if let admitted { return admitted }
            onAdmission = later
            return nil
        }
    }

    /// Called on the supervision loop for each event; must not block.
    public var onEvent: (@Sendable (Event) -> Void)?

    public init() {
        if pipe(&pipeFDs) == 0 {
            for fd in pipeFDs {
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            }
        }
    }

    deinit {
        for fd in pipeFDs where fd >= 0 { Glibc.close(fd) }
    }

    public func expire(task: UInt64?, reason: String) { post(.expire(task: task, reason: reason)) }
    public func shutdown(reason: String) { post(.shutdown(reason: reason)) }
    public func startTask(_ task: TaskAssignment) { post(.startTask(task)) }
    public func close() { post(.close) }
    public func sendTransferEvent(_ json: String) { post(.transferEvent(json: json)) }
    public func device(thermalState: UInt32, lowPowerMode: Bool) { post(.device(thermalState: thermalState, lowPowerMode: lowPowerMode)) }
    public func presentNotification(_ entry: NotificationEntry) { post(.presentNotification(entry)) }

    private func post(_ command: Command) {
        lock.withLock { commands.append(command) }
        var byte: UInt8 = 1
        _ = write(pipeFDs[1], &byte, 1)
    }

    /// The descriptor the supervisor polls.
    package var wakeFD: Int32 { pipeFDs[0] }

    /// Empties the pipe and returns pending commands.
    package func take() -> [Command] {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(pipeFDs[0], &buffer, buffer.count) > 0 {}
        return lock.withLock {
            defer { commands.removeAll() }
            return commands
        }
    }
}

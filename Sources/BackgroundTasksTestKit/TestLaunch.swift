import CBGTaskPluginABI
import Foundation

/// A launch the test scheduler started: its tasks' handlers have been called (or are about to
/// be). Expire it when the test chooses, then `finish` it for its report.
public final class TestLaunch: Sendable {
    let scheduler: TestScheduler
    let taskIDs: [UInt64]
    let started = ContinuousClock.now

    init(scheduler: TestScheduler, taskIDs: [UInt64]) {
        self.scheduler = scheduler
        self.taskIDs = taskIDs
    }

    /// Expires every open task now, as the end of the launch's time does: each task's expiration
    /// handler is called on another thread; a task without one is completed unsuccessfully.
    public func expire() {
        scheduler.expire(taskIDs)
    }

    /// Expires the open task `identifier` now (`bgtask simulate-expire`).
    public func expire(_ identifier: String) {
        let ids = scheduler.lock.withLock { taskIDs.filter { scheduler.identifier(of: $0) == identifier } }
        scheduler.expire(ids)
    }

    /// Waits for the launch to end and reports it. With `expiringAfter`, its tasks are expired
    /// that long (real time) after the launch started. A task has ended when the app completed
    /// it and then stayed quiet for `settle` (a second `setTaskCompleted` in that time is a
    /// problem), when `grace` has passed since its expiration (not completed by then: the
    /// watchdog's case), or when `timeout` has passed without either (never completed).
    public func finish(expiringAfter expiry: Duration? = nil, timeout: Duration = .seconds(10),
                       grace: Duration = .seconds(1), settle: Duration = .milliseconds(20)) async -> LaunchReport {
        var expired = false
        while true {
            if let expiry, !expired, ContinuousClock.now - started >= expiry {
                expire()
                expired = true
            }
            if scheduler.hasSettled(taskIDs, started: started, timeout: timeout, grace: grace, settle: settle),
               expiry == nil || expired || scheduler.allCompleted(taskIDs) {
                break
            }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return scheduler.report(taskIDs)
    }
}

/// One task of a launch, as the scheduler tracks it (under the scheduler's lock).
final class TaskState: @unchecked Sendable {
    private static let counter = NSLock()
    nonisolated(unsafe) private static var last: UInt64 = 0

    /// Task ids are unique in the process: the SDK keeps tasks by id across schedulers.
    static func nextID() -> UInt64 {
        counter.withLock {
            last += 1
            return last
        }
    }

    let id: UInt64
    let identifier: String
    let type: TaskType
    /// What the handler receives; the identifier string lives as long as this state.
    let info: UnsafeMutablePointer<bgtask_task_info>
    var registration: (bgtask_launch_handler, UnsafeMutableRawPointer?)?
    var began: ContinuousClock.Instant?
    var expiration: (bgtask_expiration_handler, UnsafeMutableRawPointer?)?
    var expiryRequested = false
    var expirationDelivered = false
    var expiredAt: ContinuousClock.Instant?
    var expirationHandled: Bool?
    /// The first completion: the app's, or the system's at expiry for want of a handler.
    var firstCompletion: (success: Bool, at: ContinuousClock.Instant, byApp: Bool)?
    var appCalls = 0
    var lastAppCall: ContinuousClock.Instant?
    var reported = false
    var progress: (Int64, Int64)?
    var title: (String, String)?

    init(id: UInt64, identifier: String, type: TaskType) {
        self.id = id
        self.identifier = identifier
        self.type = type
        info = .allocate(capacity: 1)
        info.initialize(to: bgtask_task_info(
            size: UInt32(MemoryLayout<bgtask_task_info>.size), task: id,
            identifier: UnsafePointer(strdup(identifier)), type: bgtask_task_type(type.kind.abiValue)))
    }

    func release() {
        free(UnsafeMutablePointer(mutating: info.pointee.identifier))
        info.deallocate()
    }

    var report: TaskReport {
        var problems: [TestProblem] = []
        if registration != nil {
            if appCalls > 1 {
                problems.append(.completedTwice(identifier: identifier, calls: appCalls))
            } else if appCalls == 0 {
                problems.append(expirationDelivered ? .expiredWithoutCompleting(identifier: identifier) : .neverCompleted(identifier: identifier))
            }
        }
        let outcome: TaskOutcome
        if registration == nil {
            outcome = .notRegistered
        } else if let first = firstCompletion {
            outcome = !first.byApp ? .failed : expirationDelivered && (expiredAt.map { $0 <= first.at } ?? false) ? .expired : first.success ? .succeeded : .failed
        } else {
            outcome = .unfinished
        }
        return TaskReport(
            identifier: identifier, type: type, outcome: outcome, success: firstCompletion?.success,
            completionCalls: appCalls, expired: expirationDelivered, expirationHandled: expirationHandled,
            duration: zip(began, firstCompletion?.at).map { $1 - $0 }, problems: problems)
    }
}

private func zip<A, B>(_ a: A?, _ b: B?) -> (A, B)? {
    guard let a, let b else { return nil }
    return (a, b)
}

extension TestScheduler {
    /// Under `lock`.
    func identifier(of task: UInt64) -> String? { tasks[task]?.identifier }

    func allCompleted(_ ids: [UInt64]) -> Bool {
        lock.withLock { ids.allSatisfy { tasks[$0].map { $0.registration == nil || $0.firstCompletion != nil } ?? true } }
    }
}

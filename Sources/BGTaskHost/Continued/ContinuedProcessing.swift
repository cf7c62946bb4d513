import BGTaskControl
import BGTaskModel
import Foundation

/// Continued-processing tasks (iOS 26's `BGContinuedProcessingTaskRequest`): which run, in which
/// foreground launch, which wait for a slot, their progress as the user sees it, and which have
/// stalled. A value the host keeps and changes on its queue; it starts, expires and closes
/// nothing itself: each decision is returned for the host to carry out on the launch.
struct ContinuedProcessing {
    /// How many run at once (`--max-continued`).
    var slots: Int
    /// How long progress may stand still before the task is expired (`--stall`).
    var stallInterval: TimeInterval

    /// A request waiting for a slot (strategy `.queue`).
    struct Queued {
        var launchID: String
        var request: TaskRequest
    }

    private(set) var queued: [Queued] = []
    /// Running tasks, by launch and task number.
    private(set) var running: [String: [UInt64: ContinuedTaskStatus]] = [:]
    /// Tasks that ended in the last few seconds, so watchers see their last state.
    private var recentlyEnded: [(status: ContinuedTaskStatus, until: Date)] = []
    static let endedShownFor: TimeInterval = 3

    init(slots: Int, stallInterval: TimeInterval) {
        self.slots = slots
        self.stallInterval = stallInterval
    }

    var slotsInUse: Int { running.values.reduce(0) { $0 + $1.count } }
    var isEmpty: Bool { running.values.allSatisfy(\.isEmpty) }

    /// What to do with a request its foreground launch submitted.
    enum Admission: Equatable {
        case start
        case queued
        case refused(SubmissionRules.Rejection)
    }

    mutating func admit(_ request: TaskRequest, in launchID: String) -> Admission {
        if running.values.contains(where: { $0.values.contains { $0.identifier == request.identifier } })
            || queued.contains(where: { $0.request.identifier == request.identifier }) {
            return .refused(.init(status: .immediateRunIneligible, message: "'\(request.identifier)' is already running or queued"))
        }
        if slotsInUse < slots { return .start }
        if request.strategyFail {
            return .refused(.init(status: .immediateRunIneligible, message: "all \(slots) continued-processing slots are busy and the request's strategy is .fail"))
        }
        queued.append(Queued(launchID: launchID, request: request))
        return .queued
    }

    /// A task the host started for `request` in `launchID`.
    mutating func started(_ request: TaskRequest, task: UInt64, in launchID: String, app: String, at now: Date) {
        running[launchID, default: [:]][task] = ContinuedTaskStatus(
            launchID: launchID, app: app, identifier: request.identifier, task: task,
            title: request.title ?? "", subtitle: request.subtitle ?? "", completed: 0, total: 0,
            startedAt: now, progressChangedAt: now, expiring: false)
    }

    /// The next queued request that may start now (a slot is free and its launch runs).
    mutating func nextToStart(isRunning: (String) -> Bool) -> Queued? {
        while slotsInUse < slots, !queued.isEmpty {
            let next = queued.removeFirst()
            if isRunning(next.launchID) { return next }
        }
        return nil
    }

    /// A task of `launchID` ended; false when it was not a continued-processing task.
    @discardableResult
    mutating func ended(_ task: UInt64, in launchID: String, at now: Date) -> Bool {
        guard var status = running[launchID]?.removeValue(forKey: task) else { return false }
        status.ended = true
        recentlyEnded.append((status, now.addingTimeInterval(Self.endedShownFor)))
        return true
    }

    mutating func progress(_ task: UInt64, in launchID: String, completed: Int64, total: Int64, at now: Date) {
        guard var status = running[launchID]?[task] else { return }
        if status.completed != completed || status.total != total {
            status.completed = completed
            status.total = total
            status.progressChangedAt = now
        }
        running[launchID]?[task] = status
    }

    mutating func title(_ task: UInt64, in launchID: String, title: String, subtitle: String?) {
        running[launchID]?[task]?.title = title
        running[launchID]?[task]?.subtitle = subtitle ?? ""
    }

    /// The launch ended: its queued requests die with it (its tasks ended before).
    mutating func launchEnded(_ launchID: String, at now: Date) {
        queued.removeAll { $0.launchID == launchID }
        running[launchID] = nil
        recentlyEnded.removeAll { $0.until < now }
    }

    /// Whether `launchID` has a continued task running or queued.
    func holds(_ launchID: String) -> Bool {
        !(running[launchID]?.isEmpty ?? true) || queued.contains { $0.launchID == launchID }
    }

    /// Running tasks whose progress has not moved for `stallInterval`, marked expiring (each is
    /// returned once) for the host to expire.
    mutating func stalled(at now: Date) -> [(launchID: String, status: ContinuedTaskStatus)] {
        var result: [(String, ContinuedTaskStatus)] = []
        for (launchID, tasks) in running {
            for (task, status) in tasks where !status.expiring && now.timeIntervalSince(status.progressChangedAt) > stallInterval {
                running[launchID]?[task]?.expiring = true
                result.append((launchID, status))
            }
        }
        return result
    }

    /// What the user cancelled (`bgtask cancel-task`): a running task, marked expiring for the
    /// host to expire, or a queued request, removed. Nil when there is no such task.
    enum Cancellation: Equatable {
        case running(launchID: String, task: UInt64)
        case dequeued(launchID: String)
    }

    mutating func cancel(_ identifier: String) -> Cancellation? {
        for (launchID, tasks) in running {
            guard let (task, _) = tasks.first(where: { $0.value.identifier == identifier }) else { continue }
            running[launchID]?[task]?.expiring = true
            return .running(launchID: launchID, task: task)
        }
        if let index = queued.firstIndex(where: { $0.request.identifier == identifier }) {
            return .dequeued(launchID: queued.remove(at: index).launchID)
        }
        return nil
    }

    /// What `bgtask progress` shows: running tasks and those that ended a moment ago, oldest
    /// first.
    mutating func statuses(at now: Date) -> [ContinuedTaskStatus] {
        recentlyEnded.removeAll { $0.until < now }
        return (running.values.flatMap(\.values) + recentlyEnded.map(\.status))
            .sorted { ($0.startedAt, $0.task) < ($1.startedAt, $1.task) }
    }
}

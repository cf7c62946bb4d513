import BGTaskControl
import BGTaskTransfers
import BGTaskModel
import Dispatch
import Foundation

/// When to launch: runs the scheduling pass (`Scheduler`) whenever something may have changed
/// (a submission, a launch ending, the catalog, the clock, the device), starts what it decides,
/// and arms the timers for the next decision: the next due date (real clock) and the device
/// conditions while something waits on them. On the host queue (`@HostActor`), except
/// `requestEvaluation`, which any thread may call.
@HostActor
final class SchedulingLoop: HostPart {
    private let core: HostCore
    private let catalog: AppCatalog
    private let launches: LaunchCoordinator
    private let device: DeviceState
    private let pushes: PushDelivery
    private var stopped = false
    private var dueTimer: DispatchSourceTimer?
    private var conditionsTimer: DispatchSourceTimer?
    private var lastConditions: DeviceConditions?
    private let evaluationQueued = LockedValue(false)
    /// Background transfers: held ones re-evaluated, and launches for finished ones, in each pass.
    var transfers: BackgroundTransfers?

    nonisolated init(core: HostCore, catalog: AppCatalog, launches: LaunchCoordinator, device: DeviceState, pushes: PushDelivery) {
        self.core = core
        self.catalog = catalog
        self.launches = launches
        self.device = device
        self.pushes = pushes
    }

    var partName: String { "scheduling loop" }

    func start() { core.async { self.evaluate() } }

    /// No more passes and no more timers (shutdown). On the queue.
    func stop() {
        stopped = true
        dueTimer?.cancel()
        conditionsTimer?.cancel()
    }

    /// The eligibility rules as they apply now.
    func eligibility(_ conditions: DeviceConditions) -> Eligibility {
        Eligibility(policy: core.configuration.policy, now: core.clock.now, conditions: conditions,
                    runningLaunches: launches.busyCount, maximumConcurrentLaunches: core.configuration.maximumConcurrentLaunches)
    }

    /// Queues one `evaluate()` unless one is queued already: a burst of submissions costs one
    /// scheduling pass, not one each. Any thread.
    nonisolated func requestEvaluation() {
        let first = evaluationQueued.withLock { queued in
            defer { queued = true }
            return !queued
        }
        guard first else { return }
        core.async {
            // Cleared before the pass: a submission committed during it queues another.
            self.evaluationQueued.withLock { $0 = false }
            self.evaluate()
        }
    }

    /// Starts every launch that may start now, then arms the timers for the next decision.
    func evaluate() {
        guard !stopped else { return }
        let conditions = device.conditions()
        device.note(conditions)
        launches.enforce(conditions)
        lastConditions = conditions
        // A running processing task is expired when the device stops being idle or loses the
        // power or network it requires: conditions are watched while one runs.
        var watchConditions = launches.runsProcessingTasks
            // A machine with thermal zones: a background launch is expired when it turns critical,
            // and nothing is launched until it cools.
            || (conditions.sources["thermalState"] == "machine" && (launches.runsBackgroundLaunches || conditions.thermalState == .critical))
        var wakeAt: Date?
        launches.pruneBackoffs()
        do {
            let scheduler = Scheduler(eligibility: eligibility(conditions))
            let (apps, running, runningCount, maximum) = (catalog.apps, launches.runningApps, launches.busyCount, core.configuration.maximumConcurrentLaunches)
            let backingOff = launches.backingOff
            // Every read of the pass in one snapshot (one read transaction).
            let decision = try core.store.withSnapshot(judged: scheduler.eligibility.policy == .realistic) { source throws(BGTaskError) in
                try scheduler.decide(from: source, catalog: apps, running: running, runningCount: runningCount,
                                     maximumLaunches: maximum, backingOff: { backingOff.contains($0) })
            }
            for (bundle, requests) in decision.launches { launches.start(bundle, requests: requests, reason: .scheduled) }
            // All of the pass's launches recorded in one transaction, within the pass.
            launches.recordBegun()
            wakeAt = decision.wakeAt
            watchConditions = watchConditions || decision.watchConditions
        } catch {
            core.logger.error("scheduling failed", metadata: ["error": "\(error)"])
        }
        // Background pushes: after the task requests, in what launch slots are left.
        if let lift = pushes.deliverDue(conditions) { wakeAt = min(wakeAt ?? lift, lift) }
        // At a critical thermal state no background launch starts, a transfer's neither (its
        // transfers wait in the host; the app is launched for them once the device cools).
        if let transfers, conditions.thermalState != .critical {
            let (catalog, launches) = (self.catalog, self.launches)
            let launcher = TransferLauncher(
                runningLaunches: Set(launches.running.keys), isAppRunning: { launches.launch(of: $0) != nil },
                freeSlots: max(0, core.configuration.maximumConcurrentLaunches - launches.busyCount),
                start: { app, eventJSON in
                    guard let bundle = catalog.apps[app] else { return nil }
                    return launches.start(bundle, requests: [], reason: .backgroundTransfer, eventJSON: eventJSON)
                })
            let (lift, watch) = transfers.evaluate(conditions, launcher: launcher)
            if let lift { wakeAt = min(wakeAt ?? lift, lift) }
            watchConditions = watchConditions || watch
        }
        armDueTimer(wakeAt)
        armConditionsTimer(watchConditions)
    }

    private func armDueTimer(_ date: Date?) {
        dueTimer?.cancel()
        dueTimer = nil
        // The virtual clock moves only when told to; nothing to wait for in real time.
        guard let date, core.clock.mode == .real else { return }
        let timer = DispatchSource.makeTimerSource(queue: core.queue)
        timer.schedule(wallDeadline: .now() + max(0, date.timeIntervalSinceNow) + 0.001)
        timer.setEventHandler { [weak self] in self?.evaluate() }
        timer.resume()
        dueTimer = timer
    }

    /// Device conditions have no change notification we can rely on everywhere, so they are
    /// re-read periodically, but only while something depends on them.
    private func armConditionsTimer(_ needed: Bool) {
        guard needed else {
            conditionsTimer?.cancel()
            conditionsTimer = nil
            return
        }
        guard conditionsTimer == nil else { return }
        let timer = DispatchSource.makeTimerSource(queue: core.queue)
        let interval = core.configuration.conditionsInterval.timeInterval
        timer.schedule(deadline: .now() + interval, repeating: interval)
        timer.setEventHandler { [weak self] in
            guard let self else { return }
            if self.device.conditions() != self.lastConditions { self.evaluate() }
        }
        timer.resume()
        conditionsTimer = timer
    }
}

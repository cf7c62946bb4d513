import BGTaskControl
import BGTaskStore
import BGTaskModel
import Foundation

/// The scheduling pass: which apps launch now with which of their requests, when to look again,
/// and whether device conditions must be watched meanwhile. It decides only; the host starts
/// the launches and arms the timers. `Eligibility` says, request by request, what holds it back.
struct Scheduler {
    var eligibility: Eligibility

    struct Decision {
        /// Launches to start now, in order: an app and the requests it runs.
        var launches: [(app: PluginBundle, requests: [StoredRequest])] = []
        /// The earliest moment something may become due or lift (nil: nothing to wait for).
        var wakeAt: Date?
        /// A request waits for power or network: re-read device conditions while it does.
        var watchConditions = false
    }

    /// `running`: apps with a launch now (one launch per app at a time); `catalog`: the valid
    /// bundles; `backingOff`: apps whose last launch could not start, still in their backoff.
    func decide(from source: SchedulingSource, catalog: [String: PluginBundle], running: Set<String>,
                runningCount: Int, maximumLaunches: Int, backingOff: (String) -> Bool) throws(BGTaskError) -> Decision {
        var decision = Decision()
        let now = eligibility.now
        var launching = runningCount
        for app in try source.dueApps(at: now) {
            guard launching < maximumLaunches else { break }
            guard !running.contains(app), let bundle = catalog[app], !backingOff(app) else { continue }
            let state = try source.appState(app)
            var eligible: [StoredRequest] = []
            for stored in try source.pending(app: app) {
                let blockers = eligibility.blockers(for: stored, app: bundle, state: state, appRunning: false).filter(\.blocking)
                if blockers.isEmpty {
                    eligible.append(stored)
                } else {
                    for until in blockers.compactMap(\.until) where until > now { decision.wakeAt = min(decision.wakeAt ?? until, until) }
                    if blockers.contains(where: { $0.knownCode?.liftsWithDeviceConditions == true }) { decision.watchConditions = true }
                }
            }
            if !eligible.isEmpty {
                decision.launches.append((bundle, eligible))
                launching += 1
            }
        }
        if let next = try source.nextDueDate(after: now) { decision.wakeAt = min(decision.wakeAt ?? next, next) }
        return decision
    }
}

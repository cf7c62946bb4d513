import BGTaskControl
import BGTaskModel
import Foundation


/// Background pushes: received (checked as APNs checks them, kept, coalesced per app) and
/// delivered as iOS delivers them, in a launch with reason `remote-notification` whose app
/// delegate gets `application(_:didReceiveRemoteNotification:fetchCompletionHandler:)`.
/// On the host queue (`@HostActor`), except `receive`, which any thread may call.
@HostActor
final class PushDelivery {
    private let core: HostCore
    private let catalog: AppCatalog
    private let launches: LaunchCoordinator
    private let device: DeviceState
    /// False once a pass found no pending push, until one is received: the scheduling pass
    /// then costs no store read for pushes.
    private let mayHavePending = LockedValue(true)

    nonisolated init(core: HostCore, catalog: AppCatalog, launches: LaunchCoordinator, device: DeviceState) {
        self.core = core
        self.catalog = catalog
        self.launches = launches
        self.device = device
    }

    /// Checks and keeps a push, then delivers what may be delivered (on the queue): the push's
    /// report after that pass, or APNs's refusal. An unknown app is APNs's `Unregistered`.
    nonisolated func receive(_ submission: PushSubmission, evaluate: @HostActor () -> Void) -> Result<PushReport, PushRefusal> {
        let push: StoredPush
        switch PushRules.check(submission, now: Date()) {
        case .failure(let refusal): return .failure(refusal)
        case .success(let checked): push = checked
        }
        guard core.sync({ catalog.apps[push.app] != nil }) else {
            return .failure(PushRefusal(410, "Unregistered", "no app \(push.app.prefix(255)) is installed (no valid bundle in \(core.configuration.pluginsDirectory.path))"))
        }
        // A provider that got no answer sends the same push again with the same apns-id; APNs
        // accepts it. The host keeps the push it has (one delivery per apns-id) and answers
        // with where that push stands.
        if let kept = (try? core.store.push(id: push.id)) ?? nil {
            // Another app's push is not this provider's to ask about.
            guard kept.app == push.app else {
                return .failure(PushRefusal(400, "BadMessageId", "apns-id \(push.id) is a push for another app"))
            }
            core.logger.info("push retried", metadata: ["push.id": "\(push.id)", "bundle.id": "\(kept.app)", "state": "\(kept.state.rawValue)"])
            return .success(core.sync { report(kept) })
        }
        do {
            let coalesced = try core.store.enqueuePush(push)
            mayHavePending.withLock { $0 = true }
            core.logger.info("push received", metadata: ["push.id": "\(push.id)", "bundle.id": "\(push.app)", "kind": "\(push.kind.rawValue)",
                                                        "coalesced": "\(coalesced.count)"])
        } catch {
            return .failure(PushRefusal(500, "InternalServerError", "the host could not keep the push: \(error)"))
        }
        return .success(core.sync {
            evaluate()
            return report(id: push.id) ?? PushReport(push)
        })
    }

    /// A push's report, with what holds it back when it is pending. On the queue.
    func report(id: String) -> PushReport? {
        ((try? core.store.push(id: id)) ?? nil).map(report)
    }

    /// The report of a push already read from the store. On the queue.
    func report(_ push: StoredPush) -> PushReport {
        guard push.state == .pending else { return PushReport(push) }
        if case let .hold(blockers) = decide(push, conditions: device.conditions()) { return PushReport(push, blockers: blockers) }
        return PushReport(push)
    }

    private func decide(_ push: StoredPush, conditions: DeviceConditions) -> PushRules.Decision {
        let now = Date()
        let state = (try? core.store.appState(push.app)) ?? AppState(app: push.app)
        let delivered = (try? core.store.backgroundPushDeliveries(app: push.app, since: now.addingTimeInterval(-PushRules.throttleWindow))) ?? []
        return PushRules.decide(
            push, app: catalog.apps[push.app], state: state, conditions: conditions, policy: core.configuration.policy,
            appRunning: launches.launch(of: push.app)?.id, runningLaunches: launches.busyCount,
            maximumLaunches: core.configuration.maximumConcurrentLaunches, deliveredInWindow: delivered, now: now)
    }

    /// Delivers, settles or drops every pending push that can be now; the earliest moment a held
    /// one lifts by itself (a throttle window), if any. On the queue.
    func deliverDue(_ conditions: DeviceConditions) -> Date? {
        guard mayHavePending.withLock({ $0 }) else { return nil }
        guard let pending = try? core.store.pendingPushes(), !pending.isEmpty else {
            mayHavePending.withLock { $0 = false }
            return nil
        }
        var wakeAt: Date?
        for push in pending {
            let now = Date()
            switch decide(push, conditions: conditions) {
            case .deliver:
                guard let bundle = catalog.apps[push.app] else { continue }
                let id = launches.start(bundle, requests: [], reason: .remoteNotification, eventJSON: push.payload,
                                        push: .init(id: push.id, receivedAt: push.receivedAt))
                try? core.store.settlePush(id: push.id, .delivered, detail: "delivered to application(_:didReceiveRemoteNotification:fetchCompletionHandler:)", launchID: id, at: now)
            case .settle(let detail):
                try? core.store.settlePush(id: push.id, .delivered, detail: detail, at: now)
            case .drop(let detail):
                try? core.store.settlePush(id: push.id, .dropped, detail: detail, at: now)
                core.logger.info("push dropped", metadata: ["push.id": "\(push.id)", "bundle.id": "\(push.app)", "why": "\(detail)"])
            case .hold(let blockers):
                for until in blockers.compactMap(\.until) where until > now { wakeAt = min(wakeAt ?? until, until) }
                if let expiration = push.expiration, expiration.timeIntervalSince1970 > 0, expiration > now {
                    wakeAt = min(wakeAt ?? expiration, expiration)
                }
            }
        }
        return wakeAt
    }
}

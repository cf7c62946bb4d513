import BGTaskControl
import BGTaskLaunch
import BGTaskStore
import BGTaskModel
import Dispatch
import Foundation
import Logging

/// Local notifications (`UNUserNotificationCenter`): each app's authorization (the operator's
/// decision), its requests kept durably, and their delivery when due, whether or not the app is
/// running: a timer for the next due date on the real clock, a pass after every `clock advance`
/// on the virtual one. A delivered notification is kept (the newest 100 per app), shown by
/// `bgtask notifications`, and posted to the desktop where a session bus is present.
///
/// A part of its own, with its own serial queue: delivery writes the store (a sync per
/// notification) and must not hold the host's queue, and nothing here needs the other parts'
/// state. Any thread may call its methods.
final class LocalNotifications: @unchecked Sendable {
    private let core: HostCore
    private let queue = DispatchQueue(label: "bgtask.notifications")
    private let desktop: DesktopNotifier?
    /// Confined to `queue`.
    private var timer: DispatchSourceTimer?
    private var stopped = false

    /// The longest the timer sleeps before it looks again (a real clock that jumps).
    static let longestSleep: TimeInterval = 3600

    /// The launch of `app` when the app is in the foreground (`LaunchCoordinator.foreground`).
    private let inForeground: @Sendable (String) -> LaunchControl?

    init(core: HostCore, desktop: DesktopNotifier?, inForeground: @escaping @Sendable (String) -> LaunchControl? = { _ in nil }) {
        self.core = core
        self.desktop = desktop
        self.inForeground = inForeground
    }

    var partName: String { "local notifications" }

    func start() {
        if let desktop {
            core.logger.info("desktop notifications: posting delivered notifications through \(desktop.tool.name)")
        }
        queue.async { self.deliverDue() }
    }

    func stop() {
        queue.sync {
            stopped = true
            timer?.cancel()
            timer = nil
        }
    }

    private var store: PendingRequestStore { core.store }

    // MARK: Authorization

    /// The app's authorization now; with `request`, the app asks (recorded first, so that an
    /// app that asked is `.denied`, not `.notDetermined`, when no switch says otherwise).
    func authorization(app: String, options: UInt32 = 0, request: Bool = false) throws(BGTaskError) -> NotificationAuthorization {
        if request { try store.recordNotificationRequest(app: app, options: options, at: core.clock.now) }
        let state = try store.notificationAppState(app)
        return NotificationAuthorization.decide(appSwitch: state.allowed, hostDefault: core.configuration.allowNotifications,
                                                asked: state.askedAt != nil)
    }

    // MARK: Requests

    /// The outcome of an `add`: BGTASK_OK (0) or a BGTASK_E_* status with a message.
    struct Outcome: Sendable {
        var status: Int32
        var message: String?
        static let ok = Outcome(status: 0, message: nil)
    }

    static let notAllowed: Int32 = 110
    static let noDate: Int32 = 111
    static let invalidArgument: Int32 = 100
    static let hostFailed: Int32 = 101

    /// Adds (or replaces) a request for `app`: refused when the app is not authorized, when a
    /// field is over its limit, or when a calendar trigger matches no date. Due now (no
    /// trigger), it is delivered at once.
    func add(_ request: NotificationRequest, app: String, launchID: String?) -> Outcome {
        if let problem = request.problem { return Outcome(status: Self.invalidArgument, message: "invalid notification request: \(problem)") }
        do {
            let status = try authorization(app: app)
            guard status == .authorized else {
                return Outcome(status: Self.notAllowed, message: "notifications are not allowed for \(app) (\(status.name); the operator allows them with bgtask device --app \(app) --notifications on)")
            }
            let now = core.clock.now
            var fireAt = now
            if let trigger = request.trigger {
                guard let first = trigger.firstDate(addedAt: now) else {
                    return Outcome(status: Self.noDate, message: "the calendar trigger of \(request.identifier) matches no date after \(ISO8601DateFormatter().string(from: now))")
                }
                fireAt = first
            }
            let discarded = try store.addNotification(app: app, request: request, addedAt: now, fireAt: fireAt, launchID: launchID)
            if !discarded.isEmpty {
                core.logger.notice("an app has more than 64 pending notifications: the ones that fire last are discarded, as on iOS",
                                   metadata: ["bundle.id": "\(app)", "discarded": "\(discarded.joined(separator: ", "))"])
            }
            if fireAt <= now { requestEvaluation() } else { rearm() }
            return .ok
        } catch {
            core.logger.error("cannot add a notification", metadata: ["bundle.id": "\(app)", "error": "\(error)"])
            return Outcome(status: Self.hostFailed, message: "\(error)")
        }
    }

    func pending(app: String) throws(BGTaskError) -> [StoredNotification] { try store.pendingNotifications(app: app) }

    /// The app's delivered notifications, newest first (as `getDeliveredNotifications` lists them).
    func delivered(app: String) throws(BGTaskError) -> [StoredNotification] { try store.deliveredNotifications(app: app).reversed() }

    func remove(app: String, delivered: Bool, identifiers: [String]?) throws(BGTaskError) {
        try store.removeNotifications(app: app, delivered: delivered, identifiers: identifiers)
        if !delivered { rearm() }
    }

    // MARK: Delivery

    /// Delivers what is due now, then returns (after `clock advance`: what became due has been
    /// delivered when the answer comes). Any thread but this part's queue.
    func evaluateNow() { queue.sync { deliverDue() } }

    /// Queues a delivery pass. Any thread.
    func requestEvaluation() { queue.async { self.deliverDue() } }

    /// Re-arms the timer for the next due date (a request added or removed).
    private func rearm() { queue.async { self.armTimer() } }

    /// On the queue.
    private func deliverDue() {
        guard !stopped else { return }
        let now = core.clock.now
        do {
            // In batches: a host that was down a long time may find many due at once.
            while true {
                let due = try store.dueNotifications(at: now)
                for notification in due {
                    let fireDate = notification.fireDate ?? now
                    let next = notification.request.trigger?.nextDate(after: fireDate, now: now)
                    guard let delivered = try store.deliverNotification(notification, at: now, next: next) else { continue }
                    core.logger.info("notification delivered", metadata: [
                        "bundle.id": "\(delivered.app)", "identifier": "\(delivered.request.identifier)",
                        "title": "\(delivered.request.content.title)",
                    ])
                    // In the foreground, the app's delegate decides how it is shown (`willPresent`;
                    // its answer is in the launch's record); otherwise the desktop shows it.
                    if let launch = inForeground(delivered.app) {
                        // On the app's clock, as every date that crosses to it (see HostRequestBroker).
                        launch.presentNotification(NotificationEntry(request: delivered.request,
                                                                     date: (delivered.deliveredAt ?? now).timeIntervalSince1970 - core.clock.appOffset))
                    } else {
                        desktop?.post(app: delivered.app, content: delivered.request.content)
                    }
                }
                if due.count < 256 { break }
            }
        } catch {
            core.logger.error("cannot deliver notifications", metadata: ["error": "\(error)"])
        }
        armTimer()
    }

    /// On the queue: a timer for the next due date on the real clock (the virtual clock moves
    /// only when told to, and `clock advance` delivers).
    private func armTimer() {
        timer?.cancel()
        timer = nil
        guard !stopped, core.clock.mode == .real else { return }
        let next: Date?
        do { next = try store.nextNotificationDate() } catch {
            core.logger.error("cannot read the next notification date", metadata: ["error": "\(error)"])
            return
        }
        guard let next else { return }
        let delay = min(Self.longestSleep, max(0, next.timeIntervalSinceNow))
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(wallDeadline: .now() + delay + 0.001)
        timer.setEventHandler { [weak self] in self?.deliverDue() }
        timer.resume()
        self.timer = timer
    }
}

extension LocalNotifications: HostPart {}

import BGTaskControl
import BGTaskModel
import BGTaskWire
import Foundation

/// Answers the requests a launch makes of its host (submit, cancel, pending; local notifications).
public protocol LaunchRequestBroker: Sendable {
    func submit(_ request: TaskRequest, app: PluginBundle) -> SubmissionRules.Rejection?
    func cancel(identifier: String?, app: PluginBundle)
    func pending(app: PluginBundle) -> [TaskRequest]
    /// The app's device token for pushes (`registerForRemoteNotifications`), or why there is none.
    func deviceToken(app: PluginBundle) -> Result<String, SubmissionRules.Rejection>
    /// A local-notification call (`UNUserNotificationCenter`) and its answer.
    func notifications(_ call: NotificationCall, app: PluginBundle) -> NotificationAnswer
    /// A background URL session's call (already checked with `TransferCall.problem`), from
    /// launch `launchID` whose `control` carries the session's events to it.
    func transfer(_ call: TransferCall, app: PluginBundle, launchID: String, control: LaunchControl?) -> TransferCallAnswer
}

extension LaunchRequestBroker {
    /// Without a host (`bgtask run`) nothing carries transfers.
    public func transfer(_ call: TransferCall, app: PluginBundle, launchID: String, control: LaunchControl?) -> TransferCallAnswer {
        .failure(TransferCallAnswer.unavailable, "unavailable: background transfers need a running host (bgtask host)")
    }
}

/// The answer to a `TransferCall`: a status (0; `invalidArgument` with the field named;
/// `unavailable`; `failed`), the reply, and the transfer a `delivered` call delivered.
public struct TransferCallAnswer: Sendable, Equatable {
    public var status: Int32 = 0
    public var message: String?
    public var reply: TransferReply?
    public var delivered: String?

    public init(status: Int32 = 0, message: String? = nil, reply: TransferReply? = nil, delivered: String? = nil) {
        self.status = status
        self.message = message
        self.reply = reply
        self.delivered = delivered
    }

    public static func failure(_ status: Int32, _ message: String) -> TransferCallAnswer { TransferCallAnswer(status: status, message: message) }
    /// BGTASK_E_INVALID_ARGUMENT.
    public static let invalidArgument: Int32 = 100
    public static let unavailable: Int32 = 1
    public static let failed: Int32 = 101
}

/// What a launch asks of the notification center.
public enum NotificationCall: Sendable, Equatable {
    case authorization(options: UInt32, request: Bool)
    case add(NotificationRequest)
    case list(delivered: Bool)
    case remove(delivered: Bool, identifiers: [String]?)

    /// The call a channel message carries, and its sequence number.
    package init?(_ message: ChildMessage) {
        switch message {
        case let .notificationAuthorization(_, options, request): self = .authorization(options: options, request: request)
        case let .notificationAdd(_, request): self = .add(request)
        case let .notificationList(_, delivered): self = .list(delivered: delivered)
        case let .notificationRemove(_, delivered, identifiers): self = .remove(delivered: delivered, identifiers: identifiers)
        default: return nil
        }
    }
}

/// The answer: a status (0, or a BGTASK_E_* with `message`), the app's authorization, and a
/// list's entries.
public struct NotificationAnswer: Sendable, Equatable {
    public var status: Int32 = 0
    public var message: String?
    public var authorization: NotificationAuthorization = .notDetermined
    public var entries: [NotificationEntry] = []

    public init(status: Int32 = 0, message: String? = nil, authorization: NotificationAuthorization = .notDetermined, entries: [NotificationEntry] = []) {
        self.status = status
        self.message = message
        self.authorization = authorization
        self.entries = entries
    }
}

/// The broker of a one-shot `bgtask run`: requests live as long as the process.
public final class InMemoryRequestBroker: LaunchRequestBroker, @unchecked Sendable {
    private let lock = NSLock()
    private var requests: [String: [TaskRequest]] = [:]
    /// `bgtask run --notifications on|off`: the operator's switch for the one launch (nil: not
    /// set, as on a fresh device).
    private let notificationsAllowed: Bool?
    private var asked = false
    /// Pending requests (with their next date) and delivered notifications, for the launch.
    private var pendingNotifications: [NotificationEntry] = []
    private var deliveredNotifications: [NotificationEntry] = []

    public init(notificationsAllowed: Bool? = nil) {
        self.notificationsAllowed = notificationsAllowed
    }

    /// One launch, no host: requests due at once are delivered at once; others stay pending
    /// for as long as the process lives (nothing delivers them later).
    public func notifications(_ call: NotificationCall, app: PluginBundle) -> NotificationAnswer {
        lock.withLock {
            if case let .authorization(_, request) = call, request { asked = true }
            let authorization = NotificationAuthorization.decide(appSwitch: notificationsAllowed, hostDefault: false, asked: asked)
            var answer = NotificationAnswer(authorization: authorization)
            switch call {
            case .authorization: break
            case let .add(request):
                if let problem = request.problem { return NotificationAnswer(status: 100, message: "invalid notification request: \(problem)", authorization: authorization) }
                guard authorization == .authorized else {
                    return NotificationAnswer(status: 110, message: "notifications are not allowed for \(app.identifier) (bgtask run --notifications on allows them)", authorization: authorization)
                }
                let now = Date()
                var date = now
                if let trigger = request.trigger {
                    guard let first = trigger.firstDate(addedAt: now) else {
                        return NotificationAnswer(status: 111, message: "the calendar trigger of \(request.identifier) matches no date", authorization: authorization)
                    }
                    date = first
                }
                pendingNotifications.removeAll { $0.request.identifier == request.identifier }
                if request.trigger == nil {
                    deliveredNotifications.removeAll { $0.request.identifier == request.identifier }
                    deliveredNotifications.insert(NotificationEntry(request: request, date: now.timeIntervalSince1970), at: 0)
                } else {
                    pendingNotifications.append(NotificationEntry(request: request, date: date.timeIntervalSince1970))
                    pendingNotifications.sort { ($0.date ?? 0) < ($1.date ?? 0) }
                    if pendingNotifications.count > NotificationLimits.pendingPerApp { pendingNotifications.removeLast(pendingNotifications.count - NotificationLimits.pendingPerApp) }
                }
            case let .list(delivered): answer.entries = delivered ? deliveredNotifications : pendingNotifications
            case let .remove(delivered, identifiers):
                if delivered {
                    deliveredNotifications.removeAll { entry in identifiers.map { $0.contains(entry.request.identifier) } ?? true }
                } else {
                    pendingNotifications.removeAll { entry in identifiers.map { $0.contains(entry.request.identifier) } ?? true }
                }
            }
            return answer
        }
    }

    public func submit(_ request: TaskRequest, app: PluginBundle) -> SubmissionRules.Rejection? {
        lock.withLock {
            let pending = requests[app.identifier] ?? []
            if let rejection = SubmissionRules.check(request, app: app, pending: pending) { return rejection }
            requests[app.identifier] = pending.filter { $0.identifier != request.identifier } + [request]
            return nil
        }
    }

    public func cancel(identifier: String?, app: PluginBundle) {
        lock.withLock {
            if let identifier {
                requests[app.identifier]?.removeAll { $0.identifier == identifier }
            } else {
                requests[app.identifier] = []
            }
        }
    }

    public func pending(app: PluginBundle) -> [TaskRequest] {
        lock.withLock { requests[app.identifier] ?? [] }
    }

    /// A one-shot run has no host to push through: a token derived from the app's identifier
    /// (stable, and never one a host made).
    public func deviceToken(app: PluginBundle) -> Result<String, SubmissionRules.Rejection> {
        var words: [UInt64] = []
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for round in 0..<4 {
            for byte in Array("bgtask-run:\(round):\(app.containingApp ?? app.identifier)".utf8) {
                hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
            }
            words.append(hash)
        }
        return .success(words.map { String(format: "%016llx", $0) }.joined())
    }
}

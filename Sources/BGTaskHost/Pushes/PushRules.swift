import BGTaskControl
import BGTaskModel
import BGTaskSystem
import Foundation

/// A push as a provider sends it (the APNs endpoint's request, or `bgtask push`), before it is
/// checked: APNs's headers and the payload.
public struct PushSubmission: Sendable, Equatable {
    public var app: String
    public var payload: Data
    /// apns-push-type: "background", "alert" (nil: from the payload).
    public var pushType: String?
    /// apns-priority: 10, 5 or 1 (nil: 5 for a background push, 10 otherwise).
    public var priority: Int?
    /// apns-expiration, seconds since 1970 (0: now or never).
    public var expiration: Double?
    public var collapseID: String?
    /// apns-id (nil: one is made).
    public var id: String?

    public init(app: String, payload: Data, pushType: String? = nil, priority: Int? = nil,
                expiration: Double? = nil, collapseID: String? = nil, id: String? = nil) {
        self.app = app
        self.payload = payload
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.id = id
    }
}

/// Why a push is refused as APNs refuses it: the HTTP status and APNs's `reason`.
public struct PushRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    public var status: Int
    public var reason: String
    public var message: String
    public var description: String { "\(reason): \(message)" }

    init(_ status: Int, _ reason: String, _ message: String) {
        self.status = status
        self.reason = reason
        self.message = message
    }
}

/// APNs's rules for accepting a push, and iOS's for delivering it.
public enum PushRules {
    /// APNs's payload limit.
    public static let maximumPayloadBytes = 4096
    /// apns-collapse-id's limit.
    public static let maximumCollapseIDBytes = 64
    /// Background pushes delivered per app per hour in the `realistic` policy (Apple: "two or
    /// three per hour"); the rest wait.
    public static let backgroundPushesPerHour = 3
    public static let throttleWindow: TimeInterval = 3600
    /// The time a background push's handler has before it expires (iOS: about 30 s).
    public static let handlerBudget: Duration = .seconds(30)

    /// The push to keep, or APNs's refusal.
    public static func check(_ submission: PushSubmission, now: Date) -> Result<StoredPush, PushRefusal> {
        let payload = submission.payload
        guard !payload.isEmpty else { return .failure(.init(400, "PayloadEmpty", "the payload is empty")) }
        guard payload.count <= maximumPayloadBytes else {
            return .failure(.init(413, "PayloadTooLarge", "the payload is \(payload.count) bytes, over APNs's limit of \(maximumPayloadBytes)"))
        }
        guard let object = try? JSONSerialization.jsonObject(with: payload) as? [String: Any] else {
            return .failure(.init(400, "BadPayload", "the payload is not a JSON object"))
        }
        guard let aps = object["aps"] as? [String: Any] else {
            return .failure(.init(400, "BadPayload", "the payload has no \"aps\" dictionary"))
        }
        let contentAvailable = (aps["content-available"] as? NSNumber)?.intValue == 1
        let kind: StoredPush.Kind
        switch submission.pushType {
        case nil: kind = contentAvailable ? .background : .alert
        case "background":
            guard contentAvailable else {
                return .failure(.init(400, "InvalidPushType", "apns-push-type background needs \"content-available\": 1 in aps"))
            }
            kind = .background
        case "alert": kind = contentAvailable ? .background : .alert
        case let other?:
            return .failure(.init(400, "InvalidPushType", "apns-push-type '\(other.prefix(32))' is not one bgtask delivers (background, alert)"))
        }
        let priority = submission.priority ?? (kind == .background ? 5 : 10)
        guard [1, 5, 10].contains(priority) else {
            return .failure(.init(400, "BadPriority", "apns-priority must be 10, 5 or 1, not \(priority)"))
        }
        if priority == 10 && contentAvailable {
            return .failure(.init(400, "BadPriority", "apns-priority 10 is an error for a payload with content-available (use 5)"))
        }
        var expiration: Date?
        if let seconds = submission.expiration {
            guard seconds.isFinite, seconds >= 0, seconds < 1e11 else {
                return .failure(.init(400, "BadExpirationDate", "apns-expiration must be seconds since 1970 (or 0), not \(seconds)"))
            }
            expiration = Date(timeIntervalSince1970: seconds)
        }
        if let collapse = submission.collapseID, collapse.utf8.count > maximumCollapseIDBytes {
            return .failure(.init(400, "BadCollapseId", "apns-collapse-id is \(collapse.utf8.count) bytes, over \(maximumCollapseIDBytes)"))
        }
        // Kept in canonical form (upper-case), so a retry written in another case is the same
        // push; the APNs endpoint answers with the apns-id exactly as the provider sent it.
        let id: String
        if let given = submission.id {
            guard let uuid = UUID(uuidString: given) else {
                return .failure(.init(400, "BadMessageId", "apns-id '\(given.prefix(40))' is not a UUID"))
            }
            id = uuid.uuidString
        } else {
            id = RandomIdentifier.uuidString()
        }
        return .success(StoredPush(
            id: id, app: submission.app, payload: String(decoding: payload, as: UTF8.self), kind: kind, priority: priority,
            expiration: expiration, collapseID: submission.collapseID, receivedAt: now, state: .pending))
    }

    /// What to do with a pending push now.
    public enum Decision: Equatable {
        /// Launch the app with it.
        case deliver
        /// Done with it without a launch (an alert push is shown, not launched for).
        case settle(String)
        case drop(String)
        /// It waits; the blockers say why (and until when, for those that lift by themselves).
        case hold([Blocker])
    }

    /// iOS's rules for delivering a pending push: a pure function of its inputs, so the push's
    /// answer, `why` and the delivery never disagree.
    public static func decide(
        _ push: StoredPush, app bundle: PluginBundle?, state: AppState, conditions: DeviceConditions, policy: SchedulingPolicy,
        appRunning: String?, runningLaunches: Int, maximumLaunches: Int, deliveredInWindow: [Date], now: Date
    ) -> Decision {
        guard let bundle else { return .drop("the app is not installed (no valid bundle with its identifier)") }
        if let expiration = push.expiration, expiration.timeIntervalSince1970 > 0, expiration < now {
            return .drop("expired: not deliverable before its apns-expiration")
        }
        guard push.kind == .background else {
            return .settle("an alert push is shown to the user; the app is not launched for it")
        }
        guard bundle.backgroundModes.contains("remote-notification") else {
            return .drop("\(bundle.identifier) has no 'remote-notification' in UIBackgroundModes: background pushes are not delivered to it")
        }
        var blockers: [Blocker] = []
        if !conditions.backgroundRefresh { blockers.append(Blocker(.refreshDisabled, "Background App Refresh is off for the device")) }
        if !state.refreshEnabled { blockers.append(Blocker(.appRefreshDisabled, "Background App Refresh is off for \(state.app)")) }
        if conditions.lowPowerMode { blockers.append(Blocker(.lowPowerMode, "Low Power Mode is on: background pushes wait")) }
        if conditions.thermalState == .critical {
            blockers.append(Blocker(.thermalState, "the device's thermal state is critical: background pushes wait until it cools"))
        }
        if let appRunning { blockers.append(Blocker(.appRunning, "\(state.app) is running launch \(appRunning); the push is delivered when it ends")) }
        if runningLaunches >= maximumLaunches {
            blockers.append(Blocker(.concurrency, "\(runningLaunches) launches are running, the most at once (--max-launches)"))
        }
        if policy == .realistic, deliveredInWindow.count >= backgroundPushesPerHour, let oldest = deliveredInWindow.first {
            let until = oldest.addingTimeInterval(throttleWindow)
            blockers.append(Blocker(.rateLimit, "throttled: \(deliveredInWindow.count) background pushes were delivered to \(state.app) in the last hour (the budget is \(backgroundPushesPerHour))", until: until))
        }
        guard blockers.isEmpty else {
            // apns-expiration 0: now or never.
            if push.expiration?.timeIntervalSince1970 == 0 {
                return .drop("not deliverable at once and its apns-expiration is 0 (now or never): " + blockers.map(\.message).joined(separator: "; "))
            }
            return .hold(blockers)
        }
        return .deliver
    }
}

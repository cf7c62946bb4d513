import BGTaskModel
import Foundation

/// A command with the answer it gets, typed: `try client.call(.pending(app: "com.example.feed"))`
/// is `[StoredRequest]`, `try client.call(.device())` is `DeviceConditions`. The host's refusal
/// is thrown as a `ControlFailure`; an answer without what its command must carry (a host that
/// speaks another version) is thrown as `ControlFailure(.internalError, …)` naming the field.
///
/// The wire is `ControlResponse`'s: one flat object whatever the command, so that scripts and
/// older peers keep reading it. This is its one typed reading, per command.
public struct ControlCall<Answer: Sendable>: Sendable {
    public let command: ControlCommand
    private let read: @Sendable (ControlResponse) throws(ControlFailure) -> Answer

    private init(_ command: ControlCommand, _ read: @escaping @Sendable (ControlResponse) throws(ControlFailure) -> Answer) {
        self.command = command
        self.read = read
    }

    /// The typed answer in `response`, or the failure it carries.
    public func answer(_ response: ControlResponse) throws(ControlFailure) -> Answer {
        if let failure = response.failure { throw failure }
        return try read(response)
    }

    /// `field` of the answer, which the command's answer must carry.
    private static func required<T>(_ value: T?, _ field: String, _ command: ControlCommand) throws(ControlFailure) -> T {
        guard let value else {
            throw ControlFailure(.internalError, "the host's answer to \(command.verb.rawValue) has no '\(field)'")
        }
        return value
    }

    /// A command whose answer is `ok` and nothing more.
    private static func done(_ command: ControlCommand) -> ControlCall<Void> { ControlCall<Void>(command) { _ throws(ControlFailure) in } }
}

// MARK: - The answers that are more than one field

/// `apps`: one page of the catalog.
public struct AppsPage: Sendable, Equatable {
    public var apps: [AppSummary]
    /// Bundles that are not valid, with why (on the first page only).
    public var invalid: [InvalidBundle]
    /// The `after` of the next page; nil on the last.
    public var next: String?
    /// Invalid bundles left out so that the answer fits a frame.
    public var omitted: Int
}

/// `history`: records, newest first.
public struct HistoryPage: Sendable, Equatable {
    public var records: [RunRecord]
    /// The oldest records asked for, left out so that the answer fits a frame.
    public var omitted: Int
}

/// A launch by hand (`simulate-launch`, `extension-run`, `open`): its id, and its record when
/// the command waited for it.
public struct LaunchAnswer: Sendable, Equatable {
    public var launchID: String
    public var record: RunRecord?
}

/// `why`: a request's state and what holds it back, or a push's or a transfer's.
public struct WhyAnswer: Sendable, Equatable {
    public var request: WhyReport?
    public var push: PushReport?
    public var transfer: TransferReport?
}

/// `notifications`, `pending-notifications`: the notifications and the authorization of the
/// apps concerned.
public struct NotificationsAnswer: Sendable, Equatable {
    public var notifications: [StoredNotification]
    public var apps: [NotificationAppReport]
}

/// `transfers`: reports, newest first.
public struct TransfersPage: Sendable, Equatable {
    public var transfers: [TransferReport]
    /// Reports left out so that the answer fits a frame.
    public var omitted: Int
}

// MARK: - One typed call per command

extension ControlCall where Answer == Void {
    public static var status: Self { done(.status) }
    public static func submit(app: String, request: TaskRequest, delay: Double? = nil) -> Self { done(.submit(app: app, request: request, delay: delay)) }
    public static func simulateExpire(identifier: String) -> Self { done(.simulateExpire(identifier: identifier)) }
    public static func cancelTask(identifier: String) -> Self { done(.cancelTask(identifier: identifier)) }
}

extension ControlCall where Answer == Int {
    /// The number of requests removed.
    public static func cancel(app: String, identifier: String) -> Self {
        let command = ControlCommand.cancel(app: app, identifier: identifier)
        return Self(command) { response throws(ControlFailure) in try required(response.removed, "removed", command) }
    }

    /// The number of requests removed.
    public static func cancelAll(app: String) -> Self {
        let command = ControlCommand.cancelAll(app: app)
        return Self(command) { response throws(ControlFailure) in try required(response.removed, "removed", command) }
    }
}

extension ControlCall where Answer == Bool {
    /// Whether the app had a suspended process to end.
    public static func evict(app: String) -> Self {
        let command = ControlCommand.evict(app: app)
        return Self(command) { response throws(ControlFailure) in try required(response.removed, "removed", command) > 0 }
    }
}

extension ControlCall where Answer == AppsPage {
    public static func apps(limit: Int? = nil, after: String? = nil) -> Self {
        let command = ControlCommand.apps(limit: limit, after: after)
        return Self(command) { response throws(ControlFailure) in
            AppsPage(apps: try required(response.apps, "apps", command), invalid: response.invalid ?? [], next: response.next,
                     omitted: response.omitted ?? 0)
        }
    }
}

extension ControlCall where Answer == [StoredRequest] {
    public static func pending(app: String? = nil) -> Self {
        let command = ControlCommand.pending(app: app)
        return Self(command) { response throws(ControlFailure) in try required(response.pending, "pending", command) }
    }
}

extension ControlCall where Answer == HistoryPage {
    public static func history(app: String? = nil, limit: Int? = nil) -> Self {
        let command = ControlCommand.history(app: app, limit: limit)
        return Self(command) { response throws(ControlFailure) in
            HistoryPage(records: try required(response.records, "records", command), omitted: response.omitted ?? 0)
        }
    }
}

extension ControlCall where Answer == WhyAnswer {
    public static func why(identifier: String, app: String? = nil) -> Self {
        let command = ControlCommand.why(identifier: identifier, app: app)
        return Self(command) { response throws(ControlFailure) in
            let answer = WhyAnswer(request: response.why, push: response.push, transfer: response.transfers?.first)
            guard answer.request != nil || answer.push != nil || answer.transfer != nil else {
                throw ControlFailure(.internalError, "the host's answer to why has no 'why', 'push' or 'transfers'")
            }
            return answer
        }
    }
}

extension ControlCall where Answer == DeviceConditions {
    /// The device conditions, after applying `changes` (none: only read them).
    public static func device(_ changes: DeviceChanges = DeviceChanges()) -> Self {
        let command = ControlCommand.device(changes)
        return Self(command) { response throws(ControlFailure) in try required(response.device, "device", command) }
    }
}

extension ControlCall where Answer == ClockReport {
    public static func clock(advance: Double? = nil) -> Self {
        let command = ControlCommand.clock(advance: advance)
        return Self(command) { response throws(ControlFailure) in try required(response.clock, "clock", command) }
    }
}

extension ControlCall where Answer == LaunchAnswer {
    public static func simulateLaunch(identifier: String, app: String? = nil, force: Bool = false, kind: TaskKind? = nil, wait: Bool = true) -> Self {
        launch(.simulateLaunch(identifier: identifier, app: app, force: force, kind: kind, wait: wait), wait: wait)
    }

    public static func extensionRun(identifier: String, event: String? = nil, wait: Bool = true) -> Self {
        launch(.extensionRun(identifier: identifier, event: event, wait: wait), wait: wait)
    }

    public static func open(app: String, event: String? = nil, wait: Bool = false) -> Self {
        launch(.open(app: app, event: event, wait: wait), wait: wait)
    }

    public static func respond(notification: Int64, action: String? = nil, wait: Bool = false) -> Self {
        launch(.respond(notification: notification, action: action, wait: wait), wait: wait)
    }

    private static func launch(_ command: ControlCommand, wait: Bool) -> Self {
        Self(command) { response throws(ControlFailure) in
            let record = wait ? try required(response.record, "record", command) : response.record
            return LaunchAnswer(launchID: try required(response.launchID ?? record?.launchID, "launch_id", command), record: record)
        }
    }
}

extension ControlCall where Answer == [ContinuedTaskStatus] {
    public static var progress: Self {
        Self(.progress) { response throws(ControlFailure) in try required(response.continued, "continued", .progress) }
    }
}

extension ControlCall where Answer == NotificationsAnswer {
    public static func notifications(app: String? = nil, after: Int64? = nil, limit: Int? = nil) -> Self {
        notifications(.notifications(app: app, after: after, limit: limit))
    }

    public static func pendingNotifications(app: String? = nil) -> Self {
        notifications(.pendingNotifications(app: app))
    }

    private static func notifications(_ command: ControlCommand) -> Self {
        Self(command) { response throws(ControlFailure) in
            NotificationsAnswer(notifications: try required(response.notifications, "notifications", command),
                                apps: response.notificationApps ?? [])
        }
    }
}

extension ControlCall where Answer == PushReport {
    /// What became of the push. A refusal's APNs reason is in the thrown failure's message.
    public static func push(app: String, _ body: PushBody) -> Self {
        let command = ControlCommand.push(app: app, body)
        return Self(command) { response throws(ControlFailure) in try required(response.push, "push", command) }
    }
}

extension ControlCall where Answer == [PushReport] {
    public static func pushes(app: String? = nil, limit: Int? = nil) -> Self {
        let command = ControlCommand.pushes(app: app, limit: limit)
        return Self(command) { response throws(ControlFailure) in try required(response.pushes, "pushes", command) }
    }
}

extension ControlCall where Answer == String {
    /// The app's device token (64 hex digits).
    public static func deviceToken(app: String) -> Self {
        let command = ControlCommand.deviceToken(app: app)
        return Self(command) { response throws(ControlFailure) in try required(response.deviceToken, "device_token", command) }
    }
}

extension ControlCall where Answer == TransfersPage {
    public static func transfers(app: String? = nil, limit: Int? = nil) -> Self {
        let command = ControlCommand.transfers(app: app, limit: limit)
        return Self(command) { response throws(ControlFailure) in
            TransfersPage(transfers: try required(response.transfers, "transfers", command), omitted: response.omitted ?? 0)
        }
    }
}

extension ControlClient {
    /// Sends `call`'s command and reads its typed answer. A host that cannot be reached throws
    /// `BGTaskError`'s failure as `ControlFailure(.unavailable, …)`.
    public func call<Answer>(_ call: ControlCall<Answer>) throws(ControlFailure) -> Answer {
        let response: ControlResponse
        do { response = try send(call.command) } catch { throw ControlFailure(.unavailable, error.description) }
        return try call.answer(response)
    }
}

extension ControlCall where Answer == [MetricReport] {
    public static func metrics(app: String) -> Self {
        let command = ControlCommand.metrics(app: app)
        return Self(command) { response throws(ControlFailure) in try required(response.metrics, "metrics", command) }
    }
}

extension ControlCall where Answer == [RunningLaunchReport] {
    public static var running: Self {
        let command = ControlCommand.running
        return Self(command) { response throws(ControlFailure) in try required(response.running, "running launches", command) }
    }
}

import BGTaskModel
import Foundation

/// A push as the host keeps it (table `push`).
public struct StoredPush: Sendable, Equatable, Codable {
    public enum Kind: String, Codable, Sendable {
        /// `"content-available": 1`: launches the app in the background.
        case background
        /// An alert (or sound, badge): shown to the user; the app is not launched for it.
        case alert
    }

    public enum State: String, Codable, Sendable { case pending, delivered, dropped }

    /// The apns-id.
    public var id: String
    public var app: String
    /// The payload as received (a JSON object with `aps`).
    public var payload: String
    public var kind: Kind
    public var priority: Int
    /// apns-expiration: the push is dropped if it cannot be delivered by then; 0, now or never.
    public var expiration: Date?
    public var collapseID: String?
    public var receivedAt: Date
    public var state: State
    /// Why it was dropped, or how it was delivered.
    public var detail: String?
    public var launchID: String?
    public var settledAt: Date?

    enum CodingKeys: String, CodingKey {
        case id, app, payload, kind, priority, expiration, state, detail
        case collapseID = "collapse_id", receivedAt = "received_at", launchID = "launch_id", settledAt = "settled_at"
    }

    /// The memberwise initializer, for the modules above this one.
    package init(id: String, app: String, payload: String, kind: Kind, priority: Int, expiration: Date? = nil, collapseID: String? = nil, receivedAt: Date, state: State, detail: String? = nil, launchID: String? = nil, settledAt: Date? = nil) {
        self.id = id
        self.app = app
        self.payload = payload
        self.kind = kind
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.receivedAt = receivedAt
        self.state = state
        self.detail = detail
        self.launchID = launchID
        self.settledAt = settledAt
    }
}

/// A push and where it stands, as `push`, `pushes` and `why` answer.
public struct PushReport: Codable, Sendable, Equatable {
    public var id: String
    public var app: String
    public var kind: StoredPush.Kind
    public var priority: Int
    public var state: StoredPush.State
    public var detail: String?
    public var launchID: String?
    public var receivedAt: Date
    public var collapseID: String?
    /// What holds a pending push back.
    public var blockers: [Blocker]?

    enum CodingKeys: String, CodingKey {
        case id, app, kind, priority, state, detail, blockers
        case launchID = "launch_id", receivedAt = "received_at", collapseID = "collapse_id"
    }

    package init(_ push: StoredPush, blockers: [Blocker]? = nil) {
        id = push.id
        app = push.app
        kind = push.kind
        priority = push.priority
        state = push.state
        detail = push.detail
        launchID = push.launchID
        receivedAt = push.receivedAt
        collapseID = push.collapseID
        self.blockers = blockers
    }

    /// One line for people.
    public var text: String {
        var line = "push \(id) for \(app) (\(kind.rawValue), priority \(priority)): \(state.rawValue)"
        if let launchID { line += " in launch \(launchID)" }
        if let detail { line += ": \(detail)" }
        if let blockers, !blockers.isEmpty {
            line += ": waiting: " + blockers.map { blocker in
                blocker.message + (blocker.until.map { " (until \(ISO8601DateFormatter().string(from: $0)))" } ?? "")
            }.joined(separator: "; ")
        }
        return line
    }
}

import BGTaskModel
import Foundation

// The store's rows as values: what the control protocol answers with and the test kit reads.

/// A request as the host keeps it.
public struct StoredRequest: Sendable, Equatable, Codable {
    public var app: String
    public var request: TaskRequest
    public var submittedAt: Date
    /// The launch running it now, or nil while it is pending.
    public var runningLaunch: String?

    public init(app: String, request: TaskRequest, submittedAt: Date, runningLaunch: String? = nil) {
        self.app = app
        self.request = request
        self.submittedAt = submittedAt
        self.runningLaunch = runningLaunch
    }

    /// `earliestBeginDate` as a Date (nil: due at once).
    public var earliest: Date? { request.earliestBeginDate.map(Date.init(timeIntervalSince1970:)) }
}

/// Per-app scheduling state.
public struct AppState: Sendable, Equatable, Codable {
    public var app: String
    /// The per-app Background App Refresh switch.
    public var refreshEnabled: Bool = true
    /// Consecutive bad launches (watchdog, jetsam, crashed, unfinished tasks); 0 after a clean one.
    public var penaltyLevel: Int = 0
    /// Launches wait until then (realistic policy).
    public var penaltyUntil: Date?
    public var lastLaunchAt: Date?
    public var lastLaunchID: String?
    /// Identifiers the last launch registered (nil before any launch).
    public var lastRegistered: [String]?
    /// The last day (its midnight on the host's clock) the app's background use was excessive,
    /// and why (`EnergyBudget`); the realistic policy schedules it less for the rest of that day.
    public var energyExcessDay: Date?
    public var energyExcess: String?
    /// When the user opened the app (`bgtask open`), on the host's clock, newest first: at most
    /// `UsagePrediction.keptOpens`, none older than its window.
    public var opens: [Date] = []

    public init(app: String) { self.app = app }
}

/// A launch that was running when the host stopped (found at startup).
public struct InterruptedLaunch: Sendable, Equatable {
    public var launchID: String
    public var app: String
    public var pid: Int32?
    public var reason: String
    public var startedAt: Date
    /// The task identifiers and kinds it was running.
    public var tasks: [TaskAssignment]

    /// The memberwise initializer, for the modules above this one.
    package init(launchID: String, app: String, pid: Int32? = nil, reason: String, startedAt: Date, tasks: [TaskAssignment]) {
        self.launchID = launchID
        self.app = app
        self.pid = pid
        self.reason = reason
        self.startedAt = startedAt
        self.tasks = tasks
    }
}

/// A notification as the host keeps it: pending (`fireDate` its next delivery) or delivered.
public struct StoredNotification: Codable, Sendable, Equatable {
    /// The row's id: the order of addition or delivery (`bgtask notifications --follow` reads
    /// after the last one it showed).
    public var id: Int64
    public var app: String
    public var request: NotificationRequest
    public var state: String // "pending", "delivered"
    public var addedAt: Date
    /// Pending: when it is next delivered; delivered: when it was due.
    public var fireDate: Date?
    public var deliveredAt: Date?
    /// The launch that added it (nil: added through the control socket or by `bgtask run`).
    public var launchID: String?

    enum CodingKeys: String, CodingKey {
        case id, app, request, state
        case addedAt = "added_at", fireDate = "fire_date", deliveredAt = "delivered_at", launchID = "launch_id"
    }

    /// The memberwise initializer, for the modules above this one.
    package init(id: Int64, app: String, request: NotificationRequest, state: String, addedAt: Date, fireDate: Date? = nil, deliveredAt: Date? = nil, launchID: String? = nil) {
        self.id = id
        self.app = app
        self.request = request
        self.state = state
        self.addedAt = addedAt
        self.fireDate = fireDate
        self.deliveredAt = deliveredAt
        self.launchID = launchID
    }
}

/// An app's notification authorization as the host keeps it.
public struct NotificationAppState: Codable, Sendable, Equatable {
    public var app: String
    /// The operator's switch (`bgtask device --app A --notifications on|off`); nil: not set.
    public var allowed: Bool?
    /// When the app first asked (`requestAuthorization`), and with which options.
    public var askedAt: Date?
    public var askedOptions: UInt32 = 0

    public init(app: String) { self.app = app }

    enum CodingKeys: String, CodingKey {
        case app, allowed
        case askedAt = "asked_at", askedOptions = "asked_options"
    }
}

import BGTaskModel
import Foundation

/// A request as it travels on the control socket: flat, with optional fields, so that adding a
/// field or a verb never breaks an older peer (the host rejects an unknown verb by name). Only
/// the codec reads and writes it: everything else speaks `ControlCommand`.
package struct ControlRequest: Codable, Sendable, Equatable {
    package var verb: String
    package var app: String?
    package var identifier: String?
    package var request: TaskRequest?
    package var force: Bool?
    package var wait: Bool?
    /// `device`: condition → "on"/"off"/"auto", and `app` with that app's switches.
    package var device: [String: String]?
    /// `clock`: seconds to advance.
    package var advance: Double?
    package var limit: Int?
    package var event: String?
    /// `submit`: earliestBeginDate as seconds from the host's now.
    package var delay: Double?
    /// `apps`: the identifier a page starts after; `notifications`: the id of the last one seen.
    package var after: String?
    package var push: PushBody?

    package init(verb: String, app: String? = nil, identifier: String? = nil, request: TaskRequest? = nil,
                 force: Bool? = nil, wait: Bool? = nil, device: [String: String]? = nil, advance: Double? = nil,
                 limit: Int? = nil, event: String? = nil, delay: Double? = nil, after: String? = nil, push: PushBody? = nil) {
        self.verb = verb
        self.app = app
        self.identifier = identifier
        self.request = request
        self.force = force
        self.wait = wait
        self.device = device
        self.advance = advance
        self.limit = limit
        self.event = event
        self.delay = delay
        self.after = after
        self.push = push
    }

    enum CodingKeys: String, CodingKey {
        case verb, app, identifier, request, force, wait, device, advance, limit, event, delay, after, push
    }

    /// Decodes the keys that are present only: a request names 2-4 of its 12 keys, and asking
    /// the JSON decoder for each absent one (as the synthesized decoder does) was most of the
    /// cost of decoding a submission. Unknown keys are ignored; `null` is absent.
    package init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        verb = ""
        var sawVerb = false
        for key in container.allKeys where try !container.decodeNil(forKey: key) {
            switch key {
            case .verb:
                verb = try container.decode(String.self, forKey: key)
                sawVerb = true
            case .app: app = try container.decode(String.self, forKey: key)
            case .identifier: identifier = try container.decode(String.self, forKey: key)
            case .request: request = try container.decode(TaskRequest.self, forKey: key)
            case .force: force = try container.decode(Bool.self, forKey: key)
            case .wait: wait = try container.decode(Bool.self, forKey: key)
            case .device: device = try container.decode([String: String].self, forKey: key)
            case .advance: advance = try container.decode(Double.self, forKey: key)
            case .limit: limit = try container.decode(Int.self, forKey: key)
            case .event: event = try container.decode(String.self, forKey: key)
            case .delay: delay = try container.decode(Double.self, forKey: key)
            case .after: after = try container.decode(String.self, forKey: key)
            case .push: push = try container.decode(PushBody.self, forKey: key)
            }
        }
        guard sawVerb else {
            throw DecodingError.keyNotFound(CodingKeys.verb, .init(codingPath: decoder.codingPath, debugDescription: "No value associated with key verb"))
        }
    }

    /// Every verb's name, as the host's unknown-verb answer lists them.
    package static var verbs: [String] { ControlVerb.allCases.map(\.rawValue) }

    /// The verb, when it is one this host knows (a request keeps the client's word: an unknown
    /// verb is refused by name).
    package var knownVerb: ControlVerb? { ControlVerb(rawValue: verb) }
}

/// The control socket's verbs, their names on the wire defined once (stable: clients and
/// scripts send them).
public enum ControlVerb: String, CaseIterable, Sendable {
    case apps, submit, pending, cancel
    case cancelAll = "cancel-all"
    case simulateLaunch = "simulate-launch"
    case simulateExpire = "simulate-expire"
    case history, why, device, clock, status
    case extensionRun = "extension-run"
    case open, progress
    case cancelTask = "cancel-task"
    /// Local notifications: delivered (`after`: a cursor, the last id seen) and pending.
    case notifications
    case pendingNotifications = "pending-notifications"
    case push, pushes
    case deviceToken = "device-token"
    /// Background URL sessions' transfers (`bgtask transfers`).
    case transfers
    /// Ends an app's suspended process now, as jetsam would (`bgtask evict APP`): its next
    /// launch is fresh. `removed`: 1 when it had one, 0 when not.
    case evict
    /// An app's use per day and its diagnostics (`bgtask metrics APP`).
    case metrics
    /// The user opens a delivered notification (`bgtask respond ID`).
    case respond
    /// The launches running now (`bgtask top`).
    case running
}

/// `push`: a payload and APNs's headers (`bgtask push`).
public struct PushBody: Codable, Sendable, Equatable {
    /// The JSON payload, as text.
    public var payload: String
    public var pushType: String?
    public var priority: Int?
    public var expiration: Double?
    public var collapseID: String?
    public var id: String?

    public init(payload: String, pushType: String? = nil, priority: Int? = nil, expiration: Double? = nil,
                collapseID: String? = nil, id: String? = nil) {
        self.payload = payload
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.id = id
    }

    enum CodingKeys: String, CodingKey {
        case payload, priority, expiration, id
        case pushType = "push_type", collapseID = "collapse_id"
    }
}

/// Every code an answer's error carries, defined once (stable: clients and scripts match on
/// them). The answer keeps the code as a string, so a client reads a newer host's codes too.
public enum ControlErrorCode: String, CaseIterable, Sendable {
    /// The verb is not one the host knows.
    case unknownVerb = "unknown-verb"
    /// A field is missing, of the wrong type, or out of its domain.
    case badRequest = "bad-request"
    /// The frame could not be read (length, JSON).
    case badFrame = "bad-frame"
    /// The app, task, launch or extension named does not exist.
    case notFound = "not-found"
    /// The host cannot do it now (shutting down, the app busy, the store failing).
    case unavailable
    /// The peer may not use the control socket (a launch's process).
    case permissionDenied = "permission-denied"
    /// The request or its answer is over a size limit.
    case tooLarge = "too-large"
    case tooManyConnections = "too-many-connections"
    case tooManyLaunches = "too-many-launches"
    case requestTimeout = "request-timeout"
    /// A value (a clock advance, a date) beyond what the host accepts.
    case outOfRange = "out-of-range"
    case internalError = "internal"
    /// BGTaskScheduler.Error.Code, by Apple's names (a submission refused).
    case tooManyPendingTaskRequests
    case notPermitted
    case immediateRunIneligible
}

/// One app of the catalog, as `bgtask apps` shows it.
public struct AppSummary: Codable, Sendable, Equatable {
    public var identifier: String
    public var path: String
    public var permittedIdentifiers: [String]
    public var backgroundModes: [String]
    public var extensions: [String]
    public var running: String?
    public var refreshEnabled: Bool
    public var penaltyLevel: Int
    public var penaltyUntil: Date?
    public var pending: Int
    /// The app's process as the lifecycle keeps it: `running`, `suspended` or `not-running`
    /// (nil from a host that keeps no process, `--app-lifecycle fresh`).
    public var process: String? = nil
    /// The suspended process: its pid, its private memory, since when, launches it ran.
    public var processID: Int32? = nil
    public var processBytes: UInt64? = nil
    public var suspendedSince: Date? = nil
    public var processLaunches: Int? = nil
    /// Why the app's last process ended while suspended (its eviction), and when.
    public var lastEviction: String? = nil
    public var lastEvictionAt: Date? = nil
    /// The entitlements the bundle claims (those set to true), and its app groups.
    public var entitlements: [String]? = nil
    public var appGroups: [String]? = nil

    /// The memberwise initializer, for the modules above this one.
    package init(identifier: String, path: String, permittedIdentifiers: [String], backgroundModes: [String], extensions: [String], running: String? = nil, refreshEnabled: Bool, penaltyLevel: Int, penaltyUntil: Date? = nil, pending: Int, process: String? = nil, processID: Int32? = nil, processBytes: UInt64? = nil, suspendedSince: Date? = nil, processLaunches: Int? = nil, lastEviction: String? = nil, lastEvictionAt: Date? = nil) {
        self.identifier = identifier
        self.path = path
        self.permittedIdentifiers = permittedIdentifiers
        self.backgroundModes = backgroundModes
        self.extensions = extensions
        self.running = running
        self.refreshEnabled = refreshEnabled
        self.penaltyLevel = penaltyLevel
        self.penaltyUntil = penaltyUntil
        self.pending = pending
        self.process = process
        self.processID = processID
        self.processBytes = processBytes
        self.suspendedSince = suspendedSince
        self.processLaunches = processLaunches
        self.lastEviction = lastEviction
        self.lastEvictionAt = lastEvictionAt
    }
}

/// A bundle that failed validation.
public struct InvalidBundle: Codable, Sendable, Equatable {
    public var path: String
    public var error: String

    /// The memberwise initializer, for the modules above this one.
    package init(path: String, error: String) {
        self.path = path
        self.error = error
    }
}

/// `why ID`: the request and everything holding it back.
public struct WhyReport: Codable, Sendable, Equatable {
    /// Where the request stands (its name on the wire is stable: scripts match on it).
    public enum State: String, Codable, Sendable, CaseIterable {
        case pending, running
        case notSubmitted = "not-submitted"
    }

    public var app: String
    public var identifier: String
    public var state: State
    public var runningLaunch: String?
    public var request: TaskRequest?
    public var blockers: [Blocker]
    public var now: Date

    /// The report in words.
    public var text: String {
        var lines: [String] = []
        switch state {
        case .running: lines.append("\(identifier) (\(app)) is running now in launch \(runningLaunch ?? "?").")
        case .notSubmitted: lines.append("\(identifier) has no pending request\(app.isEmpty ? "" : " for \(app)"): nothing to run (submit it, or use simulate-launch --force).")
        case .pending:
            let holding = blockers.filter(\.blocking)
            lines.append(holding.isEmpty ? "\(identifier) (\(app)) is eligible: it runs in the next launch of \(app)."
                                         : "\(identifier) (\(app)) is waiting:")
        }
        for blocker in blockers {
            lines.append("  - \(blocker.blocking ? "" : "note: ")\(blocker.message) [\(blocker.code)]")
        }
        return lines.joined(separator: "\n")
    }

    /// The memberwise initializer, for the modules above this one.
    package init(app: String, identifier: String, state: State, runningLaunch: String? = nil, request: TaskRequest? = nil, blockers: [Blocker], now: Date) {
        self.app = app
        self.identifier = identifier
        self.state = state
        self.runningLaunch = runningLaunch
        self.request = request
        self.blockers = blockers
        self.now = now
    }
}

/// A running continued-processing task, as `bgtask progress` shows it.
public struct ContinuedTaskStatus: Codable, Sendable, Equatable {
    public var launchID: String
    public var app: String
    public var identifier: String
    public var task: UInt64
    public var title: String
    public var subtitle: String
    public var completed: Int64
    public var total: Int64
    public var startedAt: Date
    /// The last time its progress changed.
    public var progressChangedAt: Date
    /// Expiration has been delivered (stalled progress, or the user cancelled).
    public var expiring: Bool
    /// The task has ended (shown for a few seconds after, so watchers see its last state).
    public var ended: Bool = false

    enum CodingKeys: String, CodingKey {
        case app, identifier, task, title, subtitle, completed, total, expiring, ended
        case launchID = "launch_id", startedAt = "started_at", progressChangedAt = "progress_changed_at"
    }

    /// 0...1, or nil while the total is unknown.
    public var fraction: Double? { total > 0 ? min(1, max(0, Double(completed) / Double(total))) : nil }

    /// The memberwise initializer, for the modules above this one.
    package init(launchID: String, app: String, identifier: String, task: UInt64, title: String, subtitle: String, completed: Int64, total: Int64, startedAt: Date, progressChangedAt: Date, expiring: Bool, ended: Bool = false) {
        self.launchID = launchID
        self.app = app
        self.identifier = identifier
        self.task = task
        self.title = title
        self.subtitle = subtitle
        self.completed = completed
        self.total = total
        self.startedAt = startedAt
        self.progressChangedAt = progressChangedAt
        self.expiring = expiring
        self.ended = ended
    }
}

/// An app's notification authorization, as `bgtask notifications` shows it.
public struct NotificationAppReport: Codable, Sendable, Equatable {
    public var app: String
    /// `not-determined`, `denied`, `authorized` (UNAuthorizationStatus).
    public var authorization: String
    /// The operator's switch for the app (nil: not set; the host's default applies).
    public var allowed: Bool?
    /// When the app first asked (requestAuthorization), and the options it asked for.
    public var askedAt: Date?
    public var askedOptions: UInt32

    public init(app: String, authorization: String, allowed: Bool?, askedAt: Date?, askedOptions: UInt32) {
        self.app = app
        self.authorization = authorization
        self.allowed = allowed
        self.askedAt = askedAt
        self.askedOptions = askedOptions
    }

    enum CodingKeys: String, CodingKey {
        case app, authorization, allowed
        case askedAt = "asked_at", askedOptions = "asked_options"
    }
}

/// The host's clock.
public struct ClockReport: Codable, Sendable, Equatable {
    public var mode: HostClock.Mode
    public var now: Date
    public var nextDue: Date?

    /// The memberwise initializer, for the modules above this one.
    package init(mode: HostClock.Mode, now: Date, nextDue: Date? = nil) {
        self.mode = mode
        self.now = now
        self.nextDue = nextDue
    }
}

/// The host's answer. `ok` false carries `error`; otherwise the field for the verb is set.
public struct ControlResponse: Codable, Sendable {
    public struct ErrorBody: Codable, Sendable, Equatable {
        /// One of `ControlErrorCode`'s raw values (a newer host may send others).
        public var code: String
        public var message: String

        /// The memberwise initializer, for the modules above this one.
        package init(code: String, message: String) {
            self.code = code
            self.message = message
        }
    }

    public var ok: Bool
    public var error: ErrorBody?
    public var apps: [AppSummary]?
    public var invalid: [InvalidBundle]?
    public var pending: [StoredRequest]?
    public var record: RunRecord?
    public var records: [RunRecord]?
    public var launchID: String?
    public var why: WhyReport?
    public var device: DeviceConditions?
    public var clock: ClockReport?
    public var removed: Int?
    public var continued: [ContinuedTaskStatus]?
    /// `notifications`, `pending-notifications`: the notifications, and the authorization of
    /// the app asked about (or of every app the host knows of).
    public var notifications: [StoredNotification]?
    public var notificationApps: [NotificationAppReport]?
    /// A paged `apps` answer with more apps after it: the `after` of the next page (the last
    /// identifier of this one). nil on the last page. `invalid` comes with the first page only.
    public var next: String?
    /// A list left short so that the answer fits a control frame: `history` records (the
    /// oldest asked for, or one too large by itself) or `apps`' invalid bundles, `omitted` of
    /// them. Nil when the answer is whole.
    public var truncated: Bool?
    public var omitted: Int?
    /// `push`: what became of it. `pushes` (and `why` with a push's id): each push and where it stands.
    public var push: PushReport?
    public var pushes: [PushReport]?
    /// `device-token`: the app's token (64 hex digits).
    public var deviceToken: String?
    /// A refused push: APNs's reason (`BadPriority`, `PayloadTooLarge`, ...).
    public var apnsReason: String?
    /// `transfers` (and `why` with a transfer's id): each transfer and where it stands.
    public var transfers: [TransferReport]?
    /// `metrics`: the app's days, newest first.
    public var metrics: [MetricReport]?
    /// `running`: the launches running now, oldest first.
    public var running: [RunningLaunchReport]?

    public init(ok: Bool = true) { self.ok = ok }

    /// `ok` and nothing else, as most answers are.
    package var isBareOK: Bool {
        ok && error == nil && apps == nil && invalid == nil && pending == nil && record == nil && records == nil
            && launchID == nil && why == nil && device == nil && clock == nil && removed == nil && continued == nil && next == nil
            && truncated == nil && omitted == nil && push == nil && pushes == nil && deviceToken == nil && apnsReason == nil
            && notifications == nil && notificationApps == nil && transfers == nil && metrics == nil && running == nil
    }

    public static func failure(_ failure: ControlFailure) -> ControlResponse {
        .failure(failure.code, failure.message)
    }

    /// The refusal an answer carries, when it is one (a code this client does not know is
    /// `internalError`, with the host's code in the message).
    public var failure: ControlFailure? {
        guard !ok else { return nil }
        guard let error else { return ControlFailure(.internalError, "the host refused without saying why") }
        guard let code = ControlErrorCode(rawValue: error.code) else { return ControlFailure(.internalError, "\(error.message) [\(error.code)]") }
        return ControlFailure(code, error.message)
    }

    public static func failure(_ code: ControlErrorCode, _ message: String) -> ControlResponse {
        var response = ControlResponse(ok: false)
        response.error = ErrorBody(code: code.rawValue, message: message)
        return response
    }
}

/// One day of an app's use of the device (`metrics`), as the host summed it from its launches'
/// records: what MetricKit's payloads for that day hold.
public struct MetricReport: Codable, Sendable, Equatable {
    public var day: MetricDay
    /// That day's crashes, hangs and CPU exceptions.
    public var diagnostics: [MetricDiagnostic]
    /// Handed to a launch of the app (MetricKit delivers a day once, at the next launch after it).
    public var delivered: Bool
    /// Why that day's background use was excessive (`EnergyBudget`), or nil.
    public var excess: String?

    public init(day: MetricDay, diagnostics: [MetricDiagnostic], delivered: Bool, excess: String?) {
        self.day = day
        self.diagnostics = diagnostics
        self.delivered = delivered
        self.excess = excess
    }
}

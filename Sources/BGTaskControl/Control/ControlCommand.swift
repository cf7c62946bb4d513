import BGTaskModel
import Foundation

/// A command on the control socket with its arguments, typed: the protocol's one definition of
/// what each verb takes. Clients (the CLI, the test kit, the benches) build these; the host
/// decodes each frame into one (`ControlCodec`) and refuses a frame whose arguments do not make
/// a command, in the host's terms, before any part of the host sees it.
///
/// On the wire a command is a flat JSON object (`ControlRequest`): a verb (`ControlVerb`, its
/// names defined once) and the fields it uses, so that scripts in any language can speak it and
/// an older peer ignores what it does not know.
public enum ControlCommand: Sendable, Equatable {
    case status
    /// The catalog: every app, or (with `limit` or `after`) one page of at most `limit` apps
    /// whose identifiers sort after `after`.
    case apps(limit: Int? = nil, after: String? = nil)
    /// `delay`: earliestBeginDate as seconds from the host's now (its clock may be virtual).
    case submit(app: String, request: TaskRequest, delay: Double? = nil)
    case pending(app: String? = nil)
    case cancel(app: String, identifier: String)
    case cancelAll(app: String)
    /// Records, newest first, at most `limit` (default 50).
    case history(app: String? = nil, limit: Int? = nil)
    /// Why a request has not run; `identifier` may also be a push's or a transfer's id.
    case why(identifier: String, app: String? = nil)
    /// Ends an app's suspended process now, as jetsam would: its next launch is fresh.
    case evict(app: String)
    /// The device conditions, after applying `changes` (none: only read them).
    case device(DeviceChanges = DeviceChanges())
    /// The host's clock, after advancing a virtual one by `advance` seconds.
    case clock(advance: Double? = nil)
    /// Launches the app holding `identifier`'s pending request now; `force` launches it without
    /// one (as `kind`, or the kind the bundle implies). `wait`: answer with the record.
    case simulateLaunch(identifier: String, app: String? = nil, force: Bool = false, kind: TaskKind? = nil, wait: Bool = true)
    case simulateExpire(identifier: String)
    /// Runs an extension with `event` (JSON) in its own supervised process.
    case extensionRun(identifier: String, event: String? = nil, wait: Bool = true)
    /// Opens an app in the foreground, with `event` (JSON) for its launch entry.
    case open(app: String, event: String? = nil, wait: Bool = false)
    /// Cancels a running or queued continued-processing task, as the user does in the system UI.
    case cancelTask(identifier: String)
    /// Running continued-processing tasks.
    case progress
    /// Delivered local notifications: with `after` (a notification id) those since, oldest
    /// first; without, the newest. At most `limit` (default 100).
    case notifications(app: String? = nil, after: Int64? = nil, limit: Int? = nil)
    case pendingNotifications(app: String? = nil)
    /// A payload for an app, as `xcrun simctl push` sends one.
    case push(app: String, PushBody)
    case pushes(app: String? = nil, limit: Int? = nil)
    case deviceToken(app: String)
    /// Background URL sessions' transfers, at most `limit` (default 100, at most 1,000).
    case transfers(app: String? = nil, limit: Int? = nil)
    /// An app's use of the device per day and its diagnostics (`bgtask metrics`, MetricKit's payloads).
    case metrics(app: String)
    /// The user opens delivered notification `notification` (or acts on it: `action`): its app
    /// comes to the foreground and its notification center's delegate hears `didReceive`.
    case respond(notification: Int64, action: String? = nil, wait: Bool = false)
    /// The launches running now, with their time and memory (`bgtask top`, the dashboard).
    case running

    /// The command's verb.
    public var verb: ControlVerb {
        switch self {
        case .status: .status
        case .apps: .apps
        case .submit: .submit
        case .pending: .pending
        case .cancel: .cancel
        case .cancelAll: .cancelAll
        case .history: .history
        case .why: .why
        case .evict: .evict
        case .device: .device
        case .clock: .clock
        case .simulateLaunch: .simulateLaunch
        case .simulateExpire: .simulateExpire
        case .extensionRun: .extensionRun
        case .open: .open
        case .cancelTask: .cancelTask
        case .progress: .progress
        case .notifications: .notifications
        case .pendingNotifications: .pendingNotifications
        case .push: .push
        case .pushes: .pushes
        case .deviceToken: .deviceToken
        case .transfers: .transfers
        case .metrics: .metrics
        case .respond: .respond
        case .running: .running
        }
    }
}

/// A setting of a device condition or of an app's switch: forced on, forced off, or back to
/// the machine's value or the default.
public enum DeviceSetting: String, Sendable, CaseIterable, Codable {
    case on, off, auto

    /// The override it stands for (nil: none).
    public var override: Bool? {
        switch self {
        case .on: true
        case .off: false
        case .auto: nil
        }
    }
}

/// A device condition the host can be told to override (its name on the wire and in settings).
public enum DeviceCondition: String, Sendable, CaseIterable, Codable, Comparable {
    case power, network, idle
    case lowPower = "low-power"
    case refresh, locked, gpu

    public static func < (lhs: Self, rhs: Self) -> Bool {
        allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
    }
}

/// Changes to the device conditions, and to one app's own switches.
public struct DeviceChanges: Sendable, Equatable {
    /// Overrides of the whole device's conditions.
    public var conditions: [DeviceCondition: DeviceSetting]
    /// The thermal state to hold the device at (`auto`: the machine's again).
    public var thermal: ThermalSetting?
    /// One app's switches, as iOS's Settings shows them per app.
    public var app: AppSwitches?

    public struct AppSwitches: Sendable, Equatable {
        public var app: String
        /// Its Background App Refresh switch.
        public var refresh: Bool?
        /// Its local notifications: authorized (on), denied (off), or the host's default (auto).
        public var notifications: DeviceSetting?

        public init(app: String, refresh: Bool? = nil, notifications: DeviceSetting? = nil) {
            self.app = app
            self.refresh = refresh
            self.notifications = notifications
        }
    }

    public init(_ conditions: [DeviceCondition: DeviceSetting] = [:], thermal: ThermalSetting? = nil, app: AppSwitches? = nil) {
        self.conditions = conditions
        self.thermal = thermal
        self.app = app
    }

    public var isEmpty: Bool { conditions.isEmpty && thermal == nil && app == nil }
}

/// A thermal state to hold the device at, or `auto` for the machine's.
public enum ThermalSetting: String, Sendable, CaseIterable, Codable {
    case nominal, fair, serious, critical, auto

    /// The override it stands for (nil: none).
    public var override: ThermalState? { ThermalState(name: rawValue) }
}

/// A refusal: the host's error code and a message in its own terms (naming the command, the
/// field and the value at fault).
public struct ControlFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: ControlErrorCode
    public var message: String

    public init(_ code: ControlErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(message) [\(code.rawValue)]" }

    package static func badRequest(_ message: String) -> Self { Self(.badRequest, message) }
}

// MARK: The wire form

extension ControlCommand {
    /// The command as it travels.
    package var wire: ControlRequest {
        var wire = ControlRequest(verb: verb.rawValue)
        switch self {
        case .status, .progress, .running: break
        case let .apps(limit, after): (wire.limit, wire.after) = (limit, after)
        case let .submit(app, request, delay): (wire.app, wire.request, wire.delay) = (app, request, delay)
        case let .pending(app), let .pendingNotifications(app): wire.app = app
        case let .cancel(app, identifier): (wire.app, wire.identifier) = (app, identifier)
        case let .cancelAll(app), let .evict(app), let .deviceToken(app), let .metrics(app): wire.app = app
        case let .history(app, limit), let .pushes(app, limit), let .transfers(app, limit): (wire.app, wire.limit) = (app, limit)
        case let .why(identifier, app): (wire.identifier, wire.app) = (identifier, app)
        case let .device(changes): wire.device = changes.isEmpty ? nil : changes.wire
        case let .clock(advance): wire.advance = advance
        case let .simulateLaunch(identifier, app, force, kind, wait):
            (wire.identifier, wire.app, wire.wait) = (identifier, app, wait)
            if force { wire.force = true }
            if let kind { wire.request = TaskRequest(kind: kind, identifier: identifier) }
        case let .simulateExpire(identifier), let .cancelTask(identifier): wire.identifier = identifier
        case let .extensionRun(identifier, event, wait): (wire.identifier, wire.event, wire.wait) = (identifier, event, wait)
        case let .open(app, event, wait): (wire.app, wire.event, wire.wait) = (app, event, wait)
        case let .respond(notification, action, wait): (wire.identifier, wire.event, wire.wait) = (String(notification), action, wait)
        case let .notifications(app, after, limit): (wire.app, wire.after, wire.limit) = (app, after.map(String.init), limit)
        case let .push(app, body): (wire.app, wire.push) = (app, body)
        }
        return wire
    }

    /// The command a request on the wire makes, or the refusal naming what is missing or wrong.
    /// Every check of a single request's arguments is here; what needs the host's state (is
    /// the app installed, is the clock virtual) is the host's.
    package init(wire: ControlRequest) throws(ControlFailure) {
        guard let verb = wire.knownVerb else {
            throw ControlFailure(.unknownVerb, "unknown verb '\(ControlWords.quoted(wire.verb))' (known: \(ControlRequest.verbs.joined(separator: ", ")))")
        }
        func required<T>(_ value: T?, _ what: String) throws(ControlFailure) -> T {
            guard let value else { throw .badRequest("\(verb.rawValue) needs \(what)") }
            return value
        }
        func limit(atLeast minimum: Int = 1) throws(ControlFailure) -> Int? {
            guard let limit = wire.limit else { return nil }
            guard limit >= minimum else { throw .badRequest("\(verb.rawValue): limit must be at least \(minimum), not \(limit)") }
            return limit
        }
        /// An app identifier within the identifier limit (it names a row, a directory, a unit).
        func bounded(_ app: String?) throws(ControlFailure) -> String? {
            guard let app, app.utf8.count > InputLimits.identifierBytes else { return app }
            throw .badRequest("\(verb.rawValue): the app identifier is \(app.utf8.count) bytes, over the limit of \(InputLimits.identifierBytes)")
        }
        switch verb {
        case .status: self = .status
        case .progress: self = .progress
        case .running: self = .running
        case .apps: self = .apps(limit: try limit(), after: wire.after)
        case .submit:
            guard let app = wire.app, let request = wire.request else { throw .badRequest("submit needs an app and a request") }
            self = .submit(app: app, request: request, delay: wire.delay)
        case .pending: self = .pending(app: wire.app)
        case .cancel:
            let app = try required(wire.app, "an app")
            self = .cancel(app: app, identifier: try required(wire.identifier, "a task identifier"))
        case .cancelAll: self = .cancelAll(app: try required(wire.app, "an app"))
        case .history: self = .history(app: wire.app, limit: try limit(atLeast: 0))
        case .why: self = .why(identifier: try required(wire.identifier, "a task identifier"), app: wire.app)
        case .evict: self = .evict(app: try required(wire.app, "an app"))
        case .device: self = .device(try wire.device.map(DeviceChanges.init(wire:)) ?? DeviceChanges())
        case .clock: self = .clock(advance: wire.advance)
        case .simulateLaunch:
            self = .simulateLaunch(identifier: try required(wire.identifier, "a task identifier"), app: wire.app,
                                   force: wire.force == true, kind: wire.request?.kind, wait: wire.wait != false)
        case .simulateExpire: self = .simulateExpire(identifier: try required(wire.identifier, "a task identifier"))
        case .cancelTask: self = .cancelTask(identifier: try required(wire.identifier, "a task identifier"))
        case .extensionRun:
            self = .extensionRun(identifier: try required(wire.identifier, "an extension identifier"), event: wire.event, wait: wire.wait != false)
        case .open: self = .open(app: try required(wire.app, "an app"), event: wire.event, wait: wire.wait == true)
        case .notifications:
            var after: Int64?
            if let text = wire.after {
                guard let cursor = Int64(text), cursor >= 0 else {
                    throw .badRequest("notifications: after must be a notification id (a non-negative integer), not '\(ControlWords.quoted(String(text.prefix(64))))'")
                }
                after = cursor
            }
            self = .notifications(app: try bounded(wire.app), after: after, limit: try limit())
        case .pendingNotifications: self = .pendingNotifications(app: try bounded(wire.app))
        case .push:
            guard let app = wire.app, let body = wire.push else { throw .badRequest("push needs an app and a payload") }
            self = .push(app: app, body)
        case .pushes: self = .pushes(app: wire.app, limit: try limit())
        case .deviceToken: self = .deviceToken(app: try required(wire.app, "an app"))
        case .transfers: self = .transfers(app: wire.app, limit: try limit())
        case .metrics: self = .metrics(app: try required(try bounded(wire.app), "an app"))
        case .respond:
            let text = try required(wire.identifier, "a notification id")
            guard let id = Int64(text), id >= 0 else {
                throw .badRequest("respond: a notification id is a non-negative integer (bgtask notifications lists them), not '\(ControlWords.quoted(String(text.prefix(64))))'")
            }
            if let action = wire.event, action.isEmpty || action.utf8.count > InputLimits.identifierBytes {
                throw .badRequest("respond: an action identifier is 1 to \(InputLimits.identifierBytes) bytes, not \(action.utf8.count)")
            }
            self = .respond(notification: id, action: wire.event, wait: wire.wait == true)
        }
    }
}

extension DeviceChanges {
    /// On the wire: condition → on/off/auto, and with `app` that app's `refresh` (on/off) and
    /// `notifications` (on/off/auto).
    package var wire: [String: String] {
        var wire: [String: String] = [:]
        for (condition, setting) in conditions { wire[condition.rawValue] = setting.rawValue }
        if let thermal { wire["thermal"] = thermal.rawValue }
        if let app {
            wire["app"] = app.app
            if let refresh = app.refresh { wire["refresh"] = refresh ? "on" : "off" }
            if let notifications = app.notifications { wire["notifications"] = notifications.rawValue }
        }
        return wire
    }

    package init(wire: [String: String]) throws(ControlFailure) {
        var changes = wire
        self.init()
        if let app = changes.removeValue(forKey: "app") {
            var switches = AppSwitches(app: app)
            if let refresh = changes.removeValue(forKey: DeviceCondition.refresh.rawValue) {
                guard let value = DeviceSetting(rawValue: refresh), let on = value.override else {
                    throw .badRequest("device: an app's refresh switch is on or off, not '\(ControlWords.quoted(String(refresh.prefix(64))))'")
                }
                switches.refresh = on
            }
            if let notifications = changes.removeValue(forKey: "notifications") {
                guard let value = DeviceSetting(rawValue: notifications) else {
                    throw .badRequest("device: an app's notifications are on, off or auto, not '\(ControlWords.quoted(String(notifications.prefix(64))))'")
                }
                switches.notifications = value
            }
            guard switches.refresh != nil || switches.notifications != nil else {
                throw .badRequest("device: a change for an app sets its refresh or its notifications")
            }
            self.app = switches
        } else if changes["notifications"] != nil {
            throw .badRequest("device: notifications are an app's switch: a change of them names the app")
        }
        if let thermal = changes.removeValue(forKey: "thermal") {
            guard let setting = ThermalSetting(rawValue: thermal) else {
                throw .badRequest("device: thermal is nominal, fair, serious, critical or auto, not '\(ControlWords.quoted(String(thermal.prefix(64))))'")
            }
            self.thermal = setting
        }
        for (key, value) in changes.sorted(by: { $0.key < $1.key }) {
            guard let condition = DeviceCondition(rawValue: key) else {
                throw .badRequest("device: unknown condition '\(ControlWords.quoted(String(key.prefix(64))))' (known: \((DeviceCondition.allCases.map(\.rawValue) + ["thermal"]).joined(separator: ", ")))")
            }
            guard let setting = DeviceSetting(rawValue: value) else {
                throw .badRequest("device: \(key) is on, off or auto, not '\(ControlWords.quoted(String(value.prefix(64))))'")
            }
            conditions[condition] = setting
        }
    }
}

// MARK: The codec

/// The control protocol's one codec: a command to a frame's payload, a payload to a command.
///
/// Decoding has a fast path behind this seam: `ControlRequestParser` reads the JSON clients
/// send (flat objects, plain strings) straight into the wire form, and declines anything else,
/// which `JSONDecoder`, the reference, then decodes. `ControlRequestParserTests` holds the two
/// to the same result (docs/decisions).
package enum ControlCodec {
    package static func encode(_ command: ControlCommand) throws -> Data {
        try JSONEncoder.control.encode(command.wire)
    }

    package enum Decoded: Sendable {
        case command(ControlCommand)
        /// A request, but not one the host can carry out (unknown verb, missing or bad arguments):
        /// answered, and the connection goes on.
        case refused(ControlFailure)
        /// Not a request at all (not JSON, not an object with a verb): answered, and the
        /// connection is closed.
        case malformed(ControlFailure)
    }

    package static func decode(_ payload: Data) -> Decoded {
        let wire: ControlRequest
        do {
            wire = try ControlRequestParser.parse(payload) ?? JSONDecoder.control.decode(ControlRequest.self, from: payload)
        } catch {
            return .malformed(.badRequest("the frame's payload is not a control request: \(ControlWords.describe(error))"))
        }
        do { return .command(try ControlCommand(wire: wire)) } catch { return .refused(error) }
    }
}

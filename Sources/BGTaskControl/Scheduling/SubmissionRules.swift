import BGTaskModel
import Foundation

/// Apple's rules for accepting a task request, shared by every place requests come from (an
/// app's launch, an extension, the CLI).
public enum SubmissionRules {
    /// `BGTaskScheduler.Error.Code` values, as the ABI carries them.
    public enum Status: Int32, Sendable {
        case unavailable = 1
        case tooManyPendingTaskRequests = 2
        case notPermitted = 3
        case immediateRunIneligible = 4
    }

    public static let maximumPendingRefresh = 1
    public static let maximumPendingProcessing = 10

    public struct Rejection: Error, Sendable, Equatable, CustomStringConvertible {
        public var status: Status
        public var message: String
        public var description: String { message }

        /// The memberwise initializer, for the modules above this one.
        package init(status: Status, message: String) {
            self.status = status
            self.message = message
        }
    }

    /// What Apple's rules need to decide on a request besides the app's stored state and
    /// requests: the app's bundle, the machine's resources, the host's clock. A value, so the
    /// store can apply the rules inside its write transaction without calling back into the host.
    public struct Context: Sendable {
        public var app: PluginBundle
        public var supportedResources: UInt32
        public var now: Date

        public init(app: PluginBundle, supportedResources: UInt32 = 0, now: Date = Date()) {
            self.app = app
            self.supportedResources = supportedResources
            self.now = now
        }
    }

    /// The whole decision on a request, as the store makes it in its transaction: the app's own
    /// Background App Refresh switch (`state`), then `check` against its `current` requests.
    public static func decide(_ request: TaskRequest, _ context: Context, state: AppState, current: [TaskRequest]) -> Rejection? {
        if let rejection = appSwitch(request, state: state) { return rejection }
        return check(request, app: context.app, pending: current, supportedResources: context.supportedResources, now: context.now)
    }

    /// The app's part of admission: its own Background App Refresh switch (continued processing
    /// is started by the user, and is not background refresh).
    public static func appSwitch(_ request: TaskRequest, state: AppState) -> Rejection? {
        if request.kind != .continuedProcessing && !state.refreshEnabled {
            return Rejection(status: .unavailable, message: "Background App Refresh is off for \(state.app)")
        }
        return nil
    }

    /// The device's part of admission: its Background App Refresh switch and Low Power Mode.
    public static func deviceSwitches(_ request: TaskRequest, _ conditions: DeviceConditions) -> Rejection? {
        if request.kind != .continuedProcessing && !conditions.backgroundRefresh {
            return Rejection(status: .unavailable, message: "Background App Refresh is off for the device")
        }
        if request.kind == .refresh && conditions.lowPowerMode {
            return Rejection(status: .unavailable, message: "Low Power Mode is on: refresh requests are unavailable")
        }
        return nil
    }

    /// Checks `request` from `app` against its Info.plist and the requests already pending
    /// for it. Returns nil when it may be accepted (replacing any pending request with the
    /// same identifier). `now` is the host's clock, which bounds `earliestBeginDate`.
    public static func check(
        _ request: TaskRequest, app: PluginBundle, pending: [TaskRequest],
        supportedResources: UInt32 = 0, now: Date = Date()
    ) -> Rejection? {
        if let problem = oversizedField(request) { return Rejection(status: .notPermitted, message: problem) }
        let id = request.identifier
        if let date = request.earliestBeginDate, let problem = HostClock.checkDate(date, now: now) {
            return Rejection(status: .notPermitted, message: "earliestBeginDate of '\(id)' \(problem)")
        }
        guard app.permits(id) else {
            return Rejection(status: .notPermitted, message: "'\(id)' is not in BGTaskSchedulerPermittedIdentifiers of \(app.identifier)")
        }
        let wildcard = app.isContinuedProcessingIdentifier(id)
        if request.kind == .continuedProcessing {
            guard wildcard else {
                return Rejection(status: .notPermitted, message: "continued-processing request '\(id)' must match a wildcard entry (like \(app.identifier).export.*) in BGTaskSchedulerPermittedIdentifiers")
            }
            if request.requiredResources & 1 != 0 {
                guard app.entitlements[PluginBundle.continuedProcessingGPUEntitlement] == true else {
                    return Rejection(status: .notPermitted, message: "'\(id)' requires the GPU but \(app.identifier) lacks the \(PluginBundle.continuedProcessingGPUEntitlement) entitlement")
                }
                guard supportedResources & 1 != 0 else {
                    return Rejection(status: .notPermitted, message: "'\(id)' requires the GPU, which BGTaskScheduler.supportedResources does not include on this machine")
                }
            }
        } else {
            if wildcard && !app.permittedIdentifiers.contains(id) {
                return Rejection(status: .notPermitted, message: "'\(id)' is permitted only as a continued-processing identifier, not as a \(request.kind.rawValue) request")
            }
            if let mode = PluginBundle.requiredMode(for: request.kind), !app.backgroundModes.contains(mode) {
                return Rejection(status: .notPermitted, message: "a \(request.kind.rawValue) request needs UIBackgroundModes '\(mode)' in the Info.plist of \(app.identifier)")
            }
            if request.kind == .healthResearch, app.entitlements[PluginBundle.healthResearchEntitlement] != true {
                return Rejection(status: .notPermitted, message: "a health-research request needs the \(PluginBundle.healthResearchEntitlement) entitlement in \(app.identifier)")
            }
        }
        let others = pending.filter { $0.identifier != id }
        switch request.kind {
        case .refresh:
            if others.filter({ $0.kind == .refresh }).count >= maximumPendingRefresh {
                return Rejection(status: .tooManyPendingTaskRequests, message: "\(app.identifier) already has \(maximumPendingRefresh) pending refresh request (the limit)")
            }
        case .processing, .healthResearch:
            if others.filter({ $0.kind.isProcessing }).count >= maximumPendingProcessing {
                return Rejection(status: .tooManyPendingTaskRequests, message: "\(app.identifier) already has \(maximumPendingProcessing) pending processing requests (the limit)")
            }
        case .continuedProcessing:
            break
        }
        return nil
    }

    /// Why a request is too large to keep (an identifier, title or subtitle over its limit, in
    /// `InputLimits`), or nil. The runner refuses these before they are sent; a control client
    /// is checked here.
    package static func oversizedField(_ request: TaskRequest) -> String? {
        let fields = [("identifier", request.identifier, InputLimits.identifierBytes),
                      ("title", request.title ?? "", InputLimits.titleBytes),
                      ("subtitle", request.subtitle ?? "", InputLimits.titleBytes)]
        for (name, text, limit) in fields where text.utf8.count > limit {
            return "the request's \(name) is \(text.utf8.count) bytes, over the limit of \(InputLimits.bytes(limit))"
        }
        return nil
    }
}

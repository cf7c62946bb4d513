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
            if others.filter({ $0.kind == .processing || $0.kind == .healthResearch }).count >= maximumPendingProcessing {
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
    static func oversizedField(_ request: TaskRequest) -> String? {
        let fields = [("identifier", request.identifier, InputLimits.identifierBytes),
                      ("title", request.title ?? "", InputLimits.titleBytes),
                      ("subtitle", request.subtitle ?? "", InputLimits.titleBytes)]
        for (name, text, limit) in fields where text.utf8.count > limit {
            return "the request's \(name) is \(text.utf8.count) bytes, over the limit of \(InputLimits.bytes(limit))"
        }
        return nil
    }
}

/// Answers the requests a launch makes of its host (submit, cancel, pending).
public protocol LaunchRequestBroker: Sendable {
    func submit(_ request: TaskRequest, app: PluginBundle) -> SubmissionRules.Rejection?
    func cancel(identifier: String?, app: PluginBundle)
    func pending(app: PluginBundle) -> [TaskRequest]
}

/// The broker of a one-shot `bgtask run`: requests live as long as the process.
public final class InMemoryRequestBroker: LaunchRequestBroker, @unchecked Sendable {
    private let lock = NSLock()
    private var requests: [String: [TaskRequest]] = [:]

    public init() {}

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
}

import BGTaskModel
import Foundation

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

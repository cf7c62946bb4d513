import BGTaskModel
import Foundation

/// Answers the requests a launch makes of its host (submit, cancel, pending).
public protocol LaunchRequestBroker: Sendable {
    func submit(_ request: TaskRequest, app: PluginBundle) -> SubmissionRules.Rejection?
    func cancel(identifier: String?, app: PluginBundle)
    func pending(app: PluginBundle) -> [TaskRequest]
    /// The app's device token for pushes (`registerForRemoteNotifications`), or why there is none.
    func deviceToken(app: PluginBundle) -> Result<String, SubmissionRules.Rejection>
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

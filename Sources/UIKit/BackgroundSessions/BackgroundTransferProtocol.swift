import Foundation
import FoundationNetworking

/// The URL protocol of every task of a background session: it hands the task to the host
/// (`BackgroundSessions.start`) instead of loading it in the app's process, and tells the host
/// when the app cancels it.
final class BackgroundTransferProtocol: URLProtocol {
    override class func canInit(with request: URLRequest) -> Bool { true }
    override class func canInit(with task: URLSessionTask) -> Bool { true }
    override class func canonicalRequest(for request: URLRequest) -> URLRequest { request }

    /// The task's end is being delivered (or was): a `cancel()` from now on must not add a
    /// cancellation to it. Set and read under BackgroundSessions' lock.
    var ended = false

    override func startLoading() { BackgroundSessions.shared.start(self) }

    override func stopLoading() {
        // Foundation reports the cancellation through the client right after this returns: a
        // task whose end was already given to the delegate has none to report (Foundation
        // still counts a delivered download as running; docs/sdk.md).
        if !BackgroundSessions.shared.stop(self) { client = nil }
    }
}

/// What swift-corelibs-foundation keeps to itself about a task: the session that made it and an
/// upload's body. Read through reflection (its stored properties `session` and `knownBody`);
/// nil when a later Foundation no longer has them, which the caller reports as an error.
enum TaskInternals {
    static func session(of task: URLSessionTask) -> URLSession? {
        child(named: "session", of: task).flatMap { unwrap($0) as? URLSession }
    }

    enum Body {
        case none
        case file(URL)
        case data(Data)
        case stream
    }

    static func body(of task: URLSessionTask) -> Body? {
        guard let known = child(named: "knownBody", of: task), let body = unwrap(known) else { return nil }
        guard let payload = Mirror(reflecting: body).children.first else { return Body.none }
        switch payload.label {
        case "file": return (payload.value as? URL).map(Body.file)
        case "data": return (payload.value as? DispatchData).map { Body.data(Data($0)) }
        case "stream": return .stream
        default: return Body.none
        }
    }

    private static func child(named name: String, of subject: Any) -> Any? {
        var mirror: Mirror? = Mirror(reflecting: subject)
        while let current = mirror {
            if let child = current.children.first(where: { $0.label == name }) { return child.value }
            mirror = current.superclassMirror
        }
        return nil
    }

    /// The value inside an Optional (`Any` holding `T?`), or the value itself.
    private static func unwrap(_ value: Any) -> Any? {
        let mirror = Mirror(reflecting: value)
        guard mirror.displayStyle == .optional else { return value }
        return mirror.children.first?.value
    }
}

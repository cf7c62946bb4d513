import BGTaskControl
import Foundation

/// What the host tells the dashboard as it happens: the live part of the pages and of
/// /metrics' counters.
public enum DashboardEvent: Sendable {
    case launchBegan(RunningLaunchReport)
    case launchEnded(RunRecord)
}

/// Where the dashboard reads the host: its answer to a control command, exactly as on its
/// control socket (the same verbs, the same checks), called on the server's threads.
public protocol DashboardSource: Sendable {
    func answer(_ command: ControlCommand) -> ControlResponse
    /// Records as JSON texts, newest first, as the host keeps them (the history page passes
    /// them on as they are). Throws what the host's store says.
    func historyJSON(app: String?, limit: Int) throws -> [String]
    /// One ended launch's record as the host keeps it, by its ID (nil: none).
    func recordJSON(launchID: String) throws -> String?
    /// Where the host keeps launches' logs and samples (`LAUNCH_ID.log`, `LAUNCH_ID.samples`).
    var logsDirectory: String { get }
}

/// `bgtask host --http-port`'s settings.
public struct DashboardOptions: Sendable {
    /// The address to listen on: loopback unless the operator says otherwise.
    public var address: String
    /// 0: any free port (the one taken is logged and returned by `start`).
    public var port: Int
    /// Required of every client that is not on loopback (`Authorization: Bearer TOKEN`, or
    /// `?token=` once, which sets a cookie). Listening off loopback without one is refused.
    public var token: String?
    /// Whether the pages may act (simulate a launch or an expiration, push, change conditions,
    /// advance a virtual clock, cancel a request). Read-only otherwise.
    public var actions: Bool

    public init(address: String = "127.0.0.1", port: Int, token: String? = nil, actions: Bool = false) {
        self.address = address
        self.port = port
        self.token = token
        self.actions = actions
    }

    /// Whether `address` is a loopback address (127.0.0.0/8, ::1, localhost).
    public static func isLoopback(_ address: String) -> Bool {
        let host = address.hasPrefix("[") && address.hasSuffix("]") ? String(address.dropFirst().dropLast()) : address
        if host == "localhost" || host == "::1" { return true }
        if host.hasPrefix("::ffff:") { return isLoopback(String(host.dropFirst(7))) }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }
}

import Foundation

/// A launch running now (`running`: `bgtask top`, the dashboard): its time against its budget,
/// its memory against its limit (the supervisor's last sample; read from /proc when asked for a
/// launch under a cgroup's limit, which it does not sample).
public struct RunningLaunchReport: Codable, Sendable, Equatable {
    public var launchID: String
    public var app: String
    public var reason: String
    /// background, foreground or extension.
    public var role: String
    public var identifiers: [String]
    public var startedAt: Date
    public var budgetMs: Double
    public var graceMs: Double
    /// Expired (by its budget, by hand or by the device); its work is over, settling.
    public var expired: Bool
    public var workOver: Bool
    public var pid: Int32?
    /// Resident memory of its app process and that process's children (nil before the first sample).
    public var residentBytes: UInt64?
    public var memoryLimitBytes: UInt64

    public init(launchID: String, app: String, reason: String, role: String, identifiers: [String], startedAt: Date, budgetMs: Double,
                graceMs: Double, expired: Bool = false, workOver: Bool = false, pid: Int32? = nil, residentBytes: UInt64? = nil,
                memoryLimitBytes: UInt64) {
        self.launchID = launchID
        self.app = app
        self.reason = reason
        self.role = role
        self.identifiers = identifiers
        self.startedAt = startedAt
        self.budgetMs = budgetMs
        self.graceMs = graceMs
        self.expired = expired
        self.workOver = workOver
        self.pid = pid
        self.residentBytes = residentBytes
        self.memoryLimitBytes = memoryLimitBytes
    }

    enum CodingKeys: String, CodingKey {
        case app, reason, role, identifiers, expired, pid
        case launchID = "launch_id", startedAt = "started_at", budgetMs = "budget_ms", graceMs = "grace_ms", workOver = "work_over"
        case residentBytes = "resident_bytes", memoryLimitBytes = "memory_limit_bytes"
    }
}

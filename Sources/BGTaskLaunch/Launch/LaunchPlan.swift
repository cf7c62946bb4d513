import BGTaskControl
import BGTaskModel
import Foundation

/// Limits of one launch, as data. Defaults per task type are documented in docs/records-and-limits.md.
public struct LaunchLimits: Sendable, Equatable {
    /// Wall-clock budget shared by all tasks of the launch; at its end expiration is delivered.
    public var budget: Duration
    /// Time between expiration and the watchdog kill of the whole process group.
    public var grace: Duration
    /// Resident memory above which the launch is killed without a callback (jetsam).
    public var memoryLimitBytes: UInt64
    /// The most its log keeps; beyond, output is read and discarded (`log_truncated`).
    public var logLimitBytes: UInt64 = LaunchLimits.defaultLogLimitBytes
    /// Free space its container's filesystem keeps: a launch that writes while there is less
    /// is killed (`disk`). 0: none.
    public var diskReserveBytes: UInt64 = LaunchLimits.defaultDiskReserveBytes
    /// What its app's containers (its own, its groups') and staging may hold: a launch of an
    /// app over it is refused, one that passes it while running is killed (`disk-quota`).
    public var diskQuota = DiskQuota()
    /// The background CPU limit (`cpu-limit`); nil: none, `cpuLimitExemption` says why.
    public var cpuLimit: CPULimit? = .ios
    public var cpuLimitExemption: String?

    public init(budget: Duration, grace: Duration, memoryLimitBytes: UInt64) {
        self.budget = budget
        self.grace = grace
        self.memoryLimitBytes = memoryLimitBytes
    }

    public static let defaultGrace: Duration = .seconds(5)
    /// The background time an app that leaves the foreground has (iOS: about 30 s) for what it
    /// still holds (`beginBackgroundTask`), when its launch's budget would give it more.
    public static let backgroundTimeAfterForeground: Duration = .seconds(30)
    public static let defaultLogLimitBytes: UInt64 = 16 << 20
    public static let defaultDiskReserveBytes: UInt64 = 64 << 20

    /// The defaults for a launch running `kinds` (the most generous kind wins).
    public static func defaults(for kinds: [TaskKind]) -> LaunchLimits {
        let budget: Duration = kinds.map(defaultBudget(for:)).max() ?? defaultBudget(for: .refresh)
        let memory = kinds.map(defaultMemoryLimit(for:)).max() ?? defaultMemoryLimit(for: .refresh)
        return LaunchLimits(budget: budget, grace: defaultGrace, memoryLimitBytes: memory)
    }

    public static func defaultBudget(for kind: TaskKind) -> Duration {
        switch kind {
        case .refresh: .seconds(30)
        case .processing, .healthResearch: .seconds(10 * 60)
        case .continuedProcessing: .seconds(60 * 60)
        }
    }

    public static func defaultMemoryLimit(for kind: TaskKind) -> UInt64 {
        switch kind {
        case .refresh: 256 << 20
        case .processing, .healthResearch, .continuedProcessing: 1 << 30
        }
    }
}

@_exported import struct BGTaskModel.LaunchReason

/// Everything needed to start one launch.
public struct LaunchPlan: Sendable {
    public var bundle: PluginBundle
    public var tasks: [TaskAssignment]
    public var role: LaunchRole
    public var reason: LaunchReason
    public var limits: LaunchLimits
    /// Deliver expiration this long after start instead of at the budget's end (the debugger's
    /// `_simulateExpirationForTaskWithIdentifier`).
    public var expireAfter: Duration?
    public var launchID: String
    /// The app's container, the child's HOME; persists across launches. Laid out as iOS lays
    /// it out (`AppContainer.directories`).
    public var dataDirectory: URL
    /// Where app groups' shared containers live, one directory per group identifier; by
    /// default `groups` beside the `containers` directory that holds `dataDirectory`.
    public var groupsDirectory: URL
    /// Where the child's stdout and stderr go.
    public var logFile: URL
    public var eventJSON: String?
    /// Extra environment for the child (over the parent's own).
    public var environment: [String: String]
    /// BGTASK_RESOURCE_* bits `BGTaskScheduler.supportedResources` reports in the launch.
    public var supportedResources: UInt32 = 0
    /// `UIApplication.backgroundRefreshStatus` for the launch (BGTASK_REFRESH_STATUS_*: 2,
    /// available; 1, denied by the device's or the app's switch).
    public var backgroundRefreshStatus: UInt32 = LaunchPlan.refreshStatusAvailable
    /// `ProcessInfo.thermalState` (its raw value) and `isLowPowerModeEnabled` when the launch
    /// starts; `LaunchControl.device` tells a running launch of changes.
    public var thermalState: UInt32 = 0
    public var lowPowerMode = false
    /// The app's MetricKit payloads to hand to this launch (`MetricDelivery`'s JSON).
    public var metricsJSON: String?
    /// The push a `remote-notification` launch delivers.
    public var push: PushDelivered?

    /// A push delivered in a launch: its apns-id and when the host received it.
    public struct PushDelivered: Sendable, Equatable {
        public var id: String
        public var receivedAt: Date
        public init(id: String, receivedAt: Date) {
            self.id = id
            self.receivedAt = receivedAt
        }
    }
    /// BGTASK_REFRESH_STATUS_AVAILABLE and _DENIED (bgtask/plugin.h).
    public static let refreshStatusAvailable: UInt32 = 2
    public static let refreshStatusDenied: UInt32 = 1

    public init(
        bundle: PluginBundle, tasks: [TaskAssignment], role: LaunchRole = .background, reason: LaunchReason,
        limits: LaunchLimits, expireAfter: Duration? = nil, launchID: String = LaunchPlan.newLaunchID(),
        dataDirectory: URL, logFile: URL, eventJSON: String? = nil, environment: [String: String] = [:],
        groupsDirectory: URL? = nil
    ) {
        self.bundle = bundle
        self.tasks = tasks
        self.role = role
        self.reason = reason
        self.limits = limits
        self.expireAfter = expireAfter
        self.launchID = launchID
        self.dataDirectory = dataDirectory
        self.groupsDirectory = groupsDirectory
            ?? dataDirectory.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("groups", isDirectory: true)
        self.logFile = logFile
        self.eventJSON = eventJSON
        self.environment = environment
    }

    /// What tells the `os` module in a launch whether to keep private values in its entries
    /// (`--log-private`): always set, so that the host's flag decides, not an environment the
    /// host happened to inherit.
    public static func unifiedLoggingEnvironment(keepingPrivateValues: Bool) -> [String: String] {
        ["BGTASK_LOG_PRIVATE": keepingPrivateValues ? "1" : "0"]
    }

    /// Sortable and unique: start time, then random bits.
    public static func newLaunchID() -> String {
        // UTC by hand: a DateFormatter costs an ICU formatter per launch.
        var now = time(nil)
        var utc = tm()
        gmtime_r(&now, &utc)
        func digits(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        let stamp = digits(utc.tm_year + 1900, 4) + digits(utc.tm_mon + 1, 2) + digits(utc.tm_mday, 2) + "T"
            + digits(utc.tm_hour, 2) + digits(utc.tm_min, 2) + digits(utc.tm_sec, 2)
        let random = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        return "\(stamp)-\(String(repeating: "0", count: 8 - random.count))\(random)"
    }
}

extension RunRecord {
    /// The record of a launch whose runner could not be started at all.
    public static func notStarted(_ plan: LaunchPlan, error: BGTaskError) -> RunRecord {
        RunRecord(
            app: plan.bundle.identifier, launchID: plan.launchID, reason: plan.reason.rawValue,
            tasks: plan.tasks.map { TaskRecord(identifier: $0.identifier, type: $0.kind, outcome: .notRegistered) },
            termination: .launchFailed, signal: nil, exitStatus: nil, error: error.description,
            wallMs: 0, cpuMs: 0, peakRSSBytes: 0, memoryLimitBytes: plan.limits.memoryLimitBytes,
            memoryMechanism: "sampler", budgetMs: plan.limits.budget.milliseconds, graceMs: plan.limits.grace.milliseconds,
            expiredAtMs: nil, pid: 0, startedAt: Date(), bundlePath: plan.bundle.url.path, log: nil,
            registered: [], refusedRegistrations: [], submitted: [])
    }
}

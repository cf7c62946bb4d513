import Foundation
import BGTaskModel

/// Everything the child needs to run one launch. Sent by the parent as the first message; the
/// bundle has been validated by the parent, so the child trusts these values.
public struct LaunchAssignment: Codable, Sendable {
    public var launchID: String
    public var role: LaunchRole
    public var bundleIdentifier: String
    public var bundlePath: String
    public var executablePath: String
    public var dataDirectory: String
    public var permittedIdentifiers: [String]
    public var tasks: [TaskAssignment]
    public var mappedHandlers: [MappedHandler]
    public var eventJSON: String?
    public var supportedResources: UInt32
    /// Confine the launch (Landlock, seccomp, no_new_privs); false for `--no-sandbox`.
    public var confine: Bool
    /// Run as this uid, gid and groups (the host is root); nil: stay the host's user.
    public var identity: LaunchIdentity?
    /// RLIMIT_NPROC for the launch's uid (with `identity`): a fork bomb's ceiling.
    public var processLimit: UInt32?
    /// RLIMIT_DATA for the runner: a backstop for the sampled memory limit, far above it, that
    /// stops an allocation burst faster than the sampler can see it.
    public var memoryBackstopBytes: UInt64?
    /// The app groups the bundle is entitled to (`com.apple.security.application-groups`).
    public var appGroups: [AppGroup]
    /// When the launch's time runs out (expiration), in CLOCK_MONOTONIC nanoseconds: what
    /// `backgroundTimeRemaining` counts down to. 0: unknown (no background time is given).
    public var expiresAtNs: UInt64 = 0
    /// `UIApplication.backgroundRefreshStatus` when the launch started (BGTASK_REFRESH_STATUS_*).
    public var backgroundRefreshStatus: UInt32 = 2
    /// Why the launch happened (`LaunchReason`'s raw value: "scheduled", "remote-notification", ...).
    public var reason: String = ""
    /// The app's process is kept between launches (`AppLifecycle.ios`): when the launch's work
    /// is over the runner says `idle` and waits to be suspended, instead of exiting.
    public var suspendable = false
    /// `ProcessInfo.thermalState` (its raw value: 0 nominal … 3 critical) and
    /// `isLowPowerModeEnabled` when the launch starts; `ParentMessage.device` tells of changes.
    public var thermalState: UInt32 = 0
    public var lowPowerMode = false
    /// The app's MetricKit payloads not delivered before (`MetricDelivery`'s JSON), or nil.
    public var metricsJSON: String?

    public init(
        launchID: String, role: LaunchRole, bundleIdentifier: String, bundlePath: String,
        executablePath: String, dataDirectory: String, permittedIdentifiers: [String],
        tasks: [TaskAssignment], mappedHandlers: [MappedHandler], eventJSON: String? = nil,
        supportedResources: UInt32 = 0, memoryBackstopBytes: UInt64? = nil, appGroups: [AppGroup] = [],
        confine: Bool = true, identity: LaunchIdentity? = nil, processLimit: UInt32? = nil
    ) {
        self.launchID = launchID
        self.role = role
        self.bundleIdentifier = bundleIdentifier
        self.bundlePath = bundlePath
        self.executablePath = executablePath
        self.dataDirectory = dataDirectory
        self.permittedIdentifiers = permittedIdentifiers
        self.tasks = tasks
        self.mappedHandlers = mappedHandlers
        self.eventJSON = eventJSON
        self.supportedResources = supportedResources
        self.memoryBackstopBytes = memoryBackstopBytes
        self.appGroups = appGroups
        self.confine = confine
        self.identity = identity
        self.processLimit = processLimit
    }
}

/// Messages the child sends to its parent. Times are CLOCK_MONOTONIC nanoseconds, a clock every
/// process on the machine shares, so the parent can place them on its launch's time line.
public enum ChildMessage: Sendable, Equatable {
    /// About to dlopen the bundle's executable: a death from here to `launched` is a load or
    /// init failure.
    case loading(path: String, at: UInt64)
    case registered(identifier: String, at: UInt64)
    case registerRefused(identifier: String, reason: String)
    case launched(at: UInt64)
    case launchFailed(error: String)
    case taskBegan(task: UInt64, at: UInt64)
    case taskNotRegistered(task: UInt64)
    case expirationDelivered(task: UInt64, at: UInt64, toApp: Bool)
    case taskCompleted(task: UInt64, success: Bool, at: UInt64)
    case fatal(error: String)
    case log(level: Int32, message: String)
    case submit(seq: UInt64, request: TaskRequest)
    case cancel(seq: UInt64, identifier: String?)
    case pending(seq: UInt64)
    case progress(task: UInt64, completed: Int64, total: Int64)
    case title(task: UInt64, title: String, subtitle: String?)
    /// Every task ended; the runner has killed what it started (`descendants`: whether it had
    /// started anything, so the host knows whether to look for leftovers) and exits next.
    /// `peakResidentBytes`: the app process's own peak resident set (its `ru_maxrss`), which
    /// the host's samples may have missed in a short launch (the app's word: it can only raise
    /// its record's peak, which the host bounds).
    case finished(at: UInt64, descendants: Bool, peakResidentBytes: UInt64)
    /// Every task, background-time assertion and push handler of the launch ended, the main
    /// queue finished its turn and went quiet, and the runner killed what it had started: the
    /// process waits to be suspended (a `suspendable` launch only; others say `finished` and
    /// exit). `peakResidentBytes` as in `finished`; `cpuNanoseconds`: the process's CPU time so
    /// far (its `getrusage`, user and system), which the host bounds from below by its own
    /// coarser reading of /proc (the app can make it no smaller than that). `hearsResumes`: the
    /// plugin set a resume handler, so a resumed launch can bring it what its launch entry would
    /// have heard (a push, an event, coming to the foreground); without one the process is
    /// resumed only for launches that bring tasks alone.
    case idle(at: UInt64, peakResidentBytes: UInt64, cpuNanoseconds: UInt64, hearsResumes: Bool, wakeups: UInt64 = 0)
    /// The answer to `probeChildren`: whether the runner has a child process now.
    case children(Bool)
    /// The confinement the runner applied to itself, sent before it loads any plugin code (so
    /// nothing the plugin does can have written it).
    case sandbox([String: SandboxLayer])
    /// Background time (`beginBackgroundTask`): an assertion taken, ended, and told that the
    /// launch's time is running out (`toApp`: it had an expiration handler).
    case backgroundTimeBegan(id: UInt64, name: String?, at: UInt64)
    case backgroundTimeEnded(id: UInt64, at: UInt64)
    case backgroundTimeExpired(id: UInt64, at: UInt64, toApp: Bool)
    /// `registerForRemoteNotifications`: asks for the app's device token (answered by `reply`,
    /// the token in its message).
    case deviceToken(seq: UInt64)
    /// The push's completion handler was called with `result` (BGTASK_FETCH_RESULT_*).
    case remoteNotificationCompleted(result: UInt32, at: UInt64)
    /// Local notifications (`UNUserNotificationCenter`), each answered with `notificationReply`:
    /// the app's authorization (`request`: the app asks for it, which the host records), a
    /// request added, the pending or delivered list, a removal (`identifiers` nil: all).
    case notificationAuthorization(seq: UInt64, options: UInt32, request: Bool)
    case notificationAdd(seq: UInt64, request: NotificationRequest)
    case notificationList(seq: UInt64, delivered: Bool)
    case notificationRemove(seq: UInt64, delivered: Bool, identifiers: [String]?)
    /// The app's delegate answered `willPresent` for a notification delivered while it was in
    /// the foreground: `UNNotificationPresentationOptions`' raw value.
    case notificationPresented(identifier: String, options: UInt32)
    /// The app took the MetricKit payloads its launch brought (`metric_payloads`).
    case metricsTaken
    /// Background URL sessions: a `TransferCall` as JSON (BGTaskModel/Transfers.swift), answered
    /// with `transferReply`. The host decodes and checks it (`TransferCall.problem`).
    case transferCall(seq: UInt64, json: String)
}

/// Messages the parent sends to its child.
public enum ParentMessage: Sendable, Equatable {
    case start(LaunchAssignment)
    /// The next launch of an app whose process said `idle` (and was suspended, then continued):
    /// its tasks, budget and reason. The plugin is not loaded again and its launch entry is not
    /// called again; its resume handler is (`set_resume_handler`).
    case resume(LaunchAssignment)
    /// Time is up: deliver expiration to every open task (or only `task`).
    case expire(task: UInt64?, reason: String)
    case reply(seq: UInt64, status: Int32, message: String?, requests: [TaskRequest]?)
    /// Foreground launches: run one more task in this process (a continued-processing request
    /// the app submitted, once a slot is free).
    case startTask(TaskAssignment)
    /// Foreground launches: nothing more will be started; end once every task has ended.
    case close
    /// Does the runner have a child process? Answered with `children` by the runner's reader
    /// thread (waitid, no /proc): the host walks a launch's process tree only when it has one.
    case probeChildren
    /// The launch's time now runs out at `expiresAtNs` (a foreground launch left the foreground:
    /// it has the background time iOS gives an app that enters the background).
    case deadline(expiresAtNs: UInt64)
    /// The device's thermal state or Low Power Mode changed during the launch.
    case device(thermalState: UInt32, lowPowerMode: Bool)
    /// A notification of the app's was delivered while it is in the foreground (its delegate's
    /// `willPresent` decides how it is shown).
    case notificationDelivered(NotificationEntry)
    /// The answer to a notification request: a status (BGTASK_OK, or BGTASK_E_* with
    /// `message`), the app's authorization (BGTASK_NOTIFICATION_AUTH_*), and for a list its
    /// entries.
    case notificationReply(seq: UInt64, status: Int32, message: String?, authorization: UInt32, notifications: [NotificationEntry])
    /// The answer to `transferCall`: a status (BGTASK_OK, or BGTASK_E_* with `message`) and a
    /// `TransferReply` as JSON.
    case transferReply(seq: UInt64, status: Int32, message: String?, json: String?)
    /// A `TransferEvent` as JSON, for a session this launch attached to.
    case transferEvent(json: String)
}

extension LaunchAssignment: Equatable {}

/// Exit statuses the runner uses for its own failures, so the supervisor can name them when no
/// message could explain them.
public enum RunnerExitStatus {
    /// The first message from the parent was missing or not a `start`.
    public static let protocolError: Int32 = 70
    /// The launch failed before the plugin's entry returned (a `launchFailed` message says why).
    public static let launchFailed: Int32 = 71
    /// Plugin code closed or broke the launch channel; the runner ended the launch.
    public static let channelLost: Int32 = 75
}

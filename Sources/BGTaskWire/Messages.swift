import Foundation

/// The kinds of background task, with the names run records use.
public enum TaskKind: String, Codable, Sendable, CaseIterable {
    case refresh
    case processing
    case healthResearch = "health-research"
    case continuedProcessing = "continued-processing"

    /// The numeric value of `bgtask_task_type` in `bgtask/plugin.h`.
    public var abiValue: Int32 {
        switch self {
        case .refresh: 1
        case .processing: 2
        case .healthResearch: 3
        case .continuedProcessing: 4
        }
    }

    public init?(abiValue: Int32) {
        guard let kind = Self.allCases.first(where: { $0.abiValue == abiValue }) else { return nil }
        self = kind
    }
}

/// Why a process was launched (`bgtask_launch_role`).
public enum LaunchRole: String, Codable, Sendable, CaseIterable {
    case background, foreground, `extension`

    public var abiValue: Int32 {
        switch self {
        case .background: 0
        case .foreground: 1
        case .extension: 2
        }
    }
}

/// One task the parent asks the child to run in this launch.
public struct TaskAssignment: Codable, Sendable, Equatable {
    public var task: UInt64
    public var identifier: String
    public var kind: TaskKind

    public init(task: UInt64, identifier: String, kind: TaskKind) {
        self.task = task
        self.identifier = identifier
        self.kind = kind
    }
}

/// A handler a C plugin exports and its Info.plist maps to an identifier (`BGTaskHandlers`):
/// the runner calls it through libffi with the arguments named here.
public struct MappedHandler: Codable, Sendable, Equatable {
    /// The values a mapped handler may take, in any order.
    public enum Argument: String, Codable, Sendable, CaseIterable {
        case identifier       // const char *
        case task             // const bgtask_task_info *
        case taskID = "task_id" // uint64_t
        case type             // int32_t (bgtask_task_type)
        case dataDirectory = "data_directory" // const char *
        case api              // const bgtask_host_api *
        case host             // bgtask_host *
        case complete         // void (*)(bool success): a closure bound to this task
    }

    /// What the return value means.
    public enum Result: String, Codable, Sendable, CaseIterable {
        case void   // the handler completes the task itself (through `complete` or the api)
        case bool   // the task completes when the call returns: true is success
        case int    // the task completes when the call returns: 0 is success
    }

    public var identifier: String
    public var symbol: String
    public var arguments: [Argument]
    public var result: Result

    public init(identifier: String, symbol: String, arguments: [Argument], result: Result) {
        self.identifier = identifier
        self.symbol = symbol
        self.arguments = arguments
        self.result = result
    }
}

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

/// A task request as it crosses process boundaries.
///
/// Its JSON has every field by default: that is the control protocol's form, which the
/// control server's fast reader expects whole. Encoders that write for people (run records,
/// the CLI's `--json`) set `userInfo[WireTaskRequest.omitsInapplicableFields] = true` to leave
/// out what the request's kind does not have (a refresh request has no strategy). Decoding
/// takes either form: an absent field has its default.
public struct WireTaskRequest: Codable, Sendable, Equatable {
    public var kind: TaskKind
    public var identifier: String
    /// Seconds since 1970.
    public var earliestBeginDate: Double?
    public var requiresNetworkConnectivity: Bool
    public var requiresExternalPower: Bool
    public var protectionType: Int32
    public var title: String?
    public var subtitle: String?
    public var strategyFail: Bool
    public var requiredResources: UInt32

    public init(
        kind: TaskKind, identifier: String, earliestBeginDate: Double? = nil,
        requiresNetworkConnectivity: Bool = false, requiresExternalPower: Bool = false,
        protectionType: Int32 = 0, title: String? = nil, subtitle: String? = nil,
        strategyFail: Bool = false, requiredResources: UInt32 = 0
    ) {
        self.kind = kind
        self.identifier = identifier
        self.earliestBeginDate = earliestBeginDate
        self.requiresNetworkConnectivity = requiresNetworkConnectivity
        self.requiresExternalPower = requiresExternalPower
        self.protectionType = protectionType
        self.title = title
        self.subtitle = subtitle
        self.strategyFail = strategyFail
        self.requiredResources = requiredResources
    }

    /// Set to true in an encoder's `userInfo` to omit the fields the request's kind does not
    /// have: network and power are processing and health-research fields, the protection
    /// class a health-research one, title, subtitle, strategy and resources continued-processing
    /// ones.
    public static let omitsInapplicableFields = CodingUserInfoKey(rawValue: "bgtask.WireTaskRequest.omitsInapplicableFields")!

    enum CodingKeys: String, CodingKey {
        case kind, identifier, earliestBeginDate, requiresNetworkConnectivity, requiresExternalPower, protectionType
        case title, subtitle, strategyFail, requiredResources
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        let every = encoder.userInfo[Self.omitsInapplicableFields] as? Bool != true
        try container.encode(kind, forKey: .kind)
        try container.encode(identifier, forKey: .identifier)
        try container.encodeIfPresent(earliestBeginDate, forKey: .earliestBeginDate)
        if every || kind == .processing || kind == .healthResearch {
            try container.encode(requiresNetworkConnectivity, forKey: .requiresNetworkConnectivity)
            try container.encode(requiresExternalPower, forKey: .requiresExternalPower)
        }
        if every || kind == .healthResearch {
            try container.encode(protectionType, forKey: .protectionType)
        }
        if every || kind == .continuedProcessing {
            try container.encodeIfPresent(title, forKey: .title)
            try container.encodeIfPresent(subtitle, forKey: .subtitle)
            try container.encode(strategyFail, forKey: .strategyFail)
            try container.encode(requiredResources, forKey: .requiredResources)
        }
    }

    /// Reads the keys present only (asking for each absent one costs as much as reading one);
    /// `kind` and `identifier` are required, every other field defaults.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        var kind: TaskKind?, identifier: String?
        self.init(kind: .refresh, identifier: "")
        for key in container.allKeys {
            switch key {
            case .kind: kind = try container.decode(TaskKind.self, forKey: key)
            case .identifier: identifier = try container.decode(String.self, forKey: key)
            case .earliestBeginDate: earliestBeginDate = try container.decodeIfPresent(Double.self, forKey: key)
            case .requiresNetworkConnectivity: requiresNetworkConnectivity = try container.decode(Bool.self, forKey: key)
            case .requiresExternalPower: requiresExternalPower = try container.decode(Bool.self, forKey: key)
            case .protectionType: protectionType = try container.decode(Int32.self, forKey: key)
            case .title: title = try container.decodeIfPresent(String.self, forKey: key)
            case .subtitle: subtitle = try container.decodeIfPresent(String.self, forKey: key)
            case .strategyFail: strategyFail = try container.decode(Bool.self, forKey: key)
            case .requiredResources: requiredResources = try container.decode(UInt32.self, forKey: key)
            }
        }
        guard let kind else {
            throw DecodingError.keyNotFound(CodingKeys.kind, .init(codingPath: decoder.codingPath, debugDescription: "No value associated with key kind"))
        }
        guard let identifier else {
            throw DecodingError.keyNotFound(CodingKeys.identifier, .init(codingPath: decoder.codingPath, debugDescription: "No value associated with key identifier"))
        }
        self.kind = kind
        self.identifier = identifier
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
    case submit(seq: UInt64, request: WireTaskRequest)
    case cancel(seq: UInt64, identifier: String?)
    case pending(seq: UInt64)
    case progress(task: UInt64, completed: Int64, total: Int64)
    case title(task: UInt64, title: String, subtitle: String?)
    /// Every task ended; the runner has killed what it started (`descendants`: whether it had
    /// started anything, so the host knows whether to look for leftovers) and exits next.
    case finished(at: UInt64, descendants: Bool)
    /// The answer to `probeChildren`: whether the runner has a child process now.
    case children(Bool)
    /// The confinement the runner applied to itself, sent before it loads any plugin code (so
    /// nothing the plugin does can have written it).
    case sandbox([String: SandboxLayer])
}

/// Messages the parent sends to its child.
public enum ParentMessage: Sendable, Equatable {
    case start(LaunchAssignment)
    /// Time is up: deliver expiration to every open task (or only `task`).
    case expire(task: UInt64?, reason: String)
    case reply(seq: UInt64, status: Int32, message: String?, requests: [WireTaskRequest]?)
    /// Foreground launches: run one more task in this process (a continued-processing request
    /// the app submitted, once a slot is free).
    case startTask(TaskAssignment)
    /// Foreground launches: nothing more will be started; end once every task has ended.
    case close
    /// Does the runner have a child process? Answered with `children` by the runner's reader
    /// thread (waitid, no /proc): the host walks a launch's process tree only when it has one.
    case probeChildren
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

/// `BGTaskSchedulerPermittedIdentifiers` matching, shared by the host (validation, submission
/// rules) and the runner (registration): an entry is an identifier, or `prefix.*`, which
/// permits continued-processing identifiers under the prefix.
public enum PermittedIdentifiers {
    public static func pattern(_ pattern: String, matches identifier: String) -> Bool {
        if isWildcard(pattern) {
            let prefix = pattern.dropLast(1)
            return identifier.count > prefix.count && identifier.hasPrefix(prefix)
        }
        return pattern == identifier
    }

    public static func isWildcard(_ pattern: String) -> Bool { pattern.hasSuffix(".*") }
}

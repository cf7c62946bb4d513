import Foundation

// The domain model: the kinds of task, a task request, what a launch runs, and the rules every
// part shares about them, for the SDK-facing runner, the wire codec, the store, the host and the
// CLI alike. Encodings (the launch channel's binary codec in BGTaskWire, control JSON, SQL rows,
// the C structs of the ABI) are built on these types.

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

    /// A processing task as iOS treats one: `BGProcessingTaskRequest` and its subclass
    /// `BGHealthResearchTaskRequest` (power and network requirements, device conditions).
    public var isProcessing: Bool { self == .processing || self == .healthResearch }
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

/// A task request, as the host keeps it and as it crosses process boundaries (the SDK's
/// `BGTaskRequest` subclasses are its Swift face).
///
/// Its JSON has every field by default: that is the control protocol's form, which the
/// control server's fast reader expects whole. Encoders that write for people (run records,
/// the CLI's `--json`) set `userInfo[TaskRequest.omitsInapplicableFields] = true` to leave
/// out what the request's kind does not have (a refresh request has no strategy). Decoding
/// takes either form: an absent field has its default.
public struct TaskRequest: Codable, Sendable, Equatable {
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
    public static let omitsInapplicableFields = CodingUserInfoKey(rawValue: "bgtask.TaskRequest.omitsInapplicableFields")!

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
        if every || kind.isProcessing {
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

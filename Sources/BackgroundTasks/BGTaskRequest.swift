import BGTaskABI
import CBGTaskPluginABI
import Foundation

/// An abstract request to launch the app in the background. Submit one of the subclasses.
open class BGTaskRequest: NSObject, NSCopying, @unchecked Sendable {
    private let lock = NSLock()
    private let _identifier: String
    private var _earliestBeginDate: Date?

    /// The identifier of the task, one of BGTaskSchedulerPermittedIdentifiers.
    open var identifier: String { _identifier }

    /// The earliest date the task may run; nil for no delay. A floor, not a promise.
    open var earliestBeginDate: Date? {
        get { lock.withLock { _earliestBeginDate } }
        set { lock.withLock { _earliestBeginDate = newValue } }
    }

    init(requestIdentifier identifier: String) {
        _identifier = identifier
    }

    @available(*, unavailable, message: "create a BGAppRefreshTaskRequest or BGProcessingTaskRequest")
    public override init() { fatalError("BGTaskRequest is abstract") }

    open func copy(with zone: NSZone? = nil) -> Any {
        let copy = BGTaskRequest(requestIdentifier: identifier)
        copy.earliestBeginDate = earliestBeginDate
        return copy
    }

    open override var description: String {
        let date = earliestBeginDate.map { "\($0)" } ?? "(null)"
        return "<\(type(of: self)): \(identifier), earliestBeginDate: \(date)>"
    }

    /// Requests are equal, as Apple's are, when they are of the same class and every field
    /// is: each subclass adds its own fields after its superclass's.
    open override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? BGTaskRequest, type(of: other) == type(of: self) else { return false }
        return identifier == other.identifier && earliestBeginDate == other.earliestBeginDate
    }

    /// The class, identifier and date: equal requests share them whatever their subclass adds.
    open override var hash: Int {
        var hasher = Hasher()
        hasher.combine(ObjectIdentifier(type(of: self)))
        hasher.combine(identifier)
        hasher.combine(earliestBeginDate)
        return hasher.finalize()
    }

    /// The task type the host schedules this request as.
    var taskType: bgtask_task_type { BGTASK_TYPE_REFRESH.rawValue }

    /// Fills the request fields a subclass adds.
    func fill(_ request: inout bgtask_request) {}
}

/// A request to launch the app briefly in the background to refresh content (`fetch` mode).
open class BGAppRefreshTaskRequest: BGTaskRequest, @unchecked Sendable {
    public init(identifier: String) {
        super.init(requestIdentifier: identifier)
    }

    open override func copy(with zone: NSZone? = nil) -> Any {
        let copy = BGAppRefreshTaskRequest(identifier: identifier)
        copy.earliestBeginDate = earliestBeginDate
        return copy
    }
}

/// A request to launch the app in the background for deferrable, longer work (`processing`).
open class BGProcessingTaskRequest: BGTaskRequest, @unchecked Sendable {
    private let fieldsLock = NSLock()
    private var _requiresNetworkConnectivity = false
    private var _requiresExternalPower = false

    /// Run only while the device has network connectivity.
    open var requiresNetworkConnectivity: Bool {
        get { fieldsLock.withLock { _requiresNetworkConnectivity } }
        set { fieldsLock.withLock { _requiresNetworkConnectivity = newValue } }
    }

    /// Run only while the device is on external power; the task is expired when power goes away.
    open var requiresExternalPower: Bool {
        get { fieldsLock.withLock { _requiresExternalPower } }
        set { fieldsLock.withLock { _requiresExternalPower = newValue } }
    }

    public init(identifier: String) {
        super.init(requestIdentifier: identifier)
    }

    open override func copy(with zone: NSZone? = nil) -> Any {
        let copy = BGProcessingTaskRequest(identifier: identifier)
        copyFields(to: copy)
        return copy
    }

    open override func isEqual(_ object: Any?) -> Bool {
        guard super.isEqual(object), let other = object as? BGProcessingTaskRequest else { return false }
        return requiresNetworkConnectivity == other.requiresNetworkConnectivity
            && requiresExternalPower == other.requiresExternalPower
    }

    func copyFields(to copy: BGProcessingTaskRequest) {
        copy.earliestBeginDate = earliestBeginDate
        copy.requiresNetworkConnectivity = requiresNetworkConnectivity
        copy.requiresExternalPower = requiresExternalPower
    }

    override var taskType: bgtask_task_type { BGTASK_TYPE_PROCESSING.rawValue }

    override func fill(_ request: inout bgtask_request) {
        request.requires_network = requiresNetworkConnectivity
        request.requires_external_power = requiresExternalPower
    }
}

/// `FileProtectionType`'s classes as the `NSString` that `protectionTypeOfRequiredData` is (as
/// Apple declares it), so that the spelling tutorials teach,
/// `request.protectionTypeOfRequiredData = .completeUntilFirstUserAuthentication`, compiles and
/// sets Apple's value (`FileProtectionType.completeUntilFirstUserAuthentication.rawValue`).
extension NSString {
    public static var complete: NSString { NSString(string: FileProtectionType.complete.rawValue) }
    public static var completeUnlessOpen: NSString { NSString(string: FileProtectionType.completeUnlessOpen.rawValue) }
    public static var completeUntilFirstUserAuthentication: NSString {
        NSString(string: FileProtectionType.completeUntilFirstUserAuthentication.rawValue)
    }
}

/// A processing request for health research; needs the health-research entitlement.
open class BGHealthResearchTaskRequest: BGProcessingTaskRequest, @unchecked Sendable {
    private let protectionLock = NSLock()
    private var _protectionTypeOfRequiredData = FileProtectionType.completeUntilFirstUserAuthentication.rawValue

    /// The data protection class of the data the task reads, a `FileProtectionType` raw value
    /// (`FileProtectionType.complete.rawValue as NSString`, or the string itself): the task
    /// runs only while such data is available (see `bgtask device --locked`). An NSString, as
    /// Apple declares it; a value that is no protection class counts as none.
    open var protectionTypeOfRequiredData: NSString {
        get { NSString(string: protectionRawValue) }
        set {
            let value = String(newValue)
            protectionLock.withLock { _protectionTypeOfRequiredData = value }
        }
    }

    /// `protectionTypeOfRequiredData` as the Swift string it is stored as.
    var protectionRawValue: String { protectionLock.withLock { _protectionTypeOfRequiredData } }

    public override init(identifier: String) {
        super.init(identifier: identifier)
    }

    open override func copy(with zone: NSZone? = nil) -> Any {
        let copy = BGHealthResearchTaskRequest(identifier: identifier)
        copyFields(to: copy)
        copy.protectionTypeOfRequiredData = protectionTypeOfRequiredData
        return copy
    }

    override var taskType: bgtask_task_type { BGTASK_TYPE_HEALTH_RESEARCH.rawValue }

    override func fill(_ request: inout bgtask_request) {
        super.fill(&request)
        request.protection_type = Self.abiValue(of: protectionRawValue)
    }

    open override func isEqual(_ object: Any?) -> Bool {
        guard super.isEqual(object), let other = object as? BGHealthResearchTaskRequest else { return false }
        return protectionRawValue == other.protectionRawValue
    }

    /// `bgtask_request.protection_type` for a FileProtectionType raw value (0, none, for any
    /// other string).
    static func abiValue(of protectionType: String) -> Int32 {
        switch protectionType {
        case FileProtectionType.complete.rawValue: 1
        case FileProtectionType.completeUnlessOpen.rawValue: 2
        case FileProtectionType.completeUntilFirstUserAuthentication.rawValue: 3
        default: 0
        }
    }

    static func protectionType(abiValue: Int32) -> FileProtectionType {
        switch abiValue {
        case 1: .complete
        case 2: .completeUnlessOpen
        case 3: .completeUntilFirstUserAuthentication
        default: .none
        }
    }
}

/// A request, made from the foreground, for work that continues when the app leaves it and that
/// the user watches and may cancel (iOS 26).
open class BGContinuedProcessingTaskRequest: BGTaskRequest, @unchecked Sendable {
    /// What to do when the task cannot start at once.
    public enum SubmissionStrategy: Int, Sendable {
        /// Fail the submission with `immediateRunIneligible`.
        case fail = 0
        /// Queue the request until a slot is free.
        case queue = 1
    }

    /// System resources a task needs beyond CPU.
    public struct Resources: OptionSet, Sendable, Hashable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        public static let gpu = Resources(rawValue: 1 << 0)
    }

    private let textLock = NSLock()
    private var _title: String
    private var _subtitle: String
    private var _strategy: SubmissionStrategy = .queue
    private var _requiredResources: Resources = []

    open var title: String {
        get { textLock.withLock { _title } }
        set { textLock.withLock { _title = newValue } }
    }
    open var subtitle: String {
        get { textLock.withLock { _subtitle } }
        set { textLock.withLock { _subtitle = newValue } }
    }
    open var strategy: SubmissionStrategy {
        get { textLock.withLock { _strategy } }
        set { textLock.withLock { _strategy = newValue } }
    }
    open var requiredResources: Resources {
        get { textLock.withLock { _requiredResources } }
        set { textLock.withLock { _requiredResources = newValue } }
    }

    public init(identifier: String, title: String, subtitle: String) {
        _title = title
        _subtitle = subtitle
        super.init(requestIdentifier: identifier)
    }

    open override func copy(with zone: NSZone? = nil) -> Any {
        let copy = BGContinuedProcessingTaskRequest(identifier: identifier, title: title, subtitle: subtitle)
        copy.earliestBeginDate = earliestBeginDate
        copy.strategy = strategy
        copy.requiredResources = requiredResources
        return copy
    }

    open override func isEqual(_ object: Any?) -> Bool {
        guard super.isEqual(object), let other = object as? BGContinuedProcessingTaskRequest else { return false }
        return title == other.title && subtitle == other.subtitle && strategy == other.strategy
            && requiredResources == other.requiredResources
    }

    override var taskType: bgtask_task_type { BGTASK_TYPE_CONTINUED_PROCESSING.rawValue }

    override func fill(_ request: inout bgtask_request) {
        request.strategy = (strategy == .fail ? BGTASK_STRATEGY_FAIL : BGTASK_STRATEGY_QUEUE).rawValue
        request.required_resources = UInt32(truncatingIfNeeded: requiredResources.rawValue)
    }
}

extension BGTaskRequest {
    /// Builds the Swift request the host describes (for `pendingTaskRequests`).
    static func make(from request: bgtask_request) -> BGTaskRequest {
        let identifier = String(cString: request.identifier)
        let made: BGTaskRequest
        switch request.type {
        case BGTASK_TYPE_PROCESSING.rawValue, BGTASK_TYPE_HEALTH_RESEARCH.rawValue:
            let processing = request.type == BGTASK_TYPE_HEALTH_RESEARCH.rawValue
                ? BGHealthResearchTaskRequest(identifier: identifier)
                : BGProcessingTaskRequest(identifier: identifier)
            processing.requiresNetworkConnectivity = request.requires_network
            processing.requiresExternalPower = request.requires_external_power
            if let health = processing as? BGHealthResearchTaskRequest {
                health.protectionTypeOfRequiredData = NSString(
                    string: BGHealthResearchTaskRequest.protectionType(abiValue: request.protection_type).rawValue)
            }
            made = processing
        case BGTASK_TYPE_CONTINUED_PROCESSING.rawValue:
            let continued = BGContinuedProcessingTaskRequest(
                identifier: identifier,
                title: String(optionalCString: request.title) ?? "",
                subtitle: String(optionalCString: request.subtitle) ?? "")
            continued.strategy = request.strategy == BGTASK_STRATEGY_FAIL.rawValue ? .fail : .queue
            continued.requiredResources = .init(rawValue: Int(request.required_resources))
            made = continued
        default:
            made = BGAppRefreshTaskRequest(identifier: identifier)
        }
        if !request.earliest_begin_date.isNaN {
            made.earliestBeginDate = Date(timeIntervalSince1970: request.earliest_begin_date)
        }
        return made
    }
}

import Foundation

/// A sound's name (`UNNotificationSoundName`): a file in the app's bundle or Library/Sounds.
public struct UNNotificationSoundName: RawRepresentable, Hashable, Sendable, ExpressibleByStringLiteral {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { rawValue = value }
}

/// The sound a notification plays. Kept and shown by the host (a desktop banner plays the
/// desktop's own sound); `default` is the one apps use.
open class UNNotificationSound: NSObject, NSCopying, @unchecked Sendable {
    /// The name the request carries: "default", "defaultCritical", or a file's name.
    let name: String

    init(name: String) {
        self.name = name
        super.init()
    }

    public convenience init(named name: UNNotificationSoundName) { self.init(name: name.rawValue) }

    open class var `default`: UNNotificationSound { UNNotificationSound(name: "default") }
    open class var defaultCritical: UNNotificationSound { UNNotificationSound(name: "defaultCritical") }
    open class var defaultRingtone: UNNotificationSound { UNNotificationSound(name: "defaultRingtone") }
    open class func criticalSoundNamed(_ name: UNNotificationSoundName) -> UNNotificationSound { UNNotificationSound(name: name.rawValue) }
    open class func criticalSoundNamed(_ name: UNNotificationSoundName, withAudioVolume volume: Float) -> UNNotificationSound {
        UNNotificationSound(name: name.rawValue)
    }
    open class func defaultCriticalSound(withAudioVolume volume: Float) -> UNNotificationSound { .defaultCritical }

    open func copy(with zone: NSZone? = nil) -> Any { self }

    open override func isEqual(_ object: Any?) -> Bool { (object as? UNNotificationSound)?.name == name }
    open override var hash: Int { name.hashValue }
    open override var description: String { "<UNNotificationSound: \(name)>" }
}

/// A notification's interruption level (iOS 15).
public enum UNNotificationInterruptionLevel: UInt, Sendable {
    case passive = 0
    case active = 1
    case timeSensitive = 2
    case critical = 3
}

/// What a notification shows (`UNNotificationContent`): immutable; make one with
/// `UNMutableNotificationContent`.
open class UNNotificationContent: NSObject, NSCopying, NSMutableCopying, @unchecked Sendable {
    open internal(set) var title: String = ""
    open internal(set) var subtitle: String = ""
    open internal(set) var body: String = ""
    open internal(set) var badge: NSNumber?
    open internal(set) var sound: UNNotificationSound?
    open internal(set) var userInfo: [AnyHashable: Any] = [:]
    open internal(set) var threadIdentifier: String = ""
    open internal(set) var categoryIdentifier: String = ""
    open internal(set) var launchImageName: String = ""
    open internal(set) var targetContentIdentifier: String?
    open internal(set) var summaryArgument: String = ""
    open internal(set) var summaryArgumentCount: Int = 0
    open internal(set) var interruptionLevel: UNNotificationInterruptionLevel = .active
    open internal(set) var relevanceScore: Double = 0

    public override init() { super.init() }

    /// Copies every field of `other` into this object.
    func take(_ other: UNNotificationContent) {
        title = other.title
        subtitle = other.subtitle
        body = other.body
        badge = other.badge
        sound = other.sound
        userInfo = other.userInfo
        threadIdentifier = other.threadIdentifier
        categoryIdentifier = other.categoryIdentifier
        launchImageName = other.launchImageName
        targetContentIdentifier = other.targetContentIdentifier
        summaryArgument = other.summaryArgument
        summaryArgumentCount = other.summaryArgumentCount
        interruptionLevel = other.interruptionLevel
        relevanceScore = other.relevanceScore
    }

    open func copy(with zone: NSZone? = nil) -> Any {
        let copy = UNNotificationContent()
        copy.take(self)
        return copy
    }

    open func mutableCopy(with zone: NSZone? = nil) -> Any {
        let copy = UNMutableNotificationContent()
        copy.take(self)
        return copy
    }

    open override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? UNNotificationContent else { return false }
        return title == other.title && subtitle == other.subtitle && body == other.body && badge == other.badge
            && sound == other.sound && threadIdentifier == other.threadIdentifier && categoryIdentifier == other.categoryIdentifier
            && NSDictionary(dictionary: userInfo).isEqual(to: other.userInfo)
    }

    open override var hash: Int { title.hashValue ^ body.hashValue }

    open override var description: String {
        "<UNNotificationContent: title: \(title), subtitle: \(subtitle), body: \(body), badge: \(badge.map { "\($0)" } ?? "(null)"), sound: \(sound?.name ?? "(null)"), threadIdentifier: \(threadIdentifier), categoryIdentifier: \(categoryIdentifier)>"
    }
}

/// Content an app fills in before adding a request.
open class UNMutableNotificationContent: UNNotificationContent, @unchecked Sendable {
    open override var title: String { get { super.title } set { super.title = newValue } }
    open override var subtitle: String { get { super.subtitle } set { super.subtitle = newValue } }
    open override var body: String { get { super.body } set { super.body = newValue } }
    open override var badge: NSNumber? { get { super.badge } set { super.badge = newValue } }
    open override var sound: UNNotificationSound? { get { super.sound } set { super.sound = newValue } }
    open override var userInfo: [AnyHashable: Any] { get { super.userInfo } set { super.userInfo = newValue } }
    open override var threadIdentifier: String { get { super.threadIdentifier } set { super.threadIdentifier = newValue } }
    open override var categoryIdentifier: String { get { super.categoryIdentifier } set { super.categoryIdentifier = newValue } }
    open override var launchImageName: String { get { super.launchImageName } set { super.launchImageName = newValue } }
    open override var targetContentIdentifier: String? { get { super.targetContentIdentifier } set { super.targetContentIdentifier = newValue } }
    open override var summaryArgument: String { get { super.summaryArgument } set { super.summaryArgument = newValue } }
    open override var summaryArgumentCount: Int { get { super.summaryArgumentCount } set { super.summaryArgumentCount = newValue } }
    open override var interruptionLevel: UNNotificationInterruptionLevel { get { super.interruptionLevel } set { super.interruptionLevel = newValue } }
    open override var relevanceScore: Double { get { super.relevanceScore } set { super.relevanceScore = newValue } }

    public override init() { super.init() }
}

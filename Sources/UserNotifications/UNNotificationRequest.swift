import Foundation

/// When a request's notification is delivered. Use a subclass.
open class UNNotificationTrigger: NSObject, NSCopying, @unchecked Sendable {
    open private(set) var repeats: Bool

    init(repeats: Bool) {
        self.repeats = repeats
        super.init()
    }

    open func copy(with zone: NSZone? = nil) -> Any { self }
}

/// Delivered `timeInterval` seconds after the request is added (and every `timeInterval`
/// seconds after that when it repeats).
open class UNTimeIntervalNotificationTrigger: UNNotificationTrigger, @unchecked Sendable {
    open private(set) var timeInterval: TimeInterval
    /// When it was made: `nextTriggerDate()` counts from here, as Apple's does.
    private let made = Date()

    /// As Apple's, a time interval that is not positive, or under 60 s for a repeating trigger,
    /// is a programming error and ends the process.
    public init(timeInterval: TimeInterval, repeats: Bool) {
        guard timeInterval > 0 else { fatalError("UNTimeIntervalNotificationTrigger: time interval must be greater than 0") }
        if repeats && timeInterval < 60 { fatalError("UNTimeIntervalNotificationTrigger: time interval must be at least 60 if repeating") }
        self.timeInterval = timeInterval
        super.init(repeats: repeats)
    }

    open func nextTriggerDate() -> Date? { made.addingTimeInterval(timeInterval) }

    open override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? UNTimeIntervalNotificationTrigger else { return false }
        return other.timeInterval == timeInterval && other.repeats == repeats
    }

    open override var hash: Int { timeInterval.hashValue }

    open override var description: String {
        "<UNTimeIntervalNotificationTrigger: repeats: \(repeats ? "YES" : "NO"), timeInterval: \(timeInterval)>"
    }
}

/// Delivered at the next date matching `dateComponents` (every matching date when it repeats).
open class UNCalendarNotificationTrigger: UNNotificationTrigger, @unchecked Sendable {
    open private(set) var dateComponents: DateComponents

    public init(dateMatching dateComponents: DateComponents, repeats: Bool) {
        self.dateComponents = dateComponents
        super.init(repeats: repeats)
    }

    /// The next date the components match, read in their calendar and time zone (default: the
    /// Gregorian calendar, the current zone).
    open func nextTriggerDate() -> Date? {
        var calendar = dateComponents.calendar ?? Calendar(identifier: .gregorian)
        if let zone = dateComponents.timeZone { calendar.timeZone = zone }
        var components = dateComponents
        components.calendar = nil
        components.timeZone = nil
        return calendar.nextDate(after: Date(), matching: components, matchingPolicy: .strict)
    }

    open override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? UNCalendarNotificationTrigger else { return false }
        return other.dateComponents == dateComponents && other.repeats == repeats
    }

    open override var hash: Int { dateComponents.hashValue }

    open override var description: String {
        "<UNCalendarNotificationTrigger: dateComponents: \(dateComponents), repeats: \(repeats ? "YES" : "NO")>"
    }
}

/// A request to deliver a notification: its identifier (adding one again replaces it), its
/// content (copied), and when (nil: at once).
open class UNNotificationRequest: NSObject, NSCopying, @unchecked Sendable {
    open private(set) var identifier: String
    open private(set) var content: UNNotificationContent
    open private(set) var trigger: UNNotificationTrigger?

    public init(identifier: String, content: UNNotificationContent, trigger: UNNotificationTrigger?) {
        self.identifier = identifier
        self.content = content.copy() as! UNNotificationContent
        self.trigger = trigger
        super.init()
    }

    open func copy(with zone: NSZone? = nil) -> Any { self }

    open override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? UNNotificationRequest else { return false }
        return other.identifier == identifier && other.content.isEqual(content)
            && (other.trigger == nil) == (trigger == nil) && (trigger.map { $0.isEqual(other.trigger) } ?? true)
    }

    open override var hash: Int { identifier.hashValue }

    open override var description: String {
        "<UNNotificationRequest: identifier: \(identifier), content: \(content), trigger: \(trigger.map { "\($0)" } ?? "(null)")>"
    }
}

/// A delivered notification: its request and when it was delivered.
open class UNNotification: NSObject, NSCopying, @unchecked Sendable {
    open private(set) var date: Date
    open private(set) var request: UNNotificationRequest

    init(date: Date, request: UNNotificationRequest) {
        self.date = date
        self.request = request
        super.init()
    }

    open func copy(with zone: NSZone? = nil) -> Any { self }

    open override var description: String { "<UNNotification: date: \(date), request: \(request)>" }
}

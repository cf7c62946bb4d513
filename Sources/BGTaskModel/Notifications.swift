import Foundation

// Local notifications (`UNUserNotificationCenter`), as values every part shares: the request a
// plugin adds (the ABI's JSON, the launch channel, the store, the control socket all carry this
// one type), its content and trigger, and the rules on them (sizes, trigger dates).

/// A JSON value: what a notification's `userInfo` may hold (Apple requires property-list types;
/// on Linux they cross as JSON, so dates and data are refused, naming the key).
public enum JSONValue: Codable, Sendable, Equatable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null; return }
        if let value = try? container.decode(Bool.self) { self = .bool(value); return }
        if let value = try? container.decode(Int64.self) { self = .int(value); return }
        if let value = try? container.decode(Double.self) { self = .double(value); return }
        if let value = try? container.decode(String.self) { self = .string(value); return }
        if let value = try? container.decode([JSONValue].self) { self = .array(value); return }
        self = .object(try container.decode([String: JSONValue].self))
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case let .bool(value): try container.encode(value)
        case let .int(value): try container.encode(value)
        case let .double(value): try container.encode(value)
        case let .string(value): try container.encode(value)
        case let .array(value): try container.encode(value)
        case let .object(value): try container.encode(value)
        }
    }

    /// How deeply arrays and objects nest (a scalar is 0).
    public var depth: Int {
        switch self {
        case let .array(values): 1 + (values.map(\.depth).max() ?? 0)
        case let .object(values): 1 + (values.values.map(\.depth).max() ?? 0)
        default: 0
        }
    }

    /// An upper estimate of its JSON's size in bytes (strings counted twice, for escapes).
    public var estimatedBytes: Int {
        switch self {
        case .null, .bool: 5
        case .int, .double: 24
        case let .string(text): 2 * text.utf8.count + 2
        case let .array(values): 2 + values.reduce(0) { $0 + $1.estimatedBytes + 1 }
        case let .object(values): 2 + values.reduce(0) { $0 + 2 * $1.key.utf8.count + 4 + $1.value.estimatedBytes }
        }
    }
}

/// A notification's content (`UNNotificationContent`). Empty strings are absent, as Apple's
/// properties default to "".
public struct NotificationContent: Codable, Sendable, Equatable {
    public var title: String
    public var subtitle: String
    public var body: String
    /// The app icon's badge number; nil leaves it as it is.
    public var badge: Int64?
    /// `default`, `defaultCritical`, or a sound file's name; nil: silent.
    public var sound: String?
    public var userInfo: [String: JSONValue]
    public var threadIdentifier: String
    public var categoryIdentifier: String

    public init(title: String = "", subtitle: String = "", body: String = "", badge: Int64? = nil, sound: String? = nil,
                userInfo: [String: JSONValue] = [:], threadIdentifier: String = "", categoryIdentifier: String = "") {
        self.title = title
        self.subtitle = subtitle
        self.body = body
        self.badge = badge
        self.sound = sound
        self.userInfo = userInfo
        self.threadIdentifier = threadIdentifier
        self.categoryIdentifier = categoryIdentifier
    }

    enum CodingKeys: String, CodingKey {
        case title, subtitle, body, badge, sound
        case userInfo = "user_info", threadIdentifier = "thread_identifier", categoryIdentifier = "category_identifier"
    }

    /// Absent keys are their defaults: a C plugin writes only what it sets.
    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        title = try container.decodeIfPresent(String.self, forKey: .title) ?? ""
        subtitle = try container.decodeIfPresent(String.self, forKey: .subtitle) ?? ""
        body = try container.decodeIfPresent(String.self, forKey: .body) ?? ""
        badge = try container.decodeIfPresent(Int64.self, forKey: .badge)
        sound = try container.decodeIfPresent(String.self, forKey: .sound)
        userInfo = try container.decodeIfPresent([String: JSONValue].self, forKey: .userInfo) ?? [:]
        threadIdentifier = try container.decodeIfPresent(String.self, forKey: .threadIdentifier) ?? ""
        categoryIdentifier = try container.decodeIfPresent(String.self, forKey: .categoryIdentifier) ?? ""
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        if !title.isEmpty { try container.encode(title, forKey: .title) }
        if !subtitle.isEmpty { try container.encode(subtitle, forKey: .subtitle) }
        if !body.isEmpty { try container.encode(body, forKey: .body) }
        try container.encodeIfPresent(badge, forKey: .badge)
        try container.encodeIfPresent(sound, forKey: .sound)
        if !userInfo.isEmpty { try container.encode(userInfo, forKey: .userInfo) }
        if !threadIdentifier.isEmpty { try container.encode(threadIdentifier, forKey: .threadIdentifier) }
        if !categoryIdentifier.isEmpty { try container.encode(categoryIdentifier, forKey: .categoryIdentifier) }
    }
}

/// The date components a calendar trigger matches (`DateComponents`, the fields Apple's trigger
/// uses), with the calendar and time zone they are read in (nil: Gregorian, the host's zone).
public struct DateMatch: Codable, Sendable, Equatable {
    public var era, year, month, day, hour, minute, second, nanosecond: Int?
    public var weekday, weekdayOrdinal, quarter, weekOfMonth, weekOfYear, yearForWeekOfYear: Int?
    public var calendar: String?
    public var timeZone: String?

    public init() {}

    enum CodingKeys: String, CodingKey {
        case era, year, month, day, hour, minute, second, nanosecond, weekday, quarter, calendar
        case weekdayOrdinal = "weekday_ordinal", weekOfMonth = "week_of_month", weekOfYear = "week_of_year"
        case yearForWeekOfYear = "year_for_week_of_year", timeZone = "time_zone"
    }

    /// The integer fields by name, in a fixed order (the wire codec's and the bounds check's).
    public var fields: [(name: String, value: Int?)] {
        [("era", era), ("year", year), ("month", month), ("day", day), ("hour", hour), ("minute", minute),
         ("second", second), ("nanosecond", nanosecond), ("weekday", weekday), ("weekday_ordinal", weekdayOrdinal),
         ("quarter", quarter), ("week_of_month", weekOfMonth), ("week_of_year", weekOfYear),
         ("year_for_week_of_year", yearForWeekOfYear)]
    }

    /// Sets the fields from values in `fields`' order.
    public mutating func setFields(_ values: [Int?]) {
        let v = values + Array(repeating: nil, count: max(0, 14 - values.count))
        (era, year, month, day, hour, minute, second, nanosecond) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
        (weekday, weekdayOrdinal, quarter, weekOfMonth, weekOfYear, yearForWeekOfYear) = (v[8], v[9], v[10], v[11], v[12], v[13])
    }

    public var calendarValue: Calendar {
        var calendar = Calendar(identifier: self.calendar.flatMap(Self.calendarIdentifier) ?? .gregorian)
        if let zone = timeZone.flatMap(TimeZone.init(identifier:)) { calendar.timeZone = zone }
        return calendar
    }

    public var components: DateComponents {
        var components = DateComponents()
        components.era = era
        components.year = year
        components.month = month
        components.day = day
        components.hour = hour
        components.minute = minute
        components.second = second
        components.nanosecond = nanosecond
        components.weekday = weekday
        components.weekdayOrdinal = weekdayOrdinal
        components.quarter = quarter
        components.weekOfMonth = weekOfMonth
        components.weekOfYear = weekOfYear
        components.yearForWeekOfYear = yearForWeekOfYear
        return components
    }

    /// The next date after `date` these components match, or nil when none does.
    public func nextDate(after date: Date) -> Date? {
        var components = self.components
        // A match of no field at all would be every instant: Apple's trigger never fires then.
        guard fields.contains(where: { $0.value != nil }) else { return nil }
        components.calendar = nil
        return calendarValue.nextDate(after: date, matching: components, matchingPolicy: .strict, repeatedTimePolicy: .first, direction: .forward)
    }

    /// A calendar's name in the schema (`Calendar.Identifier`'s case name); gregorian for one
    /// the schema does not name.
    public static func calendarName(_ identifier: Calendar.Identifier) -> String {
        calendars.first { $0.value == identifier }?.key ?? "gregorian"
    }

    static func calendarIdentifier(_ name: String) -> Calendar.Identifier? { calendars[name] }

    private static let calendars: [String: Calendar.Identifier] = {
        let known: [String: Calendar.Identifier] = [
            "gregorian": .gregorian, "iso8601": .iso8601, "buddhist": .buddhist, "chinese": .chinese, "coptic": .coptic,
            "ethiopicAmeteMihret": .ethiopicAmeteMihret, "ethiopicAmeteAlem": .ethiopicAmeteAlem, "hebrew": .hebrew,
            "indian": .indian, "islamic": .islamic, "islamicCivil": .islamicCivil, "japanese": .japanese, "persian": .persian,
            "republicOfChina": .republicOfChina, "islamicTabular": .islamicTabular, "islamicUmmAlQura": .islamicUmmAlQura,
        ]
        return known
    }()
}

/// When a notification is delivered: after an interval from when it was added, or at dates
/// matching calendar components; either may repeat. A request without one is delivered at once.
public enum NotificationTrigger: Codable, Sendable, Equatable {
    case timeInterval(TimeInterval, repeats: Bool)
    case calendar(DateMatch, repeats: Bool)

    public var repeats: Bool {
        switch self {
        case let .timeInterval(_, repeats), let .calendar(_, repeats): repeats
        }
    }

    enum CodingKeys: String, CodingKey {
        case type, repeats
        case timeInterval = "time_interval", dateComponents = "date_components"
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let repeats = try container.decodeIfPresent(Bool.self, forKey: .repeats) ?? false
        switch try container.decode(String.self, forKey: .type) {
        case "time-interval": self = .timeInterval(try container.decode(Double.self, forKey: .timeInterval), repeats: repeats)
        case "calendar": self = .calendar(try container.decode(DateMatch.self, forKey: .dateComponents), repeats: repeats)
        case let other:
            throw DecodingError.dataCorruptedError(forKey: .type, in: container, debugDescription: "unknown trigger type '\(other.prefix(64))' (known: time-interval, calendar)")
        }
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        switch self {
        case let .timeInterval(interval, repeats):
            try container.encode("time-interval", forKey: .type)
            try container.encode(interval, forKey: .timeInterval)
            try container.encode(repeats, forKey: .repeats)
        case let .calendar(match, repeats):
            try container.encode("calendar", forKey: .type)
            try container.encode(match, forKey: .dateComponents)
            try container.encode(repeats, forKey: .repeats)
        }
    }

    /// The first delivery date of a request added at `added` (nil: the components match no
    /// date; Apple's `UNError.notificationInvalidNoDate`).
    public func firstDate(addedAt added: Date) -> Date? {
        switch self {
        case let .timeInterval(interval, _): added.addingTimeInterval(interval)
        case let .calendar(match, _): match.nextDate(after: added)
        }
    }

    /// The delivery after one due at `due`, for a repeating trigger, skipping those already
    /// past at `now` (a host that was down, or a virtual clock moved by hours, delivers a
    /// repeating notification once, not once per missed period). Nil when it does not repeat.
    public func nextDate(after due: Date, now: Date) -> Date? {
        guard repeats else { return nil }
        switch self {
        case let .timeInterval(interval, _):
            guard interval > 0 else { return nil }
            let periods = max(1, ((now.timeIntervalSince(due)) / interval).rounded(.down) + 1)
            return due.addingTimeInterval(periods * interval)
        case let .calendar(match, _):
            return match.nextDate(after: max(due, now))
        }
    }
}

/// A local notification request (`UNNotificationRequest`).
public struct NotificationRequest: Codable, Sendable, Equatable {
    public var identifier: String
    public var content: NotificationContent
    /// nil: delivered at once.
    public var trigger: NotificationTrigger?

    public init(identifier: String, content: NotificationContent, trigger: NotificationTrigger? = nil) {
        self.identifier = identifier
        self.content = content
        self.trigger = trigger
    }

    /// The request from the JSON a plugin hands `notification_add`, or an error that names the
    /// field at fault (`content.title: expected a string`).
    public static func decode(json: Data) throws(NotificationInputError) -> NotificationRequest {
        guard json.count <= NotificationLimits.requestBytes else {
            throw NotificationInputError("the request's JSON is \(json.count) bytes, over the limit of \(InputLimits.bytes(NotificationLimits.requestBytes))")
        }
        let request: NotificationRequest
        do {
            request = try JSONDecoder().decode(NotificationRequest.self, from: json)
        } catch let error as DecodingError {
            throw NotificationInputError(Self.describe(error))
        } catch {
            throw NotificationInputError("the request is not JSON: \(error)")
        }
        if let problem = request.problem { throw NotificationInputError(problem) }
        return request
    }

    /// The request as the ABI's JSON (sorted keys).
    public func json() -> Data {
        (try? encoded()) ?? Data("{}".utf8)
    }

    /// The request's JSON, as `json()`, or why it has none (a `userInfo` number that is not finite).
    public func encoded() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(self)
    }

    static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context, _ last: CodingKey? = nil) -> String {
            let keys = context.codingPath + (last.map { [$0] } ?? [])
            let text = keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
            return text.isEmpty ? "the request" : text.replacingOccurrences(of: ".[", with: "[")
        }
        switch error {
        case let .typeMismatch(type, context): return "\(path(context)): expected \(Self.name(of: type))"
        case let .valueNotFound(type, context): return "\(path(context)): expected \(Self.name(of: type)), found null"
        case let .keyNotFound(key, context): return "\(path(context, key)): missing"
        case let .dataCorrupted(context):
            let detail = context.debugDescription.prefix(200)
            return context.codingPath.isEmpty ? "the request is not valid JSON (\(detail))" : "\(path(context)): \(detail)"
        @unknown default: return "\(error)"
        }
    }

    private static func name(of type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Bool.Type: "a boolean"
        case is Int64.Type, is Int.Type: "an integer"
        case is Double.Type: "a number"
        default: "\(type)".contains("Dictionary") ? "an object" : "\(type)".contains("Array") ? "an array" : "a \(type)"
        }
    }

    /// Why the request is refused (a field over its limit, a trigger Apple refuses), naming
    /// the field; nil when it is acceptable. The runner checks before anything is sent, and the
    /// host again where it enters.
    public var problem: String? {
        func over(_ name: String, _ text: String, _ limit: Int) -> String? {
            text.utf8.count > limit ? "\(name) is \(text.utf8.count) bytes, over the limit of \(InputLimits.bytes(limit))" : nil
        }
        if identifier.isEmpty { return "identifier: empty (a request needs an identifier)" }
        if let problem = over("identifier", identifier, InputLimits.identifierBytes) { return problem }
        let c = content
        for (name, text, limit) in [("content.title", c.title, InputLimits.titleBytes), ("content.subtitle", c.subtitle, InputLimits.titleBytes),
                                    ("content.body", c.body, NotificationLimits.bodyBytes),
                                    ("content.thread_identifier", c.threadIdentifier, InputLimits.identifierBytes),
                                    ("content.category_identifier", c.categoryIdentifier, InputLimits.identifierBytes),
                                    ("content.sound", c.sound ?? "", InputLimits.identifierBytes)] {
            if let problem = over(name, text, limit) { return problem }
        }
        let userInfo = JSONValue.object(c.userInfo)
        if userInfo.depth > NotificationLimits.userInfoDepth {
            return "content.user_info nests \(userInfo.depth) levels deep, over the limit of \(NotificationLimits.userInfoDepth)"
        }
        let userInfoBytes = (try? JSONEncoder().encode(userInfo).count) ?? userInfo.estimatedBytes
        if userInfoBytes > NotificationLimits.userInfoBytes {
            return "content.user_info is \(userInfoBytes) bytes as JSON, over the limit of \(InputLimits.bytes(NotificationLimits.userInfoBytes))"
        }
        switch trigger {
        case let .timeInterval(interval, repeats):
            guard interval.isFinite, interval > 0 else { return "trigger.time_interval: must be greater than 0, not \(interval)" }
            if repeats && interval < 60 { return "trigger.time_interval: must be at least 60 s if repeating, not \(interval)" }
            if interval > NotificationLimits.maximumInterval { return "trigger.time_interval: \(interval) s is beyond the bound of 100 years" }
        case let .calendar(match, _):
            for (name, value) in match.fields {
                if let value, abs(value) > NotificationLimits.componentBound {
                    return "trigger.date_components.\(name): \(value) is outside ±\(NotificationLimits.componentBound)"
                }
            }
            if let zone = match.timeZone, TimeZone(identifier: zone) == nil { return "trigger.date_components.time_zone: unknown time zone '\(zone.prefix(64))'" }
            if let calendar = match.calendar, DateMatch.calendarIdentifier(calendar) == nil {
                return "trigger.date_components.calendar: unknown calendar '\(calendar.prefix(64))'"
            }
        case nil: break
        }
        return nil
    }
}

/// A request refused at the boundary, with the field at fault named.
public struct NotificationInputError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// A notification as a launch reads it back: a pending request (`date`: its next delivery), or a
/// delivered notification (`date`: when it was delivered).
public struct NotificationEntry: Codable, Sendable, Equatable {
    public var request: NotificationRequest
    /// Seconds since 1970.
    public var date: Double?

    public init(request: NotificationRequest, date: Double?) {
        self.request = request
        self.date = date
    }
}

/// `UNAuthorizationStatus`'s raw values (BGTASK_NOTIFICATION_AUTH_*).
public enum NotificationAuthorization: UInt32, Codable, Sendable, CaseIterable {
    case notDetermined = 0
    case denied = 1
    case authorized = 2

    public var name: String {
        switch self {
        case .notDetermined: "not-determined"
        case .denied: "denied"
        case .authorized: "authorized"
        }
    }

    /// The operator decides (no prompt exists): the app's own switch, else the host's default
    /// (`--allow-notifications`); without either, `.notDetermined` until the app asks and
    /// `.denied` after, as on a fresh device whose user says no.
    public static func decide(appSwitch: Bool?, hostDefault: Bool, asked: Bool) -> NotificationAuthorization {
        if let appSwitch { return appSwitch ? .authorized : .denied }
        if hostDefault { return .authorized }
        return asked ? .denied : .notDetermined
    }
}

/// The bounds on notifications, with `InputLimits`' identifier and title limits.
public enum NotificationLimits {
    /// Pending requests per app: iOS keeps the 64 that fire soonest and discards the rest.
    public static let pendingPerApp = 64
    /// Delivered notifications kept per app (the oldest are dropped), as Notification Center
    /// keeps a bounded list.
    public static let deliveredPerApp = 100
    /// A notification's body, in UTF-8 bytes.
    public static let bodyBytes = 4 * 1024
    /// `userInfo` as JSON, in bytes, and how deeply it may nest.
    public static let userInfoBytes = 4 * 1024
    public static let userInfoDepth = 16
    /// The JSON of one request as a plugin hands it to `notification_add`.
    public static let requestBytes = 16 * 1024
    /// A time interval at most 100 years.
    public static let maximumInterval: TimeInterval = 100 * 365.25 * 86_400
    /// A date component's magnitude.
    public static let componentBound = 1_000_000_000
    /// Identifiers one removal call carries in one message (a longer list is sent in parts).
    public static let identifiersPerMessage = 256
}

/// The event of a `notification-response` launch: the delivered notification the user opened,
/// and how (`UNNotificationResponse.actionIdentifier`).
public struct NotificationResponseEvent: Codable, Sendable, Equatable {
    public var notification: NotificationEntry
    /// `UNNotificationDefaultActionIdentifier` (opened), `UNNotificationDismissActionIdentifier`,
    /// or one of the app's category actions.
    public var action: String

    public static let defaultAction = "com.apple.UNNotificationDefaultActionIdentifier"
    public static let dismissAction = "com.apple.UNNotificationDismissActionIdentifier"

    public init(notification: NotificationEntry, action: String = NotificationResponseEvent.defaultAction) {
        self.notification = notification
        self.action = action
    }
}

import BGTaskABI
import BackgroundTasks
import CBGTaskPluginABI
import Foundation

/// The notification center's side of the ABI: requests cross as JSON (the shape
/// `bgtask/plugin.h` documents), answers come back the same way.
enum Host {
    static func authorization(options: UNAuthorizationOptions, request: Bool) -> UNAuthorizationStatus {
        guard let (api, host) = HostConnection.current.connection, api.has(\.notification_authorization) else { return .notDetermined }
        let raw = api.notification_authorization(host, UInt32(truncatingIfNeeded: options.rawValue), request)
        return UNAuthorizationStatus(rawValue: Int(raw)) ?? .notDetermined
    }

    /// Nil, or the error `add` reports.
    static func add(_ request: UNNotificationRequest) -> (any Error)? {
        guard let (api, host) = HostConnection.current.connection, api.has(\.notification_add) else {
            return UNError(.notificationsNotAllowed, message: "notifications are available only inside a bgtask launch")
        }
        let json: Data
        do { json = try encode(request) } catch { return error }
        var message = [CChar](repeating: 0, count: 1024)
        let status = (json + [0]).withUnsafeBytes { bytes in
            api.notification_add(host, bytes.baseAddress!.assumingMemoryBound(to: CChar.self), &message, message.count)
        }
        let text = message.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        switch status {
        case 0: return nil
        case BGTASK_E_NOTIFICATIONS_NOT_ALLOWED: return UNError(.notificationsNotAllowed, message: text)
        case BGTASK_E_NOTIFICATION_NO_DATE: return UNError(.notificationInvalidNoDate, message: text)
        case Int32(BGTASK_E_INVALID_ARGUMENT.rawValue): return CocoaError(.coderInvalidValue, userInfo: [NSLocalizedDescriptionKey: text])
        default: return CocoaError(.featureUnsupported, userInfo: [NSLocalizedDescriptionKey: text.isEmpty ? "the host failed (status \(status))" : text])
        }
    }

    struct Listed {
        var request: UNNotificationRequest
        var date: Date?
    }

    static func list(delivered: Bool) -> [Listed] {
        guard let (api, host) = HostConnection.current.connection, api.has(\.notification_list) else { return [] }
        let collected = Collected()
        let context = Unmanaged.passUnretained(collected).toOpaque()
        _ = api.notification_list(host, delivered ? BGTASK_NOTIFICATIONS_DELIVERED : BGTASK_NOTIFICATIONS_PENDING, collect, context)
        return withExtendedLifetime(collected) { collected.items }
    }

    static func remove(delivered: Bool, identifiers: [String]?) {
        guard let (api, host) = HostConnection.current.connection, api.has(\.notification_remove) else { return }
        let which = delivered ? BGTASK_NOTIFICATIONS_DELIVERED : BGTASK_NOTIFICATIONS_PENDING
        guard let identifiers else {
            _ = api.notification_remove(host, which, nil, 0)
            return
        }
        let pointers = identifiers.map { UnsafePointer(strdup($0)) }
        defer { pointers.forEach { free(UnsafeMutablePointer(mutating: $0)) } }
        pointers.withUnsafeBufferPointer { buffer in
            _ = api.notification_remove(host, which, buffer.baseAddress, buffer.count)
        }
    }

    // MARK: JSON

    /// The request as the ABI's JSON; a `userInfo` that JSON cannot hold is refused here, naming
    /// the key, as Apple refuses one that is not a property list.
    static func encode(_ request: UNNotificationRequest) throws -> Data {
        let content = request.content
        var body: [String: Any] = [:]
        if !content.title.isEmpty { body["title"] = content.title }
        if !content.subtitle.isEmpty { body["subtitle"] = content.subtitle }
        if !content.body.isEmpty { body["body"] = content.body }
        if let badge = content.badge { body["badge"] = badge.int64Value }
        if let sound = content.sound { body["sound"] = sound.name }
        if !content.threadIdentifier.isEmpty { body["thread_identifier"] = content.threadIdentifier }
        if !content.categoryIdentifier.isEmpty { body["category_identifier"] = content.categoryIdentifier }
        if !content.userInfo.isEmpty {
            var userInfo: [String: Any] = [:]
            for (key, value) in content.userInfo {
                guard let key = key.base as? String else {
                    throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "content.user_info: key \(key) is not a string"])
                }
                userInfo[key] = try json(value, path: "content.user_info.\(key)")
            }
            body["user_info"] = userInfo
        }
        var object: [String: Any] = ["identifier": request.identifier, "content": body]
        switch request.trigger {
        case let trigger as UNTimeIntervalNotificationTrigger:
            object["trigger"] = ["type": "time-interval", "time_interval": trigger.timeInterval, "repeats": trigger.repeats]
        case let trigger as UNCalendarNotificationTrigger:
            let c = trigger.dateComponents
            var components: [String: Any] = [:]
            let fields: [(String, Int?)] = [
                ("era", c.era), ("year", c.year), ("month", c.month), ("day", c.day), ("hour", c.hour), ("minute", c.minute),
                ("second", c.second), ("nanosecond", c.nanosecond), ("weekday", c.weekday), ("weekday_ordinal", c.weekdayOrdinal),
                ("quarter", c.quarter), ("week_of_month", c.weekOfMonth), ("week_of_year", c.weekOfYear),
                ("year_for_week_of_year", c.yearForWeekOfYear),
            ]
            for (name, value) in fields { if let value { components[name] = value } }
            if let zone = c.timeZone ?? c.calendar?.timeZone, c.timeZone != nil { components["time_zone"] = zone.identifier }
            if let calendar = c.calendar { components["calendar"] = calendarName(calendar.identifier) }
            object["trigger"] = ["type": "calendar", "date_components": components, "repeats": trigger.repeats]
        default: break
        }
        return try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    }

    private static func json(_ value: Any, path: String, depth: Int = 0) throws -> Any {
        guard depth < 32 else { throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "\(path): nested too deeply"]) }
        switch value {
        case let value as String: return value
        case let value as Bool where type(of: value) == Bool.self: return value
        case let value as Int: return value
        case let value as Int64: return value
        case let value as Int32: return Int(value)
        case let value as UInt: return value
        case let value as UInt64: return value
        case let value as Double: return value
        case let value as Float: return Double(value)
        case let value as NSNumber: return value
        case is NSNull: return NSNull()
        case let value as [Any]: return try value.enumerated().map { try json($1, path: "\(path)[\($0)]", depth: depth + 1) }
        case let value as [AnyHashable: Any]:
            var object: [String: Any] = [:]
            for (key, item) in value {
                guard let key = key.base as? String else {
                    throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "\(path): key \(key) is not a string"])
                }
                object[key] = try json(item, path: "\(path).\(key)", depth: depth + 1)
            }
            return object
        case let value as [String: Any]: return try json(value as [AnyHashable: Any], path: path, depth: depth)
        default:
            throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "\(path): a \(type(of: value)) is not a value a notification's userInfo can hold (strings, numbers, booleans, arrays, dictionaries)"])
        }
    }

    /// A request the host sent back (the ABI's JSON, parsed).
    static func decode(_ object: [String: Any]) -> UNNotificationRequest? {
        guard let identifier = object["identifier"] as? String else { return nil }
        let body = object["content"] as? [String: Any] ?? [:]
        let content = UNMutableNotificationContent()
        content.title = body["title"] as? String ?? ""
        content.subtitle = body["subtitle"] as? String ?? ""
        content.body = body["body"] as? String ?? ""
        content.badge = (body["badge"] as? NSNumber).map { NSNumber(value: $0.intValue) }
        content.sound = (body["sound"] as? String).map { UNNotificationSound(name: $0) }
        content.threadIdentifier = body["thread_identifier"] as? String ?? ""
        content.categoryIdentifier = body["category_identifier"] as? String ?? ""
        if let userInfo = body["user_info"] as? [String: Any] {
            content.userInfo = Dictionary(uniqueKeysWithValues: userInfo.map { (AnyHashable($0.key), $0.value) })
        }
        var trigger: UNNotificationTrigger?
        if let spec = object["trigger"] as? [String: Any] {
            let repeats = spec["repeats"] as? Bool ?? false
            if spec["type"] as? String == "time-interval", let interval = (spec["time_interval"] as? NSNumber)?.doubleValue, interval > 0,
               !repeats || interval >= 60 {
                trigger = UNTimeIntervalNotificationTrigger(timeInterval: interval, repeats: repeats)
            } else if spec["type"] as? String == "calendar", let fields = spec["date_components"] as? [String: Any] {
                var c = DateComponents()
                func int(_ name: String) -> Int? { (fields[name] as? NSNumber)?.intValue }
                (c.era, c.year, c.month, c.day, c.hour, c.minute, c.second) = (int("era"), int("year"), int("month"), int("day"), int("hour"), int("minute"), int("second"))
                (c.nanosecond, c.weekday, c.weekdayOrdinal, c.quarter) = (int("nanosecond"), int("weekday"), int("weekday_ordinal"), int("quarter"))
                (c.weekOfMonth, c.weekOfYear, c.yearForWeekOfYear) = (int("week_of_month"), int("week_of_year"), int("year_for_week_of_year"))
                if let zone = fields["time_zone"] as? String { c.timeZone = TimeZone(identifier: zone) }
                trigger = UNCalendarNotificationTrigger(dateMatching: c, repeats: repeats)
            }
        }
        return UNNotificationRequest(identifier: identifier, content: content, trigger: trigger)
    }

    private static func calendarName(_ identifier: Calendar.Identifier) -> String {
        switch identifier {
        case .gregorian: "gregorian"
        case .iso8601: "iso8601"
        case .buddhist: "buddhist"
        case .chinese: "chinese"
        case .coptic: "coptic"
        case .ethiopicAmeteMihret: "ethiopicAmeteMihret"
        case .ethiopicAmeteAlem: "ethiopicAmeteAlem"
        case .hebrew: "hebrew"
        case .indian: "indian"
        case .islamic: "islamic"
        case .islamicCivil: "islamicCivil"
        case .japanese: "japanese"
        case .persian: "persian"
        case .republicOfChina: "republicOfChina"
        case .islamicTabular: "islamicTabular"
        case .islamicUmmAlQura: "islamicUmmAlQura"
        default: "gregorian"
        }
    }
}

/// What a `notification_list` call collects.
private final class Collected {
    var items: [Host.Listed] = []
}

/// The list's visitor: one JSON entry each call, parsed into a request (and a date).
private let collect: bgtask_json_visitor = { context, json in
    guard let context, let json else { return }
    let collected = Unmanaged<Collected>.fromOpaque(context).takeUnretainedValue()
    guard let object = try? JSONSerialization.jsonObject(with: Data(bytes: json, count: strlen(json))) as? [String: Any] else { return }
    if let request = object["request"] as? [String: Any] {
        if let made = Host.decode(request) {
            collected.items.append(Host.Listed(request: made, date: (object["date"] as? NSNumber).map { Date(timeIntervalSince1970: $0.doubleValue) }))
        }
    } else if let made = Host.decode(object) {
        collected.items.append(Host.Listed(request: made, date: nil))
    }
}

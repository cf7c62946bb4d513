import BGTaskABI
import BGTaskModel
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

    // The request crosses as `BGTaskModel.NotificationRequest`'s JSON: the one schema the runner,
    // the launch channel, the store and the control socket share (`bgtask/plugin.h` documents it).

    /// The request as the ABI's JSON; a `userInfo` that JSON cannot hold is refused here, naming
    /// the key, as Apple refuses one that is not a property list.
    static func encode(_ request: UNNotificationRequest) throws -> Data {
        try model(request).encoded()
    }

    /// The model's request for `request`.
    static func model(_ request: UNNotificationRequest) throws -> NotificationRequest {
        let content = request.content
        var userInfo: [String: JSONValue] = [:]
        for (key, value) in content.userInfo {
            guard let key = key.base as? String else {
                throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "content.user_info: key \(key) is not a string"])
            }
            userInfo[key] = try json(value, path: "content.user_info.\(key)")
        }
        let body = NotificationContent(title: content.title, subtitle: content.subtitle, body: content.body,
                                       badge: content.badge?.int64Value, sound: content.sound?.name, userInfo: userInfo,
                                       threadIdentifier: content.threadIdentifier, categoryIdentifier: content.categoryIdentifier)
        var trigger: NotificationTrigger?
        switch request.trigger {
        case let made as UNTimeIntervalNotificationTrigger:
            trigger = .timeInterval(made.timeInterval, repeats: made.repeats)
        case let made as UNCalendarNotificationTrigger:
            let c = made.dateComponents
            var match = DateMatch()
            match.setFields([c.era, c.year, c.month, c.day, c.hour, c.minute, c.second, c.nanosecond, c.weekday, c.weekdayOrdinal,
                             c.quarter, c.weekOfMonth, c.weekOfYear, c.yearForWeekOfYear])
            if let zone = c.timeZone { match.timeZone = zone.identifier }
            if let calendar = c.calendar { match.calendar = DateMatch.calendarName(calendar.identifier) }
            trigger = .calendar(match, repeats: made.repeats)
        default: break
        }
        return NotificationRequest(identifier: request.identifier, content: body, trigger: trigger)
    }

    private static func json(_ value: Any, path: String, depth: Int = 0) throws -> JSONValue {
        guard depth < 32 else { throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "\(path): nested too deeply"]) }
        switch value {
        case let value as String: return .string(value)
        case let value as Bool where type(of: value) == Bool.self: return .bool(value)
        case let value as Int: return .int(Int64(value))
        case let value as Int64: return .int(value)
        case let value as Int32: return .int(Int64(value))
        case let value as UInt: return Int64(exactly: value).map(JSONValue.int) ?? .double(Double(value))
        case let value as UInt64: return Int64(exactly: value).map(JSONValue.int) ?? .double(Double(value))
        case let value as Double: return .double(value)
        case let value as Float: return .double(Double(value))
        case let value as NSNumber:
            if let integer = Int64(exactly: value.doubleValue), String(cString: value.objCType) != "d", String(cString: value.objCType) != "f" {
                return .int(integer)
            }
            return .double(value.doubleValue)
        case is NSNull: return .null
        case let value as [Any]: return .array(try value.enumerated().map { try json($1, path: "\(path)[\($0)]", depth: depth + 1) })
        case let value as [AnyHashable: Any]:
            var object: [String: JSONValue] = [:]
            for (key, item) in value {
                guard let key = key.base as? String else {
                    throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "\(path): key \(key) is not a string"])
                }
                object[key] = try json(item, path: "\(path).\(key)", depth: depth + 1)
            }
            return .object(object)
        case let value as [String: Any]: return try json(value as [AnyHashable: Any], path: path, depth: depth)
        default:
            throw CocoaError(.propertyListWriteInvalid, userInfo: [NSLocalizedDescriptionKey: "\(path): a \(type(of: value)) is not a value a notification's userInfo can hold (strings, numbers, booleans, arrays, dictionaries)"])
        }
    }

    /// `userInfo`'s value as Foundation holds a property list.
    private static func foundation(_ value: JSONValue) -> Any {
        switch value {
        case .null: NSNull()
        case let .bool(value): value
        case let .int(value): Int(truncatingIfNeeded: value)
        case let .double(value): value
        case let .string(value): value
        case let .array(values): values.map(foundation)
        case let .object(values): values.mapValues(foundation)
        }
    }

    /// The request the host sent back (the model's, parsed from the ABI's JSON).
    static func request(_ model: NotificationRequest) -> UNNotificationRequest {
        let body = model.content
        let content = UNMutableNotificationContent()
        content.title = body.title
        content.subtitle = body.subtitle
        content.body = body.body
        content.badge = body.badge.map { NSNumber(value: Int(truncatingIfNeeded: $0)) }
        content.sound = body.sound.map { UNNotificationSound(name: $0) }
        content.threadIdentifier = body.threadIdentifier
        content.categoryIdentifier = body.categoryIdentifier
        content.userInfo = Dictionary(uniqueKeysWithValues: body.userInfo.map { (AnyHashable($0.key), foundation($0.value)) })
        var trigger: UNNotificationTrigger?
        switch model.trigger {
        case let .timeInterval(interval, repeats) where interval > 0 && (!repeats || interval >= 60):
            trigger = UNTimeIntervalNotificationTrigger(timeInterval: interval, repeats: repeats)
        case let .calendar(match, repeats):
            var components = match.components
            if let zone = match.timeZone { components.timeZone = TimeZone(identifier: zone) }
            trigger = UNCalendarNotificationTrigger(dateMatching: components, repeats: repeats)
        default: break
        }
        return UNNotificationRequest(identifier: model.identifier, content: content, trigger: trigger)
    }
}

/// What a `notification_list` call collects.
private final class Collected {
    var items: [Host.Listed] = []
}

/// The list's visitor: one JSON entry each call (`NotificationEntry`: a request and the date it
/// was delivered, or a pending request by itself), parsed into a request (and a date).
private let collect: bgtask_json_visitor = { context, json in
    guard let context, let json else { return }
    let collected = Unmanaged<Collected>.fromOpaque(context).takeUnretainedValue()
    let data = Data(bytes: json, count: strlen(json))
    let decoder = JSONDecoder()
    if let entry = try? decoder.decode(NotificationEntry.self, from: data) {
        collected.items.append(Host.Listed(request: Host.request(entry.request), date: entry.date.map(Date.init(timeIntervalSince1970:))))
    } else if let request = try? decoder.decode(NotificationRequest.self, from: data) {
        collected.items.append(Host.Listed(request: Host.request(request), date: nil))
    }
}

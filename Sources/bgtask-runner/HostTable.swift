import BGTaskABI
import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc

/// The one runner of this process; the ABI's C callbacks reach it through here.
nonisolated(unsafe) var runner: Runner!

/// The C strings `app_group_container` returns, made once (they live as long as the process).
nonisolated(unsafe) private var appGroupDirectories: [String: UnsafeMutablePointer<CChar>] = [:]

/// Builds the host function table handed to the plugin (ABI 1).
func makeHostTable() -> UnsafeMutablePointer<bgtask_host_api> {
    var api = bgtask_host_api()
    api.abi_version = BGTASK_ABI_VERSION
    api.size = UInt32(MemoryLayout<bgtask_host_api>.size)
    api.register_handler = { _, identifier, handler, context in
        guard let identifier, let handler else { return 0 }
        // Checked before the string is copied or anything is sent: a registration too large for
        // the launch channel would otherwise be lost, and an identifier this long is no one's.
        if let problem = oversized("the identifier", identifier, limit: InputLimits.identifierBytes) {
            runner.report(.registerRefused(identifier: preview(identifier), reason: problem))
            return 0
        }
        return runner.register(String(cString: identifier), .abi(handler, context)) ? 1 : 0
    }
    api.set_expiration_handler = { _, task, handler, context in
        runner.setExpirationHandler(task, handler, context)
    }
    api.set_task_completed = { _, task, success in
        runner.complete(task, success: success)
    }
    api.submit = { _, submitted, message, messageSize in
        // Only what both sides know of the request: a newer plugin's trailing fields are not
        // read, an older one's missing fields read as zero, and one below ABI 1 is refused.
        var request: bgtask_request?
        if let submitted {
            do {
                request = try bgtask_request.read(from: submitted)
            } catch {
                write(message, messageSize, "invalid request: \(error)")
                return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
            }
        }
        if let problem = request?.oversizedField {
            write(message, messageSize, problem)
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        guard let request, let wire = TaskRequest(abi: request) else {
            write(message, messageSize, "invalid request: missing identifier or unknown type")
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let reply = runner.ask { .submit(seq: $0, request: wire) }
        if let text = reply.message { write(message, messageSize, text) }
        return reply.status
    }
    api.cancel = { _, identifier in
        guard let identifier else { return }
        if let problem = oversized("the identifier", identifier, limit: InputLimits.identifierBytes) {
            // No request can have it: nothing to cancel, and nothing to ask the host.
            runner.report(.log(level: BGTASK_LOG_ERROR, message: "cancel(taskRequestWithIdentifier: \"\(preview(identifier))\"): \(problem); nothing cancelled"))
            return
        }
        _ = runner.ask { .cancel(seq: $0, identifier: String(cString: identifier)) }
    }
    api.cancel_all = { _ in
        _ = runner.ask { .cancel(seq: $0, identifier: nil) }
    }
    api.pending = { _, visitor, context in
        let reply = runner.ask { .pending(seq: $0) }
        guard reply.status == 0, let visitor else { return reply.status }
        for request in reply.requests {
            request.withABI { visitor(context, $0) }
        }
        return 0
    }
    api.log = { _, level, message in
        guard let message else { return }
        runner.report(.log(level: level, message: bounded(message, limit: InputLimits.logMessageBytes, what: "log message")))
    }
    api.update_progress = { _, task, completed, total in
        runner.report(.progress(task: task, completed: completed, total: total))
    }
    api.update_title = { _, task, title, subtitle in
        runner.report(.title(task: task, title: title.map { bounded($0, limit: InputLimits.titleBytes, what: "title") } ?? "",
                             subtitle: subtitle.map { bounded($0, limit: InputLimits.titleBytes, what: "subtitle") }))
    }
    api.supported_resources = { _ in runner.assignment.supportedResources }
    api.app_group_container = { _, identifier in
        guard let identifier, strnlen(identifier, InputLimits.identifierBytes + 1) <= InputLimits.identifierBytes else { return nil }
        return appGroupDirectories[String(cString: identifier)].map { UnsafePointer($0) }
    }
    api.begin_background_time = { _, name, expiration, context in
        let text = name.map { bounded($0, limit: InputLimits.titleBytes, what: "background task name") }
        return runner.beginBackgroundTime(name: text, expiration: expiration.map { ($0, context) })
    }
    api.end_background_time = { _, id in runner.endBackgroundTime(id) }
    api.background_time_remaining = { _ in runner.backgroundTimeRemaining }
    api.application_state = { _ in runner.applicationState }
    api.background_refresh_status = { _ in runner.assignment.backgroundRefreshStatus }
    api.register_remote_notifications = { _, token, tokenSize in
        let reply = runner.ask { .deviceToken(seq: $0) }
        write(token, tokenSize, reply.message ?? "")
        return reply.status
    }
    api.remote_notification_completed = { _, result in runner.remoteNotificationCompleted(result) }
    api.notification_authorization = { _, options, request in
        let reply = runner.askNotifications { .notificationAuthorization(seq: $0, options: options, request: request) }
        return reply.status == 0 ? reply.authorization : BGTASK_NOTIFICATION_AUTH_NOT_DETERMINED
    }
    api.notification_add = { _, json, message, messageSize in
        guard let json else {
            write(message, messageSize, "invalid notification request: NULL")
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        // Read at most one byte past the limit: a longer text is refused without copying it.
        let length = strnlen(json, NotificationLimits.requestBytes + 1)
        guard length <= NotificationLimits.requestBytes else {
            write(message, messageSize, "invalid notification request: the request's JSON is \(strlen(json)) bytes, over the limit of \(InputLimits.bytes(NotificationLimits.requestBytes))")
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let request: NotificationRequest
        do {
            request = try NotificationRequest.decode(json: Data(bytes: json, count: length))
        } catch {
            write(message, messageSize, "invalid notification request: \(error)")
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let reply = runner.askNotifications { .notificationAdd(seq: $0, request: request) }
        if let text = reply.message { write(message, messageSize, text) }
        return reply.status
    }
    api.notification_list = { _, which, visitor, context in
        guard which == BGTASK_NOTIFICATIONS_PENDING || which == BGTASK_NOTIFICATIONS_DELIVERED else {
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let reply = runner.askNotifications { .notificationList(seq: $0, delivered: which == BGTASK_NOTIFICATIONS_DELIVERED) }
        guard reply.status == 0, let visitor else { return reply.status }
        for entry in reply.notifications {
            let json: Data
            if which == BGTASK_NOTIFICATIONS_DELIVERED {
                json = Data("{\"date\":\(entry.date ?? 0),\"request\":".utf8) + entry.request.json() + Data("}".utf8)
            } else {
                json = entry.request.json()
            }
            (json + [0]).withUnsafeBytes { visitor(context, $0.baseAddress!.assumingMemoryBound(to: CChar.self)) }
        }
        return 0
    }
    api.notification_remove = { _, which, identifiers, count in
        guard which == BGTASK_NOTIFICATIONS_PENDING || which == BGTASK_NOTIFICATIONS_DELIVERED else {
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let delivered = which == BGTASK_NOTIFICATIONS_DELIVERED
        guard let identifiers else {
            return runner.askNotifications { .notificationRemove(seq: $0, delivered: delivered, identifiers: nil) }.status
        }
        // An identifier over the limit can name no request: it is skipped, not sent.
        var names: [String] = []
        for index in 0..<count {
            guard let identifier = identifiers[index], strnlen(identifier, InputLimits.identifierBytes + 1) <= InputLimits.identifierBytes else { continue }
            names.append(String(cString: identifier))
        }
        var status: Int32 = 0
        for start in stride(from: 0, to: names.count, by: NotificationLimits.identifiersPerMessage) {
            let part = Array(names[start..<min(start + NotificationLimits.identifiersPerMessage, names.count)])
            let reply = runner.askNotifications { .notificationRemove(seq: $0, delivered: delivered, identifiers: part) }
            if reply.status != 0 { status = reply.status }
        }
        return status
    }
    api.transfer_call = { _, json, reply, context in
        func answer(_ text: String) { text.withCString { reply?(context, $0) } }
        guard let json else {
            answer(#"{"error":"invalid transfer call: NULL"}"#)
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        // Read at most one byte past the limit: a longer text is refused without copying it.
        let length = strnlen(json, TransferLimits.callBytes + 1)
        guard length <= TransferLimits.callBytes else {
            answer(TransferErrorText.json("invalid transfer call: the call's JSON is over the limit of \(InputLimits.bytes(TransferLimits.callBytes))"))
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        guard let text = String(validating: UnsafeRawBufferPointer(start: json, count: length), as: UTF8.self) else {
            answer(TransferErrorText.json("invalid transfer call: the JSON is not UTF-8"))
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let reply = runner.askTransfers { .transferCall(seq: $0, json: text) }
        if reply.status == 0 {
            answer(reply.json ?? "{}")
        } else {
            answer(TransferErrorText.json(reply.message ?? "the host failed (status \(reply.status))"))
        }
        return reply.status
    }
    api.transfer_events = { _, handler, context in runner.setTransferEvents(handler, context) }
    api.set_state_handler = { _, handler, context in runner.setStateHandler(handler, context) }
    api.set_resume_handler = { _, handler, context in runner.setResumeHandler(handler, context) }
    api.thermal_state = { _ in runner.device.thermalState }
    api.low_power_mode = { _ in runner.device.lowPowerMode }
    api.set_device_handler = { _, handler, context in runner.setDeviceHandler(handler, context) }
    api.set_notification_handler = { _, handler, context in runner.setNotificationHandler(handler, context) }
    api.notification_presented = { _, identifier, options in
        guard let identifier else { return }
        let text = String(cString: identifier)
        guard text.utf8.count <= InputLimits.identifierBytes else { return }
        runner.report(.notificationPresented(identifier: text, options: options))
    }
    api.metric_payloads = { _, visitor, context in
        // Once per launch: what a launch brings is given to the first call (a second one, from a
        // delivery still queued when the process was suspended, finds nothing).
        guard let json = runner.takeMetrics() else { return Int32(BGTASK_E_NOT_FOUND.rawValue) }
        json.withCString { visitor?(context, $0) }
        runner.report(.metricsTaken)
        return Int32(BGTASK_OK.rawValue)
    }
    appGroupDirectories = Dictionary(runner.assignment.appGroups.map { ($0.identifier, strdup($0.directory)!) }) { first, _ in first }
    let table = UnsafeMutablePointer<bgtask_host_api>.allocate(capacity: 1)
    table.initialize(to: api)
    return table
}

/// Why the C string at `text` is refused (`what` is N bytes, over the limit), or nil when it has
/// at most `limit` bytes. Reads at most `limit + 1` bytes unless it is refused.
private func oversized(_ what: String, _ text: UnsafePointer<CChar>, limit: Int) -> String? {
    guard strnlen(text, limit + 1) > limit else { return nil }
    return "\(what) is \(strlen(text)) bytes, over the limit of \(InputLimits.bytes(limit))"
}

/// The first bytes of an oversized string, for a message that names it.
private func preview(_ text: UnsafePointer<CChar>) -> String {
    let length = strnlen(text, 48)
    let head = text.withMemoryRebound(to: UInt8.self, capacity: length) {
        String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
    }
    return strnlen(text, 49) > 48 ? head + "…" : head
}

/// The C string at `text`, cut after `limit` bytes with a note that says so (a `void` host
/// function has no error to return; what fits is more use than nothing).
private func bounded(_ text: UnsafePointer<CChar>, limit: Int, what: String) -> String {
    guard strnlen(text, limit + 1) > limit else { return String(cString: text) }
    let head = text.withMemoryRebound(to: UInt8.self, capacity: limit) {
        String(decoding: UnsafeBufferPointer(start: $0, count: limit), as: UTF8.self)
    }
    return head + " … [\(what) cut: \(strlen(text)) bytes, over the limit of \(InputLimits.bytes(limit))]"
}

/// Copies `text` into a caller's buffer, NUL-terminated and truncated to fit.
private func write(_ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ text: String) {
    guard let buffer, size > 0 else { return }
    let bytes = Array(text.utf8CString.prefix(size - 1)) + [0]
    bytes.withUnsafeBufferPointer { buffer.update(from: $0.baseAddress!, count: bytes.count) }
}

extension bgtask_request {
    /// Why a request is refused before it is sent (an identifier, title or subtitle over its
    /// limit), or nil.
    var oversizedField: String? {
        if let identifier, let problem = oversized("the request's identifier", identifier, limit: InputLimits.identifierBytes) {
            return "invalid request: \(problem)"
        }
        for (name, text) in [("title", title), ("subtitle", subtitle)] {
            if let text, let problem = oversized("the request's \(name)", text, limit: InputLimits.titleBytes) {
                return "invalid request: \(problem)"
            }
        }
        return nil
    }
}



/// `{"error":"..."}` for a transfer call that failed.
enum TransferErrorText {
    static func json(_ message: String) -> String {
        let data = (try? JSONEncoder.transferJSON.encode(["error": message])) ?? Data(#"{"error":"?"}"#.utf8)
        return String(decoding: data, as: UTF8.self)
    }
}

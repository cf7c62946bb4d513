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
        return runner.register(String(cString: identifier), .abi(handler, context)) ? 1 : 0
    }
    api.set_expiration_handler = { _, task, handler, context in
        runner.setExpirationHandler(task, handler, context)
    }
    api.set_task_completed = { _, task, success in
        runner.complete(task, success: success)
    }
    api.submit = { _, request, message, messageSize in
        guard let request, let wire = WireTaskRequest(abi: request.pointee) else {
            write(message, messageSize, "invalid request: missing identifier or unknown type")
            return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
        }
        let reply = runner.ask { .submit(seq: $0, request: wire) }
        if let text = reply.message { write(message, messageSize, text) }
        return reply.status
    }
    api.cancel = { _, identifier in
        guard let identifier else { return }
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
        runner.report(.log(level: level, message: String(cString: message)))
    }
    api.update_progress = { _, task, completed, total in
        runner.report(.progress(task: task, completed: completed, total: total))
    }
    api.update_title = { _, task, title, subtitle in
        runner.report(.title(task: task, title: title.map { String(cString: $0) } ?? "", subtitle: subtitle.map { String(cString: $0) }))
    }
    api.supported_resources = { _ in runner.assignment.supportedResources }
    api.app_group_container = { _, identifier in
        guard let identifier else { return nil }
        return appGroupDirectories[String(cString: identifier)].map { UnsafePointer($0) }
    }
    appGroupDirectories = Dictionary(runner.assignment.appGroups.map { ($0.identifier, strdup($0.directory)!) }) { first, _ in first }
    let table = UnsafeMutablePointer<bgtask_host_api>.allocate(capacity: 1)
    table.initialize(to: api)
    return table
}

/// Copies `text` into a caller's buffer, NUL-terminated and truncated to fit.
private func write(_ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ text: String) {
    guard let buffer, size > 0 else { return }
    let bytes = Array(text.utf8CString.prefix(size - 1)) + [0]
    bytes.withUnsafeBufferPointer { buffer.update(from: $0.baseAddress!, count: bytes.count) }
}

extension WireTaskRequest {
    init?(abi request: bgtask_request) {
        guard let identifier = request.identifier,
              let kind = TaskKind(abiValue: Int32(bitPattern: request.type.rawValue)) else { return nil }
        self.init(
            kind: kind,
            identifier: String(cString: identifier),
            earliestBeginDate: request.earliest_begin_date.isNaN ? nil : request.earliest_begin_date,
            requiresNetworkConnectivity: request.requires_network,
            requiresExternalPower: request.requires_external_power,
            protectionType: request.protection_type,
            title: request.title.map { String(cString: $0) },
            subtitle: request.subtitle.map { String(cString: $0) },
            strategyFail: request.strategy == BGTASK_STRATEGY_FAIL,
            requiredResources: request.required_resources)
    }

    /// Lends a C view of this request for the duration of `body`.
    func withABI(_ body: (UnsafePointer<bgtask_request>) -> Void) {
        identifier.withCString { identifier in
            (title ?? "").withCString { title in
                (subtitle ?? "").withCString { subtitle in
                    var request = bgtask_request()
                    request.size = UInt32(MemoryLayout<bgtask_request>.size)
                    request.type = bgtask_task_type(UInt32(kind.abiValue))
                    request.identifier = identifier
                    request.earliest_begin_date = earliestBeginDate ?? .nan
                    request.requires_network = requiresNetworkConnectivity
                    request.requires_external_power = requiresExternalPower
                    request.protection_type = protectionType
                    if kind == .continuedProcessing {
                        request.title = title
                        request.subtitle = subtitle
                    }
                    request.strategy = strategyFail ? BGTASK_STRATEGY_FAIL : BGTASK_STRATEGY_QUEUE
                    request.required_resources = requiredResources
                    body(&request)
                }
            }
        }
    }
}

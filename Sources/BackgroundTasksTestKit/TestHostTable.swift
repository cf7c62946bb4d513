import BGTaskABI
import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation

/// The host function table the test scheduler hands the SDK: the plugin ABI's, as the runner's
/// (`bgtask-runner/HostTable.swift`) is, with every call routed to the installed scheduler. Its
/// functions ignore the `host` handle and look the scheduler up, so a call that races an
/// uninstall finds none and behaves as outside a launch, never reaching a freed scheduler.
enum TestHostTable {
    /// Made once; lives as long as the process, as a launch's table does. Its `size` ends at the
    /// last function the kit provides, so the SDK's `has` is false for functions appended to the
    /// ABI after it (which this table would leave NULL).
    nonisolated(unsafe) static let table: UnsafeMutablePointer<bgtask_host_api> = {
        var api = bgtask_host_api()
        api.abi_version = BGTASK_ABI_VERSION
        api.size = UInt32(MemoryLayout<bgtask_host_api>.offset(of: \.app_group_container)!
            + MemoryLayout<(@convention(c) (OpaquePointer?, UnsafePointer<CChar>?) -> UnsafePointer<CChar>?)?>.size)
        api.register_handler = { _, identifier, handler, context in
            guard let identifier, let handler, let scheduler = Installation.current else { return 0 }
            return scheduler.register(String(cString: identifier), handler, context) ? 1 : 0
        }
        api.set_expiration_handler = { _, task, handler, context in
            Installation.current?.setExpirationHandler(task, handler, context)
        }
        api.set_task_completed = { _, task, success in
            Installation.current?.appCompleted(task, success: success)
        }
        api.submit = { _, submitted, message, messageSize in
            guard let scheduler = Installation.current else {
                write(message, messageSize, "no test scheduler is installed")
                return Int32(BGTASK_E_UNAVAILABLE.rawValue)
            }
            let request: TaskRequest
            do {
                guard let submitted, let read = TaskRequest(abi: try bgtask_request.read(from: submitted)) else {
                    write(message, messageSize, "invalid request: missing identifier or unknown type")
                    return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
                }
                request = read
            } catch {
                write(message, messageSize, "invalid request: \(error)")
                return Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
            }
            guard let rejection = scheduler.submit(request) else { return Int32(BGTASK_OK.rawValue) }
            write(message, messageSize, rejection.message)
            return rejection.status.rawValue
        }
        api.cancel = { _, identifier in
            guard let identifier else { return }
            Installation.current?.cancel(String(cString: identifier))
        }
        api.cancel_all = { _ in Installation.current?.cancel(nil) }
        api.pending = { _, visitor, context in
            guard let scheduler = Installation.current else { return Int32(BGTASK_E_UNAVAILABLE.rawValue) }
            guard let visitor else { return Int32(BGTASK_OK.rawValue) }
            for request in scheduler.pendingForApp() {
                request.withABI { visitor(context, $0) }
            }
            return Int32(BGTASK_OK.rawValue)
        }
        api.log = { _, _, message in
            guard let message else { return }
            Installation.current?.appendLog(String(cString: message))
        }
        api.update_progress = { _, task, completed, total in
            Installation.current?.updateProgress(task, completed: completed, total: total)
        }
        api.update_title = { _, task, title, subtitle in
            Installation.current?.updateTitle(task, title: title.map { String(cString: $0) } ?? "", subtitle: subtitle.map { String(cString: $0) } ?? "")
        }
        api.supported_resources = { _ in Installation.current?.supportedResources ?? 0 }
        api.app_group_container = { _, group in
            guard let group else { return nil }
            return Installation.current?.appGroupContainer(String(cString: group))
        }
        let table = UnsafeMutablePointer<bgtask_host_api>.allocate(capacity: 1)
        table.initialize(to: api)
        return table
    }()

    /// Copies `text` into a caller's buffer, NUL-terminated and truncated to fit.
    private static func write(_ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ text: String) {
        guard let buffer, size > 0 else { return }
        let bytes = Array(text.utf8CString.prefix(size - 1)) + [0]
        bytes.withUnsafeBufferPointer { buffer.update(from: $0.baseAddress!, count: bytes.count) }
    }
}

/// The installed scheduler, which the table's functions reach.
enum Installation {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var installed: TestScheduler?

    static var current: TestScheduler? { lock.withLock { installed } }

    static func set(_ scheduler: TestScheduler?) { lock.withLock { installed = scheduler } }
}

/// One installed scheduler at a time, in the order they asked: `BGTaskScheduler.shared` is one
/// object per process, and test frameworks run tests in parallel.
final class InstallationGate: @unchecked Sendable {
    static let shared = InstallationGate()

    private let lock = NSLock()
    private var busy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now: Bool = lock.withLock {
                if busy {
                    waiters.append(continuation)
                    return false
                }
                busy = true
                return true
            }
            if now { continuation.resume() }
        }
    }

    func release() {
        let next: CheckedContinuation<Void, Never>? = lock.withLock {
            if waiters.isEmpty {
                busy = false
                return nil
            }
            return waiters.removeFirst()
        }
        next?.resume()
    }
}

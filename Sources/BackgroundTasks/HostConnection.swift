import CBGTaskPluginABI
import Foundation

/// The SDK's side of the ABI: the host function table and handle this plugin was launched with.
///
/// All scheduling state lives behind the table, in the runner; the SDK keeps only what maps C
/// callbacks back to Swift objects (registrations and the task objects of running tasks). Each
/// plugin links its own copy of the SDK, so this is per plugin, and one plugin runs per process.
final class HostConnection: @unchecked Sendable {
    static let current = HostConnection()

    private let lock = NSLock()
    private var api: UnsafePointer<bgtask_host_api>?
    private var host: OpaquePointer?
    private var role: bgtask_launch_role = BGTASK_ROLE_BACKGROUND
    private var tasks: [UInt64: BGTask] = [:]

    /// Called by the entry trampoline on the runner's main thread, before any app code.
    func attach(api: UnsafePointer<bgtask_host_api>, host: OpaquePointer?, role: bgtask_launch_role) {
        lock.withLock {
            self.api = api
            self.host = host
            self.role = role
        }
    }

    /// The table and handle, or nil when this code is not running inside a bgtask launch.
    var connection: (api: bgtask_host_api, host: OpaquePointer?)? {
        lock.withLock { api.map { ($0.pointee, host) } }
    }

    var isExtension: Bool { lock.withLock { role == BGTASK_ROLE_EXTENSION } }

    func track(_ task: BGTask) { lock.withLock { tasks[task.taskID] = task } }
    func untrack(_ taskID: UInt64) { _ = lock.withLock { tasks.removeValue(forKey: taskID) } }
    func task(_ taskID: UInt64) -> BGTask? { lock.withLock { tasks[taskID] } }
}

extension bgtask_host_api {
    /// True when the runner's table includes `field` (the C macro BGTASK_HAS).
    func has<T>(_ field: KeyPath<bgtask_host_api, T>) -> Bool {
        guard let offset = MemoryLayout<bgtask_host_api>.offset(of: field) else { return false }
        return Int(size) >= offset + MemoryLayout<T>.size
    }
}

extension String {
    /// Reads a NUL-terminated C string, or nil for NULL.
    init?(optionalCString pointer: UnsafePointer<CChar>?) {
        guard let pointer else { return nil }
        self.init(cString: pointer)
    }
}

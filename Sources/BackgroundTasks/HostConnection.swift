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
    /// The SDK's own copy of the runner's table (`HostWrittenStruct.read`): as large as the SDK's
    /// struct whatever the runner's size, functions the runner does not provide NULL, and `size`
    /// the runner's, which `has` checks.
    private var api: UnsafeMutablePointer<bgtask_host_api>?
    private var host: OpaquePointer?
    private var role: bgtask_launch_role = BGTASK_ROLE_BACKGROUND.rawValue
    private var tasks: [UInt64: BGTask] = [:]

    /// Called by the entry trampoline on the runner's main thread, before any app code, with the
    /// table it has checked and read.
    func attach(api: bgtask_host_api, host: OpaquePointer?, role: bgtask_launch_role) {
        lock.withLock {
            // One launch per process: the table lives as long as the process.
            let table = self.api ?? UnsafeMutablePointer<bgtask_host_api>.allocate(capacity: 1)
            table.initialize(to: api)
            self.api = table
            self.host = host
            self.role = role
        }
    }

    /// The table and handle, or nil when this code is not running inside a bgtask launch.
    var connection: (api: bgtask_host_api, host: OpaquePointer?)? {
        lock.withLock { api.map { ($0.pointee, host) } }
    }

    var isExtension: Bool { lock.withLock { role == BGTASK_ROLE_EXTENSION.rawValue } }

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

/// A struct of the ABI that the runner hands the plugin, read as bgtask/plugin.h's growth rules
/// say (`bgtask_read_struct`): min(the SDK's size, the runner's `size`) bytes, the rest zero, so a
/// plugin built against a newer header runs with an older runner and the reverse.
protocol HostWrittenStruct {
    init()
    /// Its C name, for errors.
    static var cName: String { get }
    /// Its size in ABI 1 (BGTASK_*_MIN_SIZE): a runner that declares less is refused.
    static var minimumSize: Int { get }
    /// Where its `size` field is.
    static var sizeOffset: Int { get }
}

/// A struct the runner wrote that declares fewer bytes than the struct had in ABI 1.
struct UndersizedHostStruct: Swift.Error, CustomStringConvertible {
    var name: String
    var declaredSize: UInt32
    var minimumSize: Int

    var description: String {
        "the host's \(name).size is \(declaredSize) bytes, below the \(minimumSize) bytes of \(name) in bgtask ABI \(BGTASK_ABI_VERSION), which this plugin was built for"
    }
}

extension HostWrittenStruct {
    /// The struct at `pointer`, or `UndersizedHostStruct`. Reads no byte past what the runner
    /// declared, nor past the SDK's own struct.
    static func read(from pointer: UnsafeRawPointer) throws(UndersizedHostStruct) -> Self {
        let declared = bgtask_struct_size(pointer, sizeOffset)
        var own = Self()
        let read = withUnsafeMutableBytes(of: &own) {
            bgtask_read_struct($0.baseAddress, $0.count, pointer, Int(declared), minimumSize)
        }
        guard read else {
            throw UndersizedHostStruct(name: cName, declaredSize: declared, minimumSize: minimumSize)
        }
        return own
    }
}

extension bgtask_host_api: HostWrittenStruct {
    static var cName: String { "bgtask_host_api" }
    static var minimumSize: Int { BGTASK_HOST_API_MIN_SIZE }
    static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
}

extension bgtask_launch_info: HostWrittenStruct {
    static var cName: String { "bgtask_launch_info" }
    static var minimumSize: Int { BGTASK_LAUNCH_INFO_MIN_SIZE }
    static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
}

extension bgtask_task_info: HostWrittenStruct {
    static var cName: String { "bgtask_task_info" }
    static var minimumSize: Int { BGTASK_TASK_INFO_MIN_SIZE }
    static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
}

extension bgtask_request: HostWrittenStruct {
    static var cName: String { "bgtask_request" }
    static var minimumSize: Int { BGTASK_REQUEST_MIN_SIZE }
    static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
}

extension String {
    /// Reads a NUL-terminated C string, or nil for NULL.
    init?(optionalCString pointer: UnsafePointer<CChar>?) {
        guard let pointer else { return nil }
        self.init(cString: pointer)
    }
}

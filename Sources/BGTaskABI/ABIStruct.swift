import CBGTaskPluginABI

/// The Swift face of the plugin ABI's growth rules, shared by both sides of it: the SDK (linked
/// into every plugin) and the runner (the host's side in the launch process). One reader for
/// every struct that crosses the boundary, whoever wrote it.

/// Which side of the ABI wrote a struct: the one whose `size` is read, and whom an error blames.
package enum ABIStructWriter: Sendable {
    /// The runner (the host's side): `bgtask_host_api`, `bgtask_launch_info`, `bgtask_task_info`,
    /// and the requests `pending` hands a plugin.
    case host
    /// The plugin: `bgtask_plugin`, and the requests it submits.
    case plugin
}

/// A struct that crosses the ABI, read as bgtask/plugin.h's growth rules say
/// (`bgtask_read_struct`): min(the reader's size, the writer's `size`) bytes, the rest zero, so a
/// plugin built against a newer header runs with an older runner and the reverse.
package protocol ABIStruct {
    init()
    /// Its C name, for errors.
    static var cName: String { get }
    /// Its size in ABI 1 (BGTASK_*_MIN_SIZE): a writer that declares less is refused.
    static var minimumSize: Int { get }
    /// Where its `size` field is.
    static var sizeOffset: Int { get }
    /// Who writes it when nothing else is said.
    static var usualWriter: ABIStructWriter { get }
}

/// A struct whose writer declared fewer bytes than the struct had in ABI 1.
package struct UndersizedABIStruct: Error, Sendable, CustomStringConvertible {
    package var name: String
    package var declaredSize: UInt32
    package var minimumSize: Int
    package var writer: ABIStructWriter

    package var description: String {
        switch writer {
        case .host:
            "the host's \(name).size is \(declaredSize) bytes, below the \(minimumSize) bytes of \(name) in bgtask ABI \(BGTASK_ABI_VERSION), which this plugin was built for"
        case .plugin:
            "\(name).size is \(declaredSize) bytes, below the \(minimumSize) bytes of \(name) in bgtask ABI \(BGTASK_ABI_VERSION) (set it to sizeof(\(name)) with bgtask/plugin.h)"
        }
    }
}

extension ABIStruct {
    /// The struct at `pointer`, or `UndersizedABIStruct`. Reads no byte past what its writer
    /// declared, nor past the reader's own struct.
    package static func read(from pointer: UnsafeRawPointer, writtenBy writer: ABIStructWriter = usualWriter) throws(UndersizedABIStruct) -> Self {
        let declared = bgtask_struct_size(pointer, sizeOffset)
        var own = Self()
        let read = withUnsafeMutableBytes(of: &own) {
            bgtask_read_struct($0.baseAddress, $0.count, pointer, Int(declared), minimumSize)
        }
        guard read else {
            throw UndersizedABIStruct(name: cName, declaredSize: declared, minimumSize: minimumSize, writer: writer)
        }
        return own
    }
}

extension bgtask_host_api: ABIStruct {
    package static var cName: String { "bgtask_host_api" }
    package static var minimumSize: Int { BGTASK_HOST_API_MIN_SIZE }
    package static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
    package static var usualWriter: ABIStructWriter { .host }

    /// True when the runner's table includes `field` (the C macro BGTASK_HAS).
    package func has<T>(_ field: KeyPath<bgtask_host_api, T>) -> Bool {
        guard let offset = MemoryLayout<bgtask_host_api>.offset(of: field) else { return false }
        return Int(size) >= offset + MemoryLayout<T>.size
    }
}

extension bgtask_launch_info: ABIStruct {
    package static var cName: String { "bgtask_launch_info" }
    package static var minimumSize: Int { BGTASK_LAUNCH_INFO_MIN_SIZE }
    package static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
    package static var usualWriter: ABIStructWriter { .host }
}

extension bgtask_task_info: ABIStruct {
    package static var cName: String { "bgtask_task_info" }
    package static var minimumSize: Int { BGTASK_TASK_INFO_MIN_SIZE }
    package static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
    package static var usualWriter: ABIStructWriter { .host }
}

extension bgtask_plugin: ABIStruct {
    package static var cName: String { "bgtask_plugin" }
    package static var minimumSize: Int { BGTASK_PLUGIN_MIN_SIZE }
    package static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
    package static var usualWriter: ABIStructWriter { .plugin }
}

extension bgtask_request: ABIStruct {
    package static var cName: String { "bgtask_request" }
    package static var minimumSize: Int { BGTASK_REQUEST_MIN_SIZE }
    package static var sizeOffset: Int { MemoryLayout<Self>.offset(of: \.size)! }
    /// Submitted by a plugin; `pending` hands the SDK requests the host wrote (`writtenBy: .host`).
    package static var usualWriter: ABIStructWriter { .plugin }
}

extension String {
    /// Reads a NUL-terminated C string, or nil for NULL.
    package init?(optionalCString pointer: UnsafePointer<CChar>?) {
        guard let pointer else { return nil }
        self.init(cString: pointer)
    }
}

import BGTaskModel
import CBGTaskPluginABI
import CFFI
import Foundation
import Glibc

/// A handler a C plugin exports and its Info.plist maps to an identifier (`BGTaskHandlers`),
/// called through libffi: its C signature is known only when the bundle is read, so no
/// Swift-side function type can describe it ahead of time.
///
/// A `complete` argument is a libffi closure: a plain `void (*)(bool)` that carries the task it
/// belongs to, so a C handler can finish its task later without knowing about task ids.
final class MappedHandlerCall: @unchecked Sendable {
    let mapping: MappedHandler
    let function: UnsafeMutableRawPointer
    private let cif: UnsafeMutablePointer<ffi_cif>
    private let argumentTypes: UnsafeMutablePointer<UnsafeMutablePointer<ffi_type>?>

    struct SetupError: Error, CustomStringConvertible { var description: String }

    init(mapping: MappedHandler, function: UnsafeMutableRawPointer) throws {
        self.mapping = mapping
        self.function = function
        argumentTypes = .allocate(capacity: max(mapping.arguments.count, 1))
        for (index, argument) in mapping.arguments.enumerated() {
            argumentTypes[index] = Self.ffiType(of: argument)
        }
        let resultType: UnsafeMutablePointer<ffi_type> = switch mapping.result {
        case .void: withUnsafeMutablePointer(to: &ffi_type_void) { $0 }
        case .bool: withUnsafeMutablePointer(to: &ffi_type_uint8) { $0 }
        case .int: withUnsafeMutablePointer(to: &ffi_type_sint32) { $0 }
        }
        cif = .allocate(capacity: 1)
        let status = ffi_prep_cif(cif, FFI_DEFAULT_ABI, UInt32(mapping.arguments.count), resultType, argumentTypes)
        guard status == FFI_OK else {
            throw SetupError(description: "libffi could not prepare the call to '\(mapping.symbol)' (ffi_prep_cif status \(status.rawValue))")
        }
    }

    private static func ffiType(of argument: MappedHandler.Argument) -> UnsafeMutablePointer<ffi_type> {
        switch argument {
        case .taskID: withUnsafeMutablePointer(to: &ffi_type_uint64) { $0 }
        case .type: withUnsafeMutablePointer(to: &ffi_type_sint32) { $0 }
        case .identifier, .task, .dataDirectory, .api, .host, .complete:
            withUnsafeMutablePointer(to: &ffi_type_pointer) { $0 }
        }
    }

    /// Calls the handler for `task` on the caller's thread (the handler thread). A `bool` or
    /// `int` result completes the task; a `void` handler completes it itself.
    func invoke(task: UnsafeMutablePointer<bgtask_task_info>, runner: Runner) {
        let count = mapping.arguments.count
        // Each argument value lives in its own 8-byte slot; avalues points at the slots.
        let slots = UnsafeMutablePointer<UInt64>.allocate(capacity: max(count, 1))
        let values = UnsafeMutablePointer<UnsafeMutableRawPointer?>.allocate(capacity: max(count, 1))
        defer {
            slots.deallocate()
            values.deallocate()
        }
        for (index, argument) in mapping.arguments.enumerated() {
            let slot = UnsafeMutableRawPointer(slots + index)
            switch argument {
            case .identifier: slot.storeBytes(of: UnsafeRawPointer(task.pointee.identifier), as: UnsafeRawPointer?.self)
            case .task: slot.storeBytes(of: UnsafeRawPointer(task), as: UnsafeRawPointer?.self)
            case .taskID: slot.storeBytes(of: task.pointee.task, as: UInt64.self)
            case .type: slot.storeBytes(of: Int32(bitPattern: task.pointee.type), as: Int32.self)
            case .dataDirectory: slot.storeBytes(of: UnsafeRawPointer(Self.cString(runner.assignment.dataDirectory)), as: UnsafeRawPointer?.self)
            case .api: slot.storeBytes(of: UnsafeRawPointer(hostTable), as: UnsafeRawPointer?.self)
            case .host: slot.storeBytes(of: nil, as: UnsafeRawPointer?.self)
            case .complete: slot.storeBytes(of: CompletionClosure.make(task: task.pointee.task), as: UnsafeRawPointer?.self)
            }
            values[index] = slot
        }
        var result: UInt64 = 0 // ffi_arg: results narrower than a register are widened into it
        ffi_call(cif, unsafeBitCast(function, to: (@convention(c) () -> Void).self), &result, values)
        switch mapping.result {
        case .void: break
        case .bool: runner.complete(task.pointee.task, success: UInt8(truncatingIfNeeded: result) != 0)
        case .int: runner.complete(task.pointee.task, success: Int32(truncatingIfNeeded: result) == 0)
        }
    }

    private static let stringLock = NSLock()
    nonisolated(unsafe) private static var strings: [String: UnsafeMutablePointer<CChar>] = [:]

    /// A C string that lives as long as the process.
    private static func cString(_ text: String) -> UnsafeMutablePointer<CChar>? {
        stringLock.withLock {
            if let existing = strings[text] { return existing }
            let copy = strdup(text)
            strings[text] = copy
            return copy
        }
    }
}

/// `void (*)(bool success)` closures, one per task, made with libffi. Kept for the life of the
/// process: a plugin may call one at any time, and calls after the first are ignored.
enum CompletionClosure {
    private static let cif: UnsafeMutablePointer<ffi_cif> = {
        let cif = UnsafeMutablePointer<ffi_cif>.allocate(capacity: 1)
        let types = UnsafeMutablePointer<UnsafeMutablePointer<ffi_type>?>.allocate(capacity: 1)
        types[0] = withUnsafeMutablePointer(to: &ffi_type_uint8) { $0 }
        _ = ffi_prep_cif(cif, FFI_DEFAULT_ABI, 1, withUnsafeMutablePointer(to: &ffi_type_void) { $0 }, types)
        return cif
    }()

    static func make(task: UInt64) -> UnsafeRawPointer? {
        var code: UnsafeMutableRawPointer?
        guard let closure = ffi_closure_alloc(MemoryLayout<ffi_closure>.size, &code)?
            .assumingMemoryBound(to: ffi_closure.self), let code else { return nil }
        let userData = UnsafeMutablePointer<UInt64>.allocate(capacity: 1)
        userData.initialize(to: task)
        let status = ffi_prep_closure_loc(closure, cif, { _, _, arguments, userData in
            guard let arguments, let userData, let first = arguments[0] else { return }
            let success = first.load(as: UInt8.self) != 0
            runner.complete(userData.load(as: UInt64.self), success: success)
        }, userData, code)
        return status == FFI_OK ? UnsafeRawPointer(code) : nil
    }
}

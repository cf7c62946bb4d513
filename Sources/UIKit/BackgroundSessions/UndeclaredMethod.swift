import Foundation
import FoundationNetworking
import _BGTaskURLSessionHook

/// A delegate's method that iOS calls and Linux's protocols do not declare, found by name as
/// the Objective-C runtime finds it on iOS (`respondsToSelector:`), so app code needs no
/// conformance Apple does not ask for (issue 30).
///
/// `urlSessionDidFinishEvents(forBackgroundURLSession:)` is declared by Apple's
/// `URLSessionDelegate` and not by swift-corelibs-foundation's, so Swift cannot call it through
/// the protocol. A Swift class's method is a function symbol of its image, though, exported from
/// a shared library (a plugin), internal ones too: the delegate's class and then its superclasses
/// are searched for a symbol under the class's mangled name that demangles to exactly
/// `<Class>.urlSessionDidFinishEvents(forBackgroundURLSession: FoundationNetworking.URLSession) -> ()`
/// (not a closure inside it, not a thunk), and it is called with Swift's convention (method.c).
/// A generic class, or a method in an image whose file cannot be read, is not found: then
/// `URLSessionBackgroundEventsDelegate` (one line) still makes it callable.
enum UndeclaredMethod {
    static let finishEvents = ".urlSessionDidFinishEvents(forBackgroundURLSession: FoundationNetworking.URLSession) -> ()"

    private static let lock = NSLock()
    nonisolated(unsafe) private static var found: [String: [ObjectIdentifier: UnsafeMutableRawPointer?]] = [:]

    /// Calls `signature` (one of the signatures above, one object argument) on `object` with
    /// `argument` if its class has it. False when it has not.
    static func call(_ signature: String, on object: AnyObject, with argument: AnyObject) -> Bool {
        guard let method = method(signature, of: type(of: object)) else { return false }
        withExtendedLifetime((object, argument)) {
            bgtask_call_swift_method1(method, Unmanaged.passUnretained(argument).toOpaque(), Unmanaged.passUnretained(object).toOpaque())
        }
        return true
    }

    /// The implementation of `signature` that `type` has, its own or its nearest superclass's
    /// (searched once per class).
    static func method(_ signature: String, of type: AnyClass) -> UnsafeMutableRawPointer? {
        let key = ObjectIdentifier(type)
        if let known = lock.withLock({ found[signature]?[key] }) { return known }
        var method: UnsafeMutableRawPointer?
        var current: AnyClass? = type
        while let candidate = current, candidate != NSObject.self, method == nil {
            method = defined(signature, in: candidate)
            current = _getSuperclass(candidate)
        }
        lock.withLock { found[signature, default: [:]][key] = .some(method) }
        return method
    }

    private final class Search {
        let wanted: String
        var address: UnsafeMutableRawPointer?
        init(_ wanted: String) { self.wanted = wanted }
    }

    /// The method `type` itself defines, from the symbols of the image holding its metadata.
    private static func defined(_ signature: String, in type: AnyClass) -> UnsafeMutableRawPointer? {
        guard let mangled = _mangledTypeName(type), let name = demangle("$s" + mangled) else { return nil }
        let search = Search(name + signature)
        let metadata = unsafeBitCast(type, to: UnsafeRawPointer.self)
        withExtendedLifetime(search) {
            _ = bgtask_object_symbols(metadata, "$s" + mangled, { symbol, address, context in
                guard let symbol, let context else { return 0 }
                let search = Unmanaged<Search>.fromOpaque(context).takeUnretainedValue()
                guard UndeclaredMethod.demangle(String(cString: symbol)) == search.wanted else { return 0 }
                search.address = address
                return 1
            }, Unmanaged.passUnretained(search).toOpaque())
        }
        return search.address
    }

    /// The Swift runtime's demangler (exported by libswiftCore).
    static func demangle(_ symbol: String) -> String? {
        symbol.withCString { name in
            guard let text = swift_demangle(name, strlen(name), nil, nil, 0) else { return nil }
            defer { free(text) }
            return String(cString: text)
        }
    }
}

@_silgen_name("swift_demangle")
private func swift_demangle(
    _ mangledName: UnsafePointer<CChar>?, _ mangledNameLength: Int, _ outputBuffer: UnsafeMutablePointer<CChar>?,
    _ outputBufferSize: UnsafeMutablePointer<Int>?, _ flags: UInt32
) -> UnsafeMutablePointer<CChar>?

#if canImport(Glibc)
import Glibc
#endif

/// The one error type of BGTaskHost. Its description says what failed, where (file, key,
/// identifier, pid) and why.
public struct BGTaskError: Error, CustomStringConvertible, Equatable, Sendable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        package let name: String
        public var description: String { name }
        /// A bundle or its Info.plist is invalid.
        public static let invalidBundle = Code(name: "invalid-bundle")
        /// A request names something the bundle does not allow.
        public static let invalidRequest = Code(name: "invalid-request")
        /// A system call failed.
        public static let system = Code(name: "system")
        /// The launch could not be started.
        public static let launch = Code(name: "launch")
        /// A value (a date, a clock advance, a size) is outside the bound the host keeps.
        public static let outOfRange = Code(name: "out-of-range")
        /// Another host holds the state directory.
        public static let hostRunning = Code(name: "host-running")

        /// The memberwise initializer, for the modules above this one.
        package init(name: String) {
            self.name = name
        }
    }

    public var code: Code
    /// The file at fault, when there is one.
    public var file: String?
    /// The Info.plist key (a dotted path) at fault.
    public var key: String?
    /// The underlying errno of a failed system call.
    public var errno: Int32?
    public var detail: String

    public init(_ code: Code, file: String? = nil, key: String? = nil, errno: Int32? = nil, _ detail: String) {
        self.code = code
        self.file = file
        self.key = key
        self.errno = errno
        self.detail = detail
    }

    public var description: String {
        var parts: [String] = []
        if let file { parts.append(file) }
        if let key { parts.append("key \(key)") }
        parts.append(detail)
        var text = parts.joined(separator: ": ")
        if let errno { text += " (\(String(cString: strerror(errno))))" }
        return text
    }
}

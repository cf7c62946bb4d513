// Apple's unified-logging API (the `os` module's logging part), on Linux: entries land in the
// launch's log (docs/sdk.md, "Unified logging"). Only logging is here: no activities, no
// os_unfair_lock beyond the shim in UnfairLock.swift.
public import Foundation

/// The type (level) of a log entry, with Apple's raw values (`os_log_type_t`).
public struct OSLogType: RawRepresentable, Equatable, Hashable, Sendable {
    public let rawValue: UInt8

    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public init(_ rawValue: UInt8) { self.rawValue = rawValue }

    public static let `default` = OSLogType(0x00)
    public static let info = OSLogType(0x01)
    public static let debug = OSLogType(0x02)
    public static let error = OSLogType(0x10)
    public static let fault = OSLogType(0x11)
}

/// A log handle: a subsystem and a category (`OSLog(subsystem:category:)`), the default one
/// (`OSLog.default`, no subsystem) or one that logs nothing (`OSLog.disabled`).
public final class OSLog: NSObject, @unchecked Sendable {
    /// Apple's predefined categories for signposts.
    public struct Category: RawRepresentable, Hashable, Sendable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static let pointsOfInterest = Category(rawValue: "PointsOfInterest")
        public static let dynamicTracing = Category(rawValue: "DynamicTracing")
        public static let dynamicStackTracing = Category(rawValue: "DynamicStackTracing")
    }

    let subsystem: String
    let category: String
    let enabled: Bool

    public init(subsystem: String, category: String) {
        self.subsystem = subsystem
        self.category = category
        self.enabled = true
    }

    public convenience init(subsystem: String, category: OSLog.Category) {
        self.init(subsystem: subsystem, category: category.rawValue)
    }

    private init(disabled: ()) {
        subsystem = ""
        category = ""
        enabled = false
    }

    /// The default handle: no subsystem, no category.
    public static let `default` = OSLog(subsystem: "", category: "")

    /// A handle that logs nothing.
    public static let disabled = OSLog(disabled: ())

    /// Whether entries of `type` are kept: always, but for `OSLog.disabled`.
    public func isEnabled(type: OSLogType) -> Bool { enabled }

    /// Whether signposts on this handle are written (as log entries, see OSSignposter).
    public var signpostsEnabled: Bool { enabled }

    public override var description: String {
        enabled ? "<OS_os_log: \(subsystem.isEmpty ? "default" : "\(subsystem)/\(category)")>" : "<OS_os_log: disabled>"
    }
}

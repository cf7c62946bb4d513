/// Apple's `Logger`: a subsystem and category, and a method per level. Messages are
/// `OSLogMessage`s: string interpolations whose dynamic values are private unless marked
/// otherwise (see OSLogPrivacy).
public struct Logger: Sendable {
    let handle: OSLog

    public init(subsystem: String, category: String) {
        handle = OSLog(subsystem: subsystem, category: category)
    }

    /// The default logger: no subsystem, no category.
    public init() {
        handle = .default
    }

    public init(_ logObj: OSLog) {
        handle = logObj
    }

    /// An entry of the default type (`notice`).
    public func log(_ message: OSLogMessage) { write(.default, message) }
    public func log(level: OSLogType, _ message: OSLogMessage) { write(level, message) }

    /// `debug`.
    public func trace(_ message: OSLogMessage) { write(.debug, message) }
    public func debug(_ message: OSLogMessage) { write(.debug, message) }
    public func info(_ message: OSLogMessage) { write(.info, message) }
    /// The default type.
    public func notice(_ message: OSLogMessage) { write(.default, message) }
    public func error(_ message: OSLogMessage) { write(.error, message) }
    /// `error`, as on Apple's systems.
    public func warning(_ message: OSLogMessage) { write(.error, message) }
    public func fault(_ message: OSLogMessage) { write(.fault, message) }
    /// `fault`, as on Apple's systems.
    public func critical(_ message: OSLogMessage) { write(.fault, message) }

    private func write(_ type: OSLogType, _ message: OSLogMessage) {
        guard handle.enabled else { return }
        UnifiedLogSink.emit(type, log: handle, message.rendered(keepingPrivate: UnifiedLogSink.keepsPrivateValues))
    }
}

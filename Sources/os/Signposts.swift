import Foundation

// Signposts are written to the log as `debug` entries of their handle's subsystem and
// category: an event as `signpost NAME: event`, an interval when it ends, with its length
// (`signpost NAME: interval of 12.3 ms`), each followed by its message if it has one. There is
// no Instruments on Linux; the log is where they can be seen.

/// A signpost's identifier: intervals with the same name and id match.
public struct OSSignpostID: Hashable, Comparable, Sendable {
    public let rawValue: UInt64

    public init(_ value: UInt64) { rawValue = value }

    /// A new identifier, unique in this process.
    public init(log: OSLog) { rawValue = OSSignpostID.counter.next() }

    /// An identifier derived from an object (its address).
    public init(log: OSLog, object: AnyObject) { rawValue = UInt64(UInt(bitPattern: ObjectIdentifier(object).hashValue)) }

    public static let exclusive = OSSignpostID(0xEEEE_B0B5_B2B2_EEEE)
    public static let invalid = OSSignpostID(~0)
    public static let null = OSSignpostID(0)

    public static func < (a: OSSignpostID, b: OSSignpostID) -> Bool { a.rawValue < b.rawValue }

    fileprivate final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var value: UInt64 = 0
        func next() -> UInt64 { lock.withLock { value += 1; return value } }
    }
    fileprivate static let counter = Counter()
}

public struct OSSignpostType: RawRepresentable, Equatable, Hashable, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let event = OSSignpostType(rawValue: 0)
    public static let begin = OSSignpostType(rawValue: 1)
    public static let end = OSSignpostType(rawValue: 2)
}

/// Open intervals of `os_signpost(.begin, ...)`, until their `.end`.
private final class OpenIntervals: @unchecked Sendable {
    static let shared = OpenIntervals()
    private let lock = NSLock()
    private var starts: [String: UInt64] = [:]

    func begin(_ key: String) { lock.withLock { if starts.count < 10_000 { starts[key] = DispatchTime.now().uptimeNanoseconds } } }
    func end(_ key: String) -> UInt64? { lock.withLock { starts.removeValue(forKey: key) } }
}

enum Signposts {
    static func milliseconds(since start: UInt64) -> String {
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds &- start) / 1_000_000
        return String(format: "%.3f ms", elapsed)
    }

    static func write(_ log: OSLog, _ text: String, _ message: String?) {
        guard log.enabled else { return }
        UnifiedLogSink.emit(OSLogType.debug, log: log, message.map { text + ": " + $0 } ?? text)
    }

    static func signpost(_ type: OSSignpostType, log: OSLog, name: StaticString, id: OSSignpostID, message: String?) {
        let key = "\(ObjectIdentifier(log).hashValue)/\(name)/\(id.rawValue)"
        switch type {
        case .begin:
            OpenIntervals.shared.begin(key)
        case .end:
            guard let start = OpenIntervals.shared.end(key) else {
                return write(log, "signpost \(name): end without a begin", message)
            }
            write(log, "signpost \(name): interval of \(milliseconds(since: start))", message)
        default:
            write(log, "signpost \(name): event", message)
        }
    }
}

public func os_signpost(_ type: OSSignpostType, dso: UnsafeRawPointer = #dsohandle, log: OSLog, name: StaticString,
                        signpostID: OSSignpostID = .exclusive) {
    Signposts.signpost(type, log: log, name: name, id: signpostID, message: nil)
}

public func os_signpost(_ type: OSSignpostType, dso: UnsafeRawPointer = #dsohandle, log: OSLog, name: StaticString,
                        signpostID: OSSignpostID = .exclusive, _ format: StaticString, _ arguments: CVarArg...) {
    Signposts.signpost(type, log: log, name: name, id: signpostID,
                       message: LogFormat.render(format.description, arguments, keepingPrivate: UnifiedLogSink.keepsPrivateValues))
}

/// The state of an interval `OSSignposter.beginInterval` began: hand it to `endInterval`.
public final class OSSignpostIntervalState: Codable, Sendable {
    let signpostID: UInt64
    let start: UInt64

    init(id: OSSignpostID) {
        signpostID = id.rawValue
        start = DispatchTime.now().uptimeNanoseconds
    }
}

/// Apple's `OSSignposter`: intervals and events, written to the log (see above).
public struct OSSignposter: Sendable {
    let handle: OSLog

    public init(subsystem: String, category: String) { handle = OSLog(subsystem: subsystem, category: category) }
    public init(subsystem: String, category: OSLog.Category) { handle = OSLog(subsystem: subsystem, category: category) }
    public init(logHandle: OSLog) { handle = logHandle }
    public init(logger: Logger) { handle = logger.handle }
    public init() { handle = .default }

    public static var disabled: OSSignposter { OSSignposter(logHandle: .disabled) }

    public var isEnabled: Bool { handle.enabled }

    public func makeSignpostID() -> OSSignpostID { OSSignpostID(log: handle) }
    public func makeSignpostID(from object: AnyObject) -> OSSignpostID { OSSignpostID(log: handle, object: object) }

    public func beginInterval(_ name: StaticString, id: OSSignpostID = .exclusive) -> OSSignpostIntervalState {
        OSSignpostIntervalState(id: id)
    }

    public func beginInterval(_ name: StaticString, id: OSSignpostID = .exclusive, _ message: OSLogMessage) -> OSSignpostIntervalState {
        OSSignpostIntervalState(id: id)
    }

    public func endInterval(_ name: StaticString, _ state: OSSignpostIntervalState) {
        Signposts.write(handle, "signpost \(name): interval of \(Signposts.milliseconds(since: state.start))", nil)
    }

    public func endInterval(_ name: StaticString, _ state: OSSignpostIntervalState, _ message: OSLogMessage) {
        Signposts.write(handle, "signpost \(name): interval of \(Signposts.milliseconds(since: state.start))",
                        message.rendered(keepingPrivate: UnifiedLogSink.keepsPrivateValues))
    }

    public func emitEvent(_ name: StaticString, id: OSSignpostID = .exclusive) {
        Signposts.write(handle, "signpost \(name): event", nil)
    }

    public func emitEvent(_ name: StaticString, id: OSSignpostID = .exclusive, _ message: OSLogMessage) {
        Signposts.write(handle, "signpost \(name): event", message.rendered(keepingPrivate: UnifiedLogSink.keepsPrivateValues))
    }

    public func withIntervalSignpost<T>(_ name: StaticString, id: OSSignpostID = .exclusive,
                                        around task: () throws -> T) rethrows -> T {
        let state = beginInterval(name, id: id)
        defer { endInterval(name, state) }
        return try task()
    }

    public func withIntervalSignpost<T>(_ name: StaticString, id: OSSignpostID = .exclusive, _ message: OSLogMessage,
                                        around task: () throws -> T) rethrows -> T {
        let state = beginInterval(name, id: id, message)
        defer { endInterval(name, state) }
        return try task()
    }
}

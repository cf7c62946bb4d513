internal import BGTaskLogLine
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where entries go: into the launch's log through the host's `log` function (the SDK installs
/// the writer when the launch attaches), else to stderr, in the same line format
/// (`UnifiedLogLine`).
package enum UnifiedLogSink {
    /// Writes a line at an ABI log level; false when it could not (then stderr is used).
    package typealias Writer = @Sendable (Int32, String) -> Bool

    private static let lock = NSLock()
    nonisolated(unsafe) private static var writer: Writer?

    /// Installed by `BackgroundTasks` when a launch attaches.
    package static func install(_ writer: @escaping Writer) {
        lock.withLock { self.writer = writer }
    }

    /// Whether the launch was told to keep private values (`BGTASK_LOG_PRIVATE=1`, which the
    /// host sets from `--log-private`): read once, as the process starts logging.
    package static let keepsPrivateValues: Bool = {
        guard let value = getenv("BGTASK_LOG_PRIVATE") else { return false }
        return ["1", "true", "yes"].contains(String(cString: value).lowercased())
    }()

    /// The app the entries are of: the launch's bundle (`BGTASK_BUNDLE_ID`, set by the host),
    /// else `Bundle.main`'s, else the process's name.
    static let app: String = {
        if let value = getenv("BGTASK_BUNDLE_ID"), value.pointee != 0 { return String(cString: value) }
        return Bundle.main.bundleIdentifier ?? ProcessInfo.processInfo.processName
    }()

    static func level(of type: OSLogType) -> UnifiedLogLine.Level {
        switch type {
        case .debug: .debug
        case .info: .info
        case .error: .error
        case .fault: .fault
        default: .default
        }
    }

    static func emit(_ type: OSLogType, log: OSLog, _ message: String) {
        emit(level(of: type), log: log, message)
    }

    static func emit(_ level: UnifiedLogLine.Level, log: OSLog, _ message: String) {
        guard log.enabled else { return }
        let line = UnifiedLogLine(milliseconds: UnifiedLogLine.now(), level: level, app: app,
                                  subsystem: log.subsystem, category: log.category, message: message).text
        let writer = lock.withLock { self.writer }
        if let writer, writer(level.abiLevel, line) { return }
        // Outside a launch: stderr, one write per entry.
        var bytes = Array(line.utf8)
        bytes.append(UInt8(ascii: "\n"))
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = write(2, buffer.baseAddress! + offset, buffer.count - offset)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return }
                offset += n
            }
        }
    }
}

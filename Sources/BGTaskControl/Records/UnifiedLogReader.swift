import BGTaskLogLine
import Foundation
import Glibc

/// A unified-logging entry (`Logger`, `os_log`) read from a launch's log, with the launch it
/// came from: what `bgtask log` shows.
public struct UnifiedLogEntry: Sendable, Equatable, Encodable {
    public var line: UnifiedLogLine
    public var launchID: String

    public init(line: UnifiedLogLine, launchID: String) {
        self.line = line
        self.launchID = launchID
    }

    enum CodingKeys: String, CodingKey {
        case time, app, launchID = "launch_id", level, subsystem, category, message
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(UnifiedLogLine.timeText(line.milliseconds), forKey: .time)
        try container.encode(line.app, forKey: .app)
        try container.encode(launchID, forKey: .launchID)
        try container.encode(line.level.rawValue, forKey: .level)
        try container.encode(line.subsystem, forKey: .subsystem)
        try container.encode(line.category, forKey: .category)
        try container.encode(line.message, forKey: .message)
    }

    /// One line as people read it, `log show`'s columns: time, level, app, launch,
    /// [subsystem:category], message.
    public var text: String {
        let level = line.level.rawValue.padding(toLength: 7, withPad: " ", startingAt: 0)
        let names = line.subsystem.isEmpty && line.category.isEmpty ? "" : "[\(line.subsystem):\(line.category)] "
        return "\(UnifiedLogLine.timeText(line.milliseconds)) \(level) \(line.app) \(launchID) \(names)\(line.message)"
    }
}

/// The host's first line of a launch's log: the launch's app (the bundle whose process the
/// launch ran, app or extension) and launch id, as the supervisor knows them.
///
/// ```
/// [bgtask launch] com.example.feed 20261122T041140-91cea49f
/// ```
///
/// Written by the host as it makes the file, before any byte of the child's (`LaunchLog`), so
/// the first line of a log file the host made is always this; what the child prints after it,
/// in this format or any other, is the child's text.
public struct LaunchLogHeader: Sendable, Equatable {
    public var app: String
    public var launchID: String

    public init(app: String, launchID: String) {
        self.app = app
        self.launchID = launchID
    }

    package static let prefix = "[bgtask launch] "

    public var line: String { "\(Self.prefix)\(app) \(launchID)" }

    /// The header `line` is, or nil.
    public init?<S: StringProtocol>(line: S) {
        guard line.hasPrefix(Self.prefix) else { return nil }
        let words = line.dropFirst(Self.prefix.count).split(separator: " ", omittingEmptySubsequences: false)
        guard words.count == 2, !words[0].isEmpty, !words[1].isEmpty else { return nil }
        self.init(app: String(words[0]), launchID: String(words[1]))
    }
}

/// Which entries to show: every criterion given must hold.
public struct UnifiedLogFilter: Sendable {
    public var app: String?
    public var subsystem: String?
    public var category: String?
    /// Entries of this level and above (debug < info < default < error < fault).
    public var minimumLevel: UnifiedLogLine.Level?
    public var launchID: String?
    /// Entries made at or after this time (milliseconds since 1970).
    public var since: Int64?

    public init(app: String? = nil, subsystem: String? = nil, category: String? = nil,
                minimumLevel: UnifiedLogLine.Level? = nil, launchID: String? = nil, since: Int64? = nil) {
        self.app = app
        self.subsystem = subsystem
        self.category = category
        self.minimumLevel = minimumLevel
        self.launchID = launchID
        self.since = since
    }

    /// Whether an entry matches; `line.app` must be the host's (the log's header), not the
    /// line's own claim.
    public func matches(_ line: UnifiedLogLine) -> Bool {
        if let app, line.app != app { return false }
        if let subsystem, line.subsystem != subsystem { return false }
        if let category, line.category != category { return false }
        if let minimumLevel, line.level < minimumLevel { return false }
        if let since, line.milliseconds < since { return false }
        return true
    }
}

/// Reads the unified-logging entries of the launch logs in a state directory's `logs/`
/// (`LAUNCH_ID.log`, as the supervisor writes them and the host prunes them with the history):
/// what is stored (`stored()`), then what is appended and what new launches write (`poll()`),
/// each file from where the last read stopped (at the end of its last whole line).
///
/// An entry's app and launch are the host's, never the child's text: the launch is the file's
/// (its name), and the app is the file's header (`LaunchLogHeader`, the line the host wrote
/// first). The app a line names is the child's claim and is not used: a launch that prints
/// lines in the entry format naming another app shows them as its own. A file the host did
/// not make (its owner is not the logs directory's, or it has other links) is not read; one
/// without a header (written before headers were) shows its entries with the app `-`.
public final class UnifiedLogReader {
    public let directory: URL
    public let filter: UnifiedLogFilter
    /// Bytes of each file read so far (up to its last newline).
    private var offsets: [String: UInt64] = [:]
    /// Each file's app, from its header, once read (`-` when it has none).
    private var owners: [String: String] = [:]
    /// The app shown for the entries of a log without the host's header.
    public static let unknownApp = "-"

    public init(stateDirectory: URL, filter: UnifiedLogFilter) {
        directory = stateDirectory.appendingPathComponent("logs")
        self.filter = filter
    }

    /// Whether the filter's launch id names a log file (no path in it).
    public static func isLaunchID(_ text: String) -> Bool {
        !text.isEmpty && !text.contains("/") && text != "." && text != ".."
    }

    /// The entries stored now, oldest first. Files last written before `filter.since` are
    /// skipped (they hold nothing that recent) but remembered, so `poll()` reads only what is
    /// appended to them later.
    public func stored() -> [UnifiedLogEntry] {
        var entries: [UnifiedLogEntry] = []
        for (name, size, modified) in files() {
            if let since = filter.since, modified < since - 1000 {
                offsets[name] = size
                continue
            }
            entries += read(name)
        }
        return Self.ordered(entries)
    }

    /// What was written since the last `stored()` or `poll()`: appended lines and new files.
    /// A file that is gone (pruned) is forgotten.
    public func poll() -> [UnifiedLogEntry] {
        var entries: [UnifiedLogEntry] = []
        var present = Set<String>()
        for (name, size, _) in files() {
            present.insert(name)
            if size > (offsets[name] ?? 0) || offsets[name] == nil { entries += read(name) }
        }
        for name in offsets.keys where !present.contains(name) { offsets[name] = nil; owners[name] = nil }
        return Self.ordered(entries)
    }

    /// By time, then launch, keeping each launch's order.
    package static func ordered(_ entries: [UnifiedLogEntry]) -> [UnifiedLogEntry] {
        entries.enumerated().sorted {
            ($0.element.line.milliseconds, $0.element.launchID, $0.offset) < ($1.element.line.milliseconds, $1.element.launchID, $1.offset)
        }.map(\.element)
    }

    /// The log files (name, size, modification time in milliseconds), the filter's launch only
    /// when it names one.
    private func files() -> [(String, UInt64, Int64)] {
        let names: [String]
        if let launchID = filter.launchID {
            names = Self.isLaunchID(launchID) ? [launchID + ".log"] : []
        } else {
            names = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).filter { $0.hasSuffix(".log") }
        }
        var directoryInfo = stat()
        guard stat(directory.path, &directoryInfo) == 0 else { return [] }
        return names.sorted().compactMap { name in
            var info = stat()
            // The host's files only: made by the logs directory's owner, with no other name.
            guard lstat(directory.appendingPathComponent(name).path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG,
                  info.st_uid == directoryInfo.st_uid, info.st_nlink == 1 else { return nil }
            return (name, UInt64(info.st_size), Int64(info.st_mtim.tv_sec) * 1000 + Int64(info.st_mtim.tv_nsec) / 1_000_000)
        }
    }

    /// The entries of the whole lines of `name` past its offset; the offset moves past them.
    private func read(_ name: String) -> [UnifiedLogEntry] {
        let offset = offsets[name] ?? 0
        let fd = open(directory.appendingPathComponent(name).path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        var position = off_t(offset)
        while true {
            let n = chunk.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, position) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            bytes += chunk[0..<n]
            position += off_t(n)
        }
        guard let lastNewline = bytes.lastIndex(of: UInt8(ascii: "\n")) else { return [] }
        offsets[name] = offset + UInt64(lastNewline + 1)
        let launchID = String(name.dropLast(4))
        var lines = bytes[..<lastNewline].split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: true)[...]
        if offset == 0 {
            // The first line is the host's header, or the file has none.
            let header = lines.first.flatMap { LaunchLogHeader(line: String(decoding: $0, as: UTF8.self)) }
            owners[name] = header.map { $0.launchID == launchID ? $0.app : Self.unknownApp } ?? Self.unknownApp
            if header != nil { lines = lines.dropFirst() }
        }
        if owners[name] == nil {
            // Read from past the start (skipped as older than `since`): the header on its own.
            var first = [UInt8](repeating: 0, count: 1024)
            let n = first.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
            let line = n > 0 ? first[..<n].split(separator: UInt8(ascii: "\n"), maxSplits: 1, omittingEmptySubsequences: false).first : nil
            let header = line.flatMap { LaunchLogHeader(line: String(decoding: $0, as: UTF8.self)) }
            owners[name] = header.map { $0.launchID == launchID ? $0.app : Self.unknownApp } ?? Self.unknownApp
        }
        let app = owners[name] ?? Self.unknownApp
        var entries: [UnifiedLogEntry] = []
        for line in lines {
            // Cheap test first: most of a log is not entries.
            guard line.count > 24, line.contains(UInt8(ascii: "[")) else { continue }
            guard var entry = UnifiedLogLine(line: String(decoding: line, as: UTF8.self)) else { continue }
            entry.app = app
            guard filter.matches(entry) else { continue }
            entries.append(UnifiedLogEntry(line: entry, launchID: launchID))
        }
        return entries
    }
}

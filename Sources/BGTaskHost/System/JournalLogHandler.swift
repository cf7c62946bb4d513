import BGTaskControl
import Foundation
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// A swift-log handler that writes each entry to systemd's journal in its native protocol, as
/// structured fields: one datagram per entry to `/run/systemd/journal/socket` (AF_UNIX,
/// SOCK_DGRAM) with `MESSAGE=`, `PRIORITY=` (syslog levels), `SYSLOG_IDENTIFIER=bgtask`,
/// `CODE_FILE`, `CODE_LINE`, `CODE_FUNC` and every metadata key as a field of its own
/// (`launch.id` is `LAUNCH_ID`), so that `journalctl -u bgtask LAUNCH_ID=...` finds a launch.
///
/// It never blocks the host: the socket is non-blocking and an entry the journal does not take
/// (its queue is full, journald is restarting) is dropped with a line on stderr (at most one a
/// second; the next says how many went without one). An entry too large for one datagram is
/// sent with its message (and any long metadata value) truncated, with a note saying so.
///
/// `destination(environment:stderr:)` is systemd's rule for when to use it (docs/host.md,
/// "Running as a service").
public struct JournalLogHandler: LogHandler {
    public var logLevel: Logger.Level = .info
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    private let socket: JournalSocket
    private let identifier: String

    /// systemd's journal socket, where journald reads native-protocol datagrams.
    public static let defaultSocketPath = "/run/systemd/journal/socket"

    /// A handler writing to `socket` (shared by the handler's copies; see `JournalSocket.open`).
    public init(socket: JournalSocket, identifier: String = "bgtask", metadataProvider: Logger.MetadataProvider? = nil) {
        self.socket = socket
        self.identifier = identifier
        self.metadataProvider = metadataProvider
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = self.metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty { merged.merge(provided) { $1 } }
        if let explicit = event.metadata, !explicit.isEmpty { merged.merge(explicit) { $1 } }
        let fields = Self.fields(level: event.level, message: event.message.description, metadata: merged, identifier: identifier,
                                 file: event.file, function: event.function, line: event.line)
        socket.send(fields, level: event.level, message: event.message.description)
    }
}

// MARK: - The entry's fields

extension JournalLogHandler {
    /// One field of an entry: a journal field name and its value's bytes.
    public struct Field: Equatable, Sendable {
        public var name: String
        public var value: [UInt8]
        public init(_ name: String, _ value: String) { self.init(name, Array(value.utf8)) }
        public init(_ name: String, _ value: [UInt8]) { self.name = name; self.value = value }
        public var text: String { String(decoding: value, as: UTF8.self) }
    }

    /// The syslog priority journald files a swift-log level under.
    public static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    /// The fields this handler writes and journald itself reads: metadata keys that map to one
    /// of them are given a `META_` prefix, so that metadata never overrides the entry's own.
    static let ownFields: Set<String> = [
        "MESSAGE", "MESSAGE_ID", "PRIORITY", "SYSLOG_IDENTIFIER", "SYSLOG_FACILITY", "SYSLOG_PID", "SYSLOG_TIMESTAMP",
        "CODE_FILE", "CODE_LINE", "CODE_FUNC", "ERRNO", "INVOCATION_ID", "USER_INVOCATION_ID",
    ]

    /// A metadata key as a journal field name: journald accepts only uppercase ASCII letters,
    /// digits and underscores, at most 64 of them, not starting with a digit, and ignores names
    /// starting with `_` from clients (those are its trusted fields). Letters are uppercased,
    /// anything else becomes `_` (`launch.id` is `LAUNCH_ID`, `peer-uid` `PEER_UID`), leading
    /// underscores are dropped, a name that would start with a digit or be one of the entry's
    /// own fields (`message`, `priority`) gets the prefix `META_`, and one left empty is `META`.
    public static func fieldName(_ key: String) -> String {
        var name = String(String.UnicodeScalarView(key.unicodeScalars.map { scalar -> Unicode.Scalar in
            switch scalar {
            case "a"..."z": Unicode.Scalar(scalar.value - 32)!
            case "A"..."Z", "0"..."9", "_": scalar
            default: "_"
            }
        }))
        while name.first == "_" { name.removeFirst() }
        if name.isEmpty { return "META" }
        if name.first!.isASCII && name.first!.isNumber || ownFields.contains(name) { name = "META_" + name }
        return String(name.prefix(64))
    }

    /// An entry's fields, in the order they are sent: the message, its priority, the identifier,
    /// where in the code it was logged, then the metadata in key order.
    public static func fields(level: Logger.Level, message: String, metadata: Logger.Metadata, identifier: String = "bgtask",
                              file: String, function: String, line: UInt) -> [Field] {
        var fields = [
            Field("MESSAGE", message),
            Field("PRIORITY", "\(priority(level))"),
            Field("SYSLOG_IDENTIFIER", identifier),
            Field("CODE_FILE", file),
            Field("CODE_LINE", "\(line)"),
            Field("CODE_FUNC", function),
        ]
        for key in metadata.keys.sorted() {
            fields.append(Field(fieldName(key), text(metadata[key]!)))
        }
        return fields
    }

    /// A metadata value as text: a string as it is, anything else as swift-log prints it.
    static func text(_ value: Logger.MetadataValue) -> String {
        switch value {
        case .string(let string): string
        case .stringConvertible(let convertible): convertible.description
        default: value.description
        }
    }
}

// MARK: - The native protocol

extension JournalLogHandler {
    /// The datagram of `fields` in the journal's native protocol: `NAME=value\n` for a value
    /// without a newline, else the binary form, `NAME\n`, the value's length as a 64-bit
    /// little-endian integer, the value, `\n`.
    public static func encode(_ fields: [Field]) -> [UInt8] {
        var datagram: [UInt8] = []
        datagram.reserveCapacity(fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.count + 10 })
        for field in fields {
            datagram.append(contentsOf: field.name.utf8)
            if field.value.contains(UInt8(ascii: "\n")) {
                datagram.append(UInt8(ascii: "\n"))
                withUnsafeBytes(of: UInt64(field.value.count).littleEndian) { datagram.append(contentsOf: $0) }
            } else {
                datagram.append(UInt8(ascii: "="))
            }
            datagram.append(contentsOf: field.value)
            datagram.append(UInt8(ascii: "\n"))
        }
        return datagram
    }

    /// The fields of one datagram (both forms), or nil when it is not well formed: the inverse of
    /// `encode`, for tests and for anyone reading what the host sent.
    public static func decode(_ datagram: [UInt8]) -> [Field]? {
        var fields: [Field] = []
        var index = 0
        while index < datagram.count {
            guard let end = datagram[index...].firstIndex(where: { $0 == UInt8(ascii: "=") || $0 == UInt8(ascii: "\n") }) else { return nil }
            let name = String(decoding: datagram[index..<end], as: UTF8.self)
            if datagram[end] == UInt8(ascii: "=") {
                guard let newline = datagram[(end + 1)...].firstIndex(of: UInt8(ascii: "\n")) else { return nil }
                fields.append(Field(name, Array(datagram[(end + 1)..<newline])))
                index = newline + 1
            } else {
                guard end + 9 <= datagram.count else { return nil }
                var length: UInt64 = 0
                for (shift, byte) in datagram[(end + 1)..<(end + 9)].enumerated() { length |= UInt64(byte) << (8 * UInt64(shift)) }
                let start = end + 9
                guard length <= UInt64(datagram.count - start - 1), datagram[start + Int(length)] == UInt8(ascii: "\n") else { return nil }
                fields.append(Field(name, Array(datagram[start..<(start + Int(length))])))
                index = start + Int(length) + 1
            }
        }
        return fields
    }

    /// Values longer than this are cut when an entry must be truncated (the message gets what
    /// is left of the budget).
    static let truncatedValueLimit = 4096

    /// `fields` made to fit a datagram of `limit` bytes: metadata values over
    /// `truncatedValueLimit` (or an eighth of the limit) bytes, then the message, cut at a UTF-8
    /// boundary with a note saying how much was kept.
    public static func truncated(_ fields: [Field], toFit limit: Int) -> [Field] {
        guard encode(fields).count > limit else { return fields }
        let valueLimit = min(truncatedValueLimit, max(limit / 8, 64))
        var fields = fields.map { field in
            field.name == "MESSAGE" || field.value.count <= valueLimit ? field : Field(field.name, cut(field.value, to: valueLimit, what: "value"))
        }
        guard let message = fields.firstIndex(where: { $0.name == "MESSAGE" }) else { return fields }
        let others = encode(fields).count - encode([fields[message]]).count
        // "MESSAGE\n" + 8-byte length + "\n": the binary form is the longer one.
        let room = max(limit - others - "MESSAGE".utf8.count - 10, 0)
        if fields[message].value.count > room { fields[message].value = cut(fields[message].value, to: room, what: "message") }
        return fields
    }

    /// `value` cut to at most `limit` bytes, its end a note: "… [bgtask: message truncated to
    /// 100 of 4194304 bytes to fit the journal's datagram]".
    static func cut(_ value: [UInt8], to limit: Int, what: String) -> [UInt8] {
        let total = value.count
        func note(_ kept: Int) -> [UInt8] {
            Array("… [bgtask: \(what) truncated to \(kept) of \(total) bytes to fit the journal's datagram]".utf8)
        }
        // A note for fewer bytes kept is never longer than the one for `limit`.
        var keep = max(0, min(limit - note(limit).count, total))
        // Not in the middle of a UTF-8 sequence.
        while keep > 0, keep < total, value[keep] & 0xC0 == 0x80 { keep -= 1 }
        return Array(value[..<keep]) + note(keep)
    }
}

// MARK: - The socket

/// The journal's socket as a handler writes to it: one unbound non-blocking AF_UNIX datagram
/// socket, each entry sent to the path (so a restarted journald is found again), shared by
/// every copy of the handler. Closed when the last copy is gone.
public final class JournalSocket: @unchecked Sendable {
    public let path: String
    private let fd: Int32
    private let address: sockaddr_un
    /// Failures since the last line on stderr, and when that line was written.
    private let failures = LockedValue((unreported: 0, lastLine: 0.0))

    /// A socket to send to `path`, or an error saying why there is none (`path` is missing or
    /// not a socket, or too long for a socket address). `sendBuffer` is asked of the kernel for
    /// the socket's send buffer, which bounds a datagram (tests ask for less).
    public static func open(path: String, sendBuffer: Int32 = 8 << 20) throws(BGTaskError) -> JournalSocket {
        var info = stat()
        guard stat(path, &info) == 0 else { throw BGTaskError(.system, file: path, errno: errno, "no journal socket") }
        guard info.st_mode & S_IFMT == S_IFSOCK else { throw BGTaskError(.system, file: path, "not a socket") }
        guard path.utf8.count < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else {
            throw BGTaskError(.system, file: path, "the journal socket's path is too long")
        }
        let fd = try syscall("socket") { socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0) }
        // As sd_journal_send does: a larger send buffer makes large entries fit one datagram
        // (the kernel caps it at net.core.wmem_max).
        var size = sendBuffer
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        return JournalSocket(path: path, fd: fd)
    }

    private init(path: String, fd: Int32) {
        self.path = path
        self.fd = fd
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            for (index, byte) in path.utf8.enumerated() { buffer[index] = byte }
        }
        self.address = address
    }

    deinit { close(fd) }

    /// The largest datagram the socket sends (the kernel refuses more than its send buffer).
    var sendLimit: Int {
        var size: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &length) == 0, size > 4096 else { return 200_000 }
        return Int(size) - 4096
    }

    /// Sends one entry; an entry too large is sent again truncated; one the journal does not
    /// take is dropped with a line on stderr. Never blocks.
    func send(_ fields: [JournalLogHandler.Field], level: Logger.Level, message: String) {
        var datagram = JournalLogHandler.encode(fields)
        var error = sendDatagram(datagram)
        var limit = min(datagram.count, sendLimit)
        // Too large (EMSGSIZE), or too large for the memory at hand (ENOBUFS): smaller and
        // smaller until it fits or is down to a few kilobytes.
        while error == EMSGSIZE || error == ENOBUFS, limit >= 2048 {
            datagram = JournalLogHandler.encode(JournalLogHandler.truncated(fields, toFit: limit))
            error = sendDatagram(datagram)
            limit /= 2
        }
        guard error != 0 else { return }
        report(error, message: message, level: level)
    }

    /// 0 when sent, else the errno.
    private func sendDatagram(_ datagram: [UInt8]) -> Int32 {
        let sent = withUnsafePointer(to: address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                datagram.withUnsafeBytes { bytes in
                    sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT), address,
                           socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
        }
        return sent >= 0 ? 0 : errno
    }

    /// A line on stderr for a dropped entry: at most one a second, the next one counting the
    /// entries dropped without a line of their own.
    private func report(_ error: Int32, message: String, level: Logger.Level) {
        let now = Date().timeIntervalSince1970
        let unreported: Int? = failures.withLock { state in
            guard now - state.lastLine >= 1 else { state.unreported += 1; return nil }
            defer { state = (0, now) }
            return state.unreported
        }
        guard let unreported else { return }
        let firstLine = message.prefix { $0 != "\n" }.prefix(200)
        let more = unreported > 0 ? " (and \(unreported) more since the last line)" : ""
        let line = "bgtask: journal: dropped an entry (\(String(cString: strerror(error)))) on \(path): \(level) \(firstLine)\(more)\n"
        _ = line.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
    }
}

// MARK: - When to use it

extension JournalLogHandler {
    /// Where the CLI and the host log.
    public enum Destination: Equatable, Sendable {
        /// Text lines on stderr (swift-log's StreamLogHandler).
        case stream
        /// The journal, through the socket at this path.
        case journal(socket: String)
    }

    /// A file's device and inode, as `fstat` gives them and `JOURNAL_STREAM` writes them.
    public struct FileIdentity: Equatable, Sendable {
        public var device: UInt64
        public var inode: UInt64
        public init(device: UInt64, inode: UInt64) { self.device = device; self.inode = inode }

        /// stderr's (fd 2), or nil when it is closed.
        public static func standardError() -> FileIdentity? {
            var info = stat()
            guard fstat(2, &info) == 0 else { return nil }
            return FileIdentity(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
        }

        /// `JOURNAL_STREAM`'s form, `DEVICE:INODE` in decimal; nil for anything else.
        public init?(journalStream: String) {
            let parts = journalStream.split(separator: ":", omittingEmptySubsequences: false)
            guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return nil }
            self.init(device: device, inode: inode)
        }
    }

    /// Where to log, by systemd's documented rule (systemd.exec(5), `$JOURNAL_STREAM`): the
    /// journal when `JOURNAL_STREAM` is set and names stderr's device and inode (stderr is a
    /// journal stream, not redirected elsewhere since), else stderr. `BGTASK_LOG_FORMAT=text`
    /// forces stderr, `journal` the journal; the socket is `BGTASK_JOURNAL_SOCKET`, else
    /// systemd's. The second value is a warning for an unknown `BGTASK_LOG_FORMAT`.
    public static func destination(environment: [String: String], stderr: FileIdentity?) -> (Destination, warning: String?) {
        let socket = environment["BGTASK_JOURNAL_SOCKET"].flatMap { $0.isEmpty ? nil : $0 } ?? defaultSocketPath
        var warning: String?
        switch environment["BGTASK_LOG_FORMAT"] ?? "" {
        case "text": return (.stream, nil)
        case "journal": return (.journal(socket: socket), nil)
        case "", "auto": break
        case let other: warning = "BGTASK_LOG_FORMAT is text, journal or auto, not '\(other)'; choosing as auto does"
        }
        guard let stream = environment["JOURNAL_STREAM"].flatMap(FileIdentity.init(journalStream:)), let stderr, stream == stderr else {
            return (.stream, warning)
        }
        return (.journal(socket: socket), warning)
    }
}

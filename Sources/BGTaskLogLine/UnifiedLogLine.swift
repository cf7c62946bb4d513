#if canImport(Glibc)
import Glibc
#endif

/// One unified-logging entry (`Logger`, `os_log`, signposts from the `os` module) as a line of a
/// launch's log: the one definition of the line format, shared by the writer (the `os` module,
/// in the app's process) and the readers (`bgtask log`, through `UnifiedLogReader`).
///
/// ```
/// [bgtask info] [os:default] 2026-11-22T04:11:40.123Z com.example.feed com.example.feed/network: fetched 12 items
/// ```
///
/// - `[bgtask LEVEL] ` is the supervisor's tag on a line the plugin gave the host's `log`
///   function (`debug`, `info`, `error`); absent when the entry was written to stderr (outside a
///   launch, or before the SDK is attached). Readers accept the line with or without it.
/// - `[os:TYPE]`: the entry's `OSLogType`: `debug`, `info`, `default`, `error` or `fault`.
/// - TIME: the wall-clock time the entry was made, UTC, ISO 8601 with milliseconds.
/// - APP: the bundle identifier of the process (the launch's app or extension).
/// - SUBSYSTEM/CATEGORY: the `Logger`'s or `OSLog`'s. APP, SUBSYSTEM and CATEGORY are written
///   with `%`, `/`, `:`, space and control characters percent-encoded (`%2F`), and as `-` when
///   empty (a literal `-` is `%2D`), so each is one word and the line splits without ambiguity.
/// - MESSAGE: the rest of the line, with `\` written `\\`, a newline `\n`, a carriage return
///   `\r` and other control characters `\xHH`, so one entry is always one line.
public struct UnifiedLogLine: Sendable, Equatable {
    /// `OSLogType`, as the line names it. Ordered by severity (`debug` < `info` < `default` <
    /// `error` < `fault`).
    public enum Level: String, Sendable, CaseIterable, Comparable, Codable {
        case debug, info, `default`, error, fault

        var rank: Int { Self.allCases.firstIndex(of: self)! }
        public static func < (a: Level, b: Level) -> Bool { a.rank < b.rank }

        /// The level of the host ABI's `log` function (BGTASK_LOG_DEBUG 0, INFO 1, ERROR 2).
        public var abiLevel: Int32 {
            switch self {
            case .debug: 0
            case .info, .default: 1
            case .error, .fault: 2
            }
        }

        /// A level as people write it: the five names, and `notice` (Logger's name for
        /// `default`).
        public init?(name: String) {
            let lowered = name.lowercased()
            if lowered == "notice" { self = .default; return }
            self.init(rawValue: lowered)
        }
    }

    /// Milliseconds since 1970 (UTC).
    public var milliseconds: Int64
    public var level: Level
    public var app: String
    public var subsystem: String
    public var category: String
    public var message: String

    public init(milliseconds: Int64, level: Level, app: String, subsystem: String, category: String, message: String) {
        self.milliseconds = milliseconds
        self.level = level
        self.app = app
        self.subsystem = subsystem
        self.category = category
        self.message = message
    }

    /// Now, in milliseconds since 1970.
    public static func now() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1000 + Int64(spec.tv_nsec) / 1_000_000
    }

    /// The line, without the supervisor's `[bgtask LEVEL] ` tag and without a newline.
    public var text: String {
        "[os:\(level.rawValue)] \(Self.timeText(milliseconds)) \(Self.word(app)) \(Self.word(subsystem))/\(Self.word(category)): \(Self.escaped(message))"
    }

    /// Reads a line of a launch's log (without its newline); nil when it is not an entry.
    public init?<S: StringProtocol>(line: S) {
        var rest = Substring(line)
        if rest.hasPrefix("[bgtask ") {
            guard let close = rest.firstIndex(of: "]") else { return nil }
            rest = rest[rest.index(after: close)...]
            guard rest.first == " " else { return nil }
            rest = rest.dropFirst()
        }
        guard rest.hasPrefix("[os:"), let close = rest.firstIndex(of: "]"),
              let level = Level(rawValue: String(rest[rest.index(rest.startIndex, offsetBy: 4)..<close])) else { return nil }
        rest = rest[rest.index(after: close)...]
        func word() -> Substring? {
            guard rest.first == " " else { return nil }
            rest = rest.dropFirst()
            let end = rest.firstIndex(of: " ") ?? rest.endIndex
            defer { rest = rest[end...] }
            return rest[..<end]
        }
        guard let time = word(), let milliseconds = Self.parseTime(time),
              let app = word().flatMap(Self.unword),
              let names = word(), names.last == ":", let slash = names.firstIndex(of: "/"),
              let subsystem = Self.unword(names[..<slash]),
              let category = Self.unword(names[names.index(after: slash)..<names.index(before: names.endIndex)]),
              rest.first == " ", let message = Self.unescaped(rest.dropFirst()) else { return nil }
        self.init(milliseconds: milliseconds, level: level, app: app, subsystem: subsystem, category: category, message: message)
    }

    // MARK: Fields

    /// `2026-11-22T04:11:40.123Z`.
    public static func timeText(_ milliseconds: Int64) -> String {
        var seconds = time_t(milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000)
        let millis = Int((milliseconds % 1000 + 1000) % 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(millis), 3))Z"
    }

    /// The inverse of `timeText`.
    public static func parseTime<S: StringProtocol>(_ text: S) -> Int64? {
        let bytes = Array(text.utf8)
        guard bytes.count == 24, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"), bytes[10] == UInt8(ascii: "T"),
              bytes[13] == UInt8(ascii: ":"), bytes[16] == UInt8(ascii: ":"), bytes[19] == UInt8(ascii: "."),
              bytes[23] == UInt8(ascii: "Z") else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for byte in bytes[range] {
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
            }
            return value
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), let hour = number(11..<13),
              let minute = number(14..<16), let second = number(17..<19), let millis = number(20..<23),
              (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61 else { return nil }
        // Days from the civil date (Howard Hinnant's algorithm), no time zone involved.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return Int64(((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + Int64(millis)
    }

    /// APP, SUBSYSTEM or CATEGORY as one word.
    static func word(_ text: String) -> String {
        if text.isEmpty { return "-" }
        if text == "-" { return "%2D" }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "%"), UInt8(ascii: "/"), UInt8(ascii: ":"), UInt8(ascii: " "), 0..<0x20, 0x7F:
                bytes += [UInt8(ascii: "%")] + Array(hex(byte).utf8)
            default:
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func unword<S: StringProtocol>(_ text: S) -> String? {
        if text == "-" { return "" }
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else { return nil }
                bytes.append(high << 4 | low)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func escaped(_ text: String) -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\\"): bytes += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case UInt8(ascii: "\n"): bytes += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case UInt8(ascii: "\r"): bytes += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case UInt8(ascii: "\t"): bytes.append(byte)
            case 0..<0x20, 0x7F: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "x")] + Array(hex(byte).utf8)
            default: bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func unescaped<S: StringProtocol>(_ text: S) -> String? {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "\\") else { bytes.append(byte); continue }
            switch iterator.next() {
            case UInt8(ascii: "\\"): bytes.append(UInt8(ascii: "\\"))
            case UInt8(ascii: "n"): bytes.append(UInt8(ascii: "\n"))
            case UInt8(ascii: "r"): bytes.append(UInt8(ascii: "\r"))
            case UInt8(ascii: "x"):
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else { return nil }
                bytes.append(high << 4 | low)
            default: return nil
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789ABCDEF".utf8)
        return String(decoding: [digits[Int(byte >> 4)], digits[Int(byte & 15)]], as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

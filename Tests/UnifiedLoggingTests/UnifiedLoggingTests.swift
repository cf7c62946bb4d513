import BGTaskLogLine
import Foundation
@testable import os
import Testing

/// The `os` module in this process (no launch): messages as they are stored, privacy, formats,
/// os_log's printf formats, and the line format both ways.
@Suite struct UnifiedLoggingTests {
    @Test func privacyFollowsApplesDefaults() {
        let user = "alice@example.com"
        let message: OSLogMessage = "n \(12) user \(user) flag \(true) x \(2.5) pub \(user, privacy: .public) priv \(7, privacy: .private) sens \(user, privacy: .sensitive)"
        #expect(message.rendered(keepingPrivate: false)
            == "n 12 user <private> flag true x 2.500000 pub alice@example.com priv <private> sens <private>")
        #expect(message.rendered(keepingPrivate: true)
            == "n 12 user alice@example.com flag true x 2.500000 pub alice@example.com priv 7 sens <private>")
        let hashed: OSLogMessage = "a \(user, privacy: .private(mask: .hash)) b \(user, privacy: .private(mask: .hash)) c \("other", privacy: .private(mask: .hash))"
        let text = hashed.rendered(keepingPrivate: false)
        let masks = text.split(separator: " ").filter { $0.hasPrefix("'") }
        #expect(masks.count == 3 && masks[0] == masks[1] && masks[0] != masks[2], "\(text)")
        #expect(text.hasPrefix("a <mask.hash: '") && !text.contains(user))
    }

    @Test func formatsAndAlignment() {
        let message: OSLogMessage = "\(255, format: .hex) \(255, format: .hex(includePrefix: true, uppercase: true)) \(8, format: .octal(includePrefix: true)) \(42, format: .decimal(minDigits: 5)) \(3, format: .decimal(explicitPositiveSign: true)) \(-7) [\(12, align: .right(columns: 4))] [\("ab", align: .left(columns: 4), privacy: .public)] \(3.14159, format: .fixed(precision: 2)) \(1500.0, format: .exponential(precision: 1)) \(false, format: .answer) \(Float(0.5), format: .hybrid)"
        #expect(message.rendered(keepingPrivate: false) == "ff 0XFF 010 00042 +3 -7 [  12] [ab  ] 3.14 1.5e+03 NO 0.5")
        let object: OSLogMessage = "\(NSString(string: "obj")) \(URL(fileURLWithPath: "/a")) \(Int.self)"
        #expect(object.rendered(keepingPrivate: false) == "<private> <private> <private>")
        #expect(object.rendered(keepingPrivate: true) == "obj file:///a Swift.Int")
    }

    @Test func osLogFormatsWithPrivacySpecifiers() {
        let text = LogFormat.render("%{public}@ fetched %d items for %@, %{private}d, %{public}s %.1f%% %5d|%-3d| %{bool}d %{public, mask.hash}@ %{private, mask.hash}@ %x %lld",
                                    ["feed", 7, "alice", 9, "str", 99.44, 42, 1, 1, "pub", "alice", 255, Int64(5)], keepingPrivate: false)
        #expect(text.hasPrefix("feed fetched 7 items for <private>, <private>, str 99.4% ") , "\(text)")
        #expect(text.contains("   42|1  | true pub <mask.hash: '"), "\(text)")
        #expect(text.hasSuffix("'> ff 5"), "\(text)")
        #expect(LogFormat.render("%@ and %d", ["x"], keepingPrivate: true) == "x and <missing>")
        #expect(LogFormat.render("%{private}@ %@", ["a", "b"], keepingPrivate: true) == "a b")
    }

    @Test func theLineFormatRoundTrips() throws {
        let entry = UnifiedLogLine(milliseconds: 1_795_320_700_123, level: .default, app: "com.example.feed",
                                   subsystem: "com.example.feed", category: "Background Fetch: net/io",
                                   message: "two\nlines \\ and \u{1}\ttab")
        #expect(entry.text == #"[os:default] 2026-11-22T04:11:40.123Z com.example.feed com.example.feed/Background%20Fetch%3A%20net%2Fio: two\nlines \\ and \x01"# + "\ttab")
        #expect(UnifiedLogLine(line: entry.text) == entry)
        #expect(UnifiedLogLine(line: "[bgtask info] " + entry.text) == entry)
        let empty = UnifiedLogLine(milliseconds: 0, level: .fault, app: "", subsystem: "", category: "-", message: "")
        #expect(empty.text == "[os:fault] 1970-01-01T00:00:00.000Z - -/%2D: ")
        #expect(UnifiedLogLine(line: empty.text) == empty)
        for junk in ["", "hello", "[bgtask info] plain text", "[os:loud] 2026-11-22T04:11:40.123Z a b/c: m",
                     "[os:info] yesterday a b/c: m", "[os:info] 2026-11-22T04:11:40.123Z a bc: m", "[os:info] 2026-11-22T04:11:40.123Z a b/c: bad \\q"] {
            #expect(UnifiedLogLine(line: junk) == nil, "\(junk)")
        }
        #expect(UnifiedLogLine.Level(name: "notice") == .default)
        #expect(UnifiedLogLine.Level.debug < .info && UnifiedLogLine.Level.info < .default && UnifiedLogLine.Level.error < .fault)
    }

    /// What reaches the host's `log` function (the writer the SDK installs when a launch
    /// attaches): one line per entry, at the ABI level of its type; nothing for a disabled log.
    @Test func entriesGoToTheInstalledWriterAtTheirABILevel() throws {
        final class Captured: @unchecked Sendable {
            let lock = NSLock()
            var lines: [(Int32, String)] = []
        }
        let captured = Captured()
        UnifiedLogSink.install { level, line in
            guard line.contains("sink-test") else { return false }
            captured.lock.withLock { captured.lines.append((level, line)) }
            return true
        }
        let logger = Logger(subsystem: "com.example.sink", category: "unit")
        logger.debug("sink-test debug")
        logger.notice("sink-test notice \(3)")
        logger.critical("sink-test critical")
        Logger(OSLog.disabled).fault("sink-test never")
        os_log("sink-test %{public}@ %d", log: OSLog(subsystem: "com.example.sink", category: "legacy"), type: .error, "os_log", 5)
        let lines = captured.lock.withLock { captured.lines }
        #expect(lines.map(\.0) == [0, 1, 2, 2])
        let parsed = try lines.map { try #require(UnifiedLogLine(line: $0.1)) }
        #expect(parsed.map(\.level) == [.debug, .default, .fault, .error])
        #expect(parsed.map(\.message) == ["sink-test debug", "sink-test notice 3", "sink-test critical", "sink-test os_log 5"])
        #expect(parsed.allSatisfy { $0.subsystem == "com.example.sink" && !$0.app.isEmpty })
        #expect(parsed.map(\.category) == ["unit", "unit", "unit", "legacy"])
    }
}

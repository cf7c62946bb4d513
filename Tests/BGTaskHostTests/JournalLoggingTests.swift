@testable import BGTaskHost
import BGTaskControl
import Foundation
import Logging
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A stand-in for journald's socket: a bound AF_UNIX datagram socket in a scratch directory,
/// read without blocking until a deadline.
final class JournalSink {
    let path: String
    private let fd: Int32
    private(set) var entries: [[JournalLogHandler.Field]] = []

    init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            for (index, byte) in path.utf8.enumerated() { buffer[index] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else {
            let error = errno
            close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: error) ?? .EIO)
        }
    }

    deinit { close(fd) }

    /// Reads what has arrived (non-blocking) until `done` holds for everything read so far or
    /// the deadline passes; returns everything read.
    @discardableResult
    func read(timeout: TimeInterval = 15, until done: ([[JournalLogHandler.Field]]) -> Bool) throws -> [[JournalLogHandler.Field]] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            while let datagram = receive() {
                entries.append(try #require(JournalLogHandler.decode(datagram), "a malformed datagram: \(datagram.prefix(200))"))
            }
            if done(entries) || Date() > deadline { return entries }
            usleep(10_000)
        }
    }

    /// One datagram, or nil when none is waiting.
    private func receive() -> [UInt8]? {
        var byte: UInt8 = 0
        // Its size first (MSG_TRUNC answers with the whole length), then the datagram.
        let size = recv(fd, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_TRUNC) | Int32(MSG_DONTWAIT))
        guard size >= 0 else { return nil }
        var buffer = [UInt8](repeating: 0, count: max(size, 1))
        let got = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        guard got >= 0 else { return nil }
        return Array(buffer[..<got])
    }
}

extension Array where Element == JournalLogHandler.Field {
    subscript(field name: String) -> String? { first { $0.name == name }?.text }
}

@Suite struct JournalLoggingTests {
    typealias Field = JournalLogHandler.Field

    // MARK: The protocol

    @Test func aValueWithANewlineIsEncodedInTheBinaryForm() throws {
        let datagram = JournalLogHandler.encode([Field("MESSAGE", "one line"), Field("ERROR", "first\nsecond"), Field("EMPTY", "")])
        var expected = Array("MESSAGE=one line\n".utf8)
        expected += Array("ERROR\n".utf8) + [12, 0, 0, 0, 0, 0, 0, 0] + Array("first\nsecond".utf8) + [UInt8(ascii: "\n")]
        expected += Array("EMPTY=\n".utf8)
        #expect(datagram == expected)
        #expect(JournalLogHandler.decode(datagram) == [Field("MESSAGE", "one line"), Field("ERROR", "first\nsecond"), Field("EMPTY", "")])
        // A length past the end is not a datagram.
        #expect(JournalLogHandler.decode(Array("ERROR\n".utf8) + [99, 0, 0, 0, 0, 0, 0, 0] + Array("ab\n".utf8)) == nil)
    }

    @Test func anEntryHasItsPriorityPlaceAndMetadataAsFields() {
        let fields = JournalLogHandler.fields(
            level: .warning, message: "launching\nsecond line", metadata: ["launch.id": "L1", "bundle.id": "com.example.feed", "count": .stringConvertible(3)],
            file: "BGTaskHost/Launch/LaunchCoordinator.swift", function: "launch(_:)", line: 161)
        #expect(fields.map(\.name) == ["MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "CODE_FILE", "CODE_LINE", "CODE_FUNC", "BUNDLE_ID", "COUNT", "LAUNCH_ID"])
        #expect(fields[field: "MESSAGE"] == "launching\nsecond line")
        #expect(fields[field: "PRIORITY"] == "4")
        #expect(fields[field: "SYSLOG_IDENTIFIER"] == "bgtask")
        #expect(fields[field: "CODE_LINE"] == "161")
        #expect(fields[field: "COUNT"] == "3")
        #expect(fields[field: "LAUNCH_ID"] == "L1")
        let levels: [Logger.Level] = [.trace, .debug, .info, .notice, .warning, .error, .critical]
        #expect(levels.map(JournalLogHandler.priority) == [7, 7, 6, 5, 4, 3, 2])
    }

    @Test func metadataKeysBecomeJournalFieldNames() {
        let names = [
            "launch.id": "LAUNCH_ID", "bundle.id": "BUNDLE_ID", "peer-uid": "PEER_UID", "child.pid": "CHILD_PID",
            "_private": "PRIVATE", "__x": "X", "2fa": "META_2FA", "message": "META_MESSAGE", "priority": "META_PRIORITY",
            "": "META", "...": "META", "café": "CAF_", "Error": "ERROR",
        ]
        for (key, name) in names { #expect(JournalLogHandler.fieldName(key) == name, "\(key)") }
        #expect(JournalLogHandler.fieldName(String(repeating: "a", count: 100)) == String(repeating: "A", count: 64))
        for key in ["launch.id", "_private", "2fa", "", "café", "a b\nc=d"] {
            let name = JournalLogHandler.fieldName(key)
            #expect(name.allSatisfy { $0.isASCII && ($0.isUppercase || $0.isNumber || $0 == "_") }, "\(name)")
            #expect(!name.hasPrefix("_") && !name.first!.isNumber, "\(name)")
        }
    }

    @Test func anEntryTooLargeIsTruncatedWithANote() {
        let message = String(repeating: "é", count: 50_000) // 100,000 bytes, two per character
        let fields = JournalLogHandler.fields(level: .error, message: message, metadata: ["error": .string(String(repeating: "x", count: 20_000)), "launch.id": "L1"],
                                              file: "F.swift", function: "f()", line: 1)
        let fitted = JournalLogHandler.truncated(fields, toFit: 16_384)
        #expect(JournalLogHandler.encode(fitted).count <= 16_384)
        let text = fitted[field: "MESSAGE"]!
        #expect(text.hasPrefix("éé"))
        #expect(text.contains("… [bgtask: message truncated to "), "\(text.suffix(120))")
        #expect(text.hasSuffix(" of 100000 bytes to fit the journal's datagram]"))
        #expect(!text.contains("\u{FFFD}"), "cut inside a character")
        #expect(fitted[field: "ERROR"]!.contains("[bgtask: value truncated to "))
        #expect(fitted[field: "LAUNCH_ID"] == "L1")
        #expect(fitted[field: "PRIORITY"] == "3")
        // What fits is left alone.
        #expect(JournalLogHandler.truncated(fields, toFit: 1 << 20) == fields)
    }

    // MARK: When to use it

    @Test func theJournalIsChosenOnlyWhenJournalStreamNamesStderr() {
        let stderr = JournalLogHandler.FileIdentity(device: 64_768, inode: 123_456)
        func destination(_ environment: [String: String], _ identity: JournalLogHandler.FileIdentity? = stderr) -> JournalLogHandler.Destination {
            JournalLogHandler.destination(environment: environment, stderr: identity).0
        }
        let journal = JournalLogHandler.Destination.journal(socket: "/run/systemd/journal/socket")
        #expect(destination(["JOURNAL_STREAM": "64768:123456"]) == journal)
        // Inherited by a process whose stderr was redirected since: not the journal.
        #expect(destination(["JOURNAL_STREAM": "64768:123457"]) == .stream)
        #expect(destination(["JOURNAL_STREAM": "64769:123456"]) == .stream)
        #expect(destination([:]) == .stream)
        #expect(destination(["JOURNAL_STREAM": "garbage"]) == .stream)
        #expect(destination(["JOURNAL_STREAM": "64768:123456:1"]) == .stream)
        #expect(destination(["JOURNAL_STREAM": "64768:123456"], nil) == .stream)
        // Forced either way.
        #expect(destination(["JOURNAL_STREAM": "64768:123456", "BGTASK_LOG_FORMAT": "text"]) == .stream)
        #expect(destination(["BGTASK_LOG_FORMAT": "journal"]) == journal)
        #expect(destination(["BGTASK_LOG_FORMAT": "auto", "JOURNAL_STREAM": "64768:123456"]) == journal)
        #expect(destination(["BGTASK_LOG_FORMAT": "journal", "BGTASK_JOURNAL_SOCKET": "/tmp/j.sock"]) == .journal(socket: "/tmp/j.sock"))
        let (unknown, warning) = JournalLogHandler.destination(environment: ["BGTASK_LOG_FORMAT": "json"], stderr: stderr)
        #expect(unknown == .stream)
        #expect(warning?.contains("'json'") == true)
        #expect(JournalLogHandler.FileIdentity.standardError() != nil)
    }

    // MARK: The socket

    @Test func entriesReachTheSocketAndOneTooLargeForADatagramIsTruncated() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let sink = try JournalSink(path: scratch.url.appendingPathComponent("journal.sock").path)
        // A small send buffer (64 KiB, doubled by the kernel) makes a 1 MiB entry too large.
        let socket = try JournalSocket.open(path: sink.path, sendBuffer: 64 << 10)
        var logger = Logger(label: "bgtask") { _ in JournalLogHandler(socket: socket) }
        logger.logLevel = .debug
        logger[metadataKey: "launch.id"] = "L42"
        logger.notice("first\nsecond", metadata: ["bundle.id": "com.example.feed"])
        let huge = String(repeating: "y", count: 1 << 20)
        logger.error("\(huge)")
        let entries = try sink.read { $0.count >= 2 }
        try #require(entries.count == 2)
        #expect(entries[0][field: "MESSAGE"] == "first\nsecond")
        #expect(entries[0][field: "PRIORITY"] == "5")
        #expect(entries[0][field: "LAUNCH_ID"] == "L42")
        #expect(entries[0][field: "BUNDLE_ID"] == "com.example.feed")
        #expect(entries[0][field: "CODE_FILE"]?.hasSuffix("JournalLoggingTests.swift") == true)
        let truncated = try #require(entries[1][field: "MESSAGE"])
        #expect(truncated.hasPrefix("yyyy"))
        #expect(truncated.hasSuffix("of \(1 << 20) bytes to fit the journal's datagram]"))
        #expect(truncated.utf8.count < 128 << 10)
        #expect(entries[1][field: "PRIORITY"] == "3")
        #expect(entries[1][field: "LAUNCH_ID"] == "L42")
    }

    @Test func aMissingSocketIsAnError() {
        #expect(throws: BGTaskError.self) { try JournalSocket.open(path: "/nonexistent/journal.sock") }
        #expect(throws: BGTaskError.self) { try JournalSocket.open(path: "/dev/null") }
    }

    // MARK: A real host

    @Test func aHostUnderTheJournalLogsItsLaunchesAsFields() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let sink = try JournalSink(path: scratch.url.appendingPathComponent("journal.sock").path)
        let host = try HostProcess(scratch: scratch)
        host.environment = ["BGTASK_LOG_FORMAT": "journal", "BGTASK_JOURNAL_SOCKET": sink.path, "BGTASK_LOG_LEVEL": nil]
        try host.install(TestBundle.feed.library, info: TestBundle.feed.info, as: TestBundle.feed.name)
        try host.start()
        defer { host.stop() }
        // Read as journald does, while the host runs: a datagram socket's queue is short
        // (net.unix.max_dgram_qlen, 10 by default), and the host drops what does not fit.
        func received(_ message: String) -> ([[Field]]) -> Bool { { $0.contains { $0[field: "MESSAGE"] == message } } }
        try sink.read(until: received("host started"))

        let launched = try host.cli(["simulate-launch", "com.example.feed.refresh", "--force", "--type", "refresh", "--json"])
        try #require(launched.status == 0, "\(launched.stderr)")
        let answer = try JSONSerialization.jsonObject(with: Data(launched.stdout.utf8)) as? [String: Any]
        let launchID = try #require(answer?["launch_id"] as? String)
        _ = try host.waitForHistory(count: 1)
        try sink.read(until: received("launch ended"))
        #expect(host.stop() == 0)

        let entries = try sink.read(until: received("host stopped"))
        let messages = entries.compactMap { $0[field: "MESSAGE"] }
        for entry in entries {
            #expect(entry[field: "SYSLOG_IDENTIFIER"] == "bgtask")
            #expect(entry[field: "PRIORITY"].flatMap(Int.init).map { (2...7).contains($0) } == true)
            #expect(entry[field: "CODE_LINE"].flatMap(Int.init) != nil)
            #expect(entry[field: "CODE_FILE"]?.hasSuffix(".swift") == true)
            #expect(entry[field: "CODE_FUNC"]?.isEmpty == false)
        }
        #expect(messages.contains { $0.hasPrefix("bgtask ") && $0.contains(" host: plugins ") }, "\(messages)")
        #expect(messages.contains("host started"), "\(messages)")
        let loaded = try #require(entries.first { $0[field: "MESSAGE"] == "bundle loaded" }, "\(messages)")
        #expect(loaded[field: "BUNDLE_ID"] == "com.example.feed")
        let launching = try #require(entries.first { $0[field: "MESSAGE"] == "launching" }, "\(messages)")
        #expect(launching[field: "PRIORITY"] == "6")
        #expect(launching[field: "LAUNCH_ID"] == launchID)
        #expect(launching[field: "BUNDLE_ID"] == "com.example.feed")
        #expect(launching[field: "TASKS"] == "com.example.feed.refresh")
        #expect(launching[field: "CODE_FILE"]?.hasSuffix("LaunchCoordinator.swift") == true)
        let ended = try #require(entries.first { $0[field: "MESSAGE"] == "launch ended" }, "\(messages)")
        #expect(ended[field: "LAUNCH_ID"] == launchID)
        #expect(ended[field: "TERMINATION"] == "suspended")
        #expect(entries.contains { $0[field: "MESSAGE"] == "signal received: shutting down" && $0[field: "SIGNAL"] == "\(SIGTERM)" }, "\(messages)")
        // Nothing of it as text on stderr.
        let stderr = (try? String(contentsOfFile: host.logPath, encoding: .utf8)) ?? ""
        #expect(!stderr.contains("launching"), "\(stderr)")
    }

    @Test func aHostWithoutTheJournalSocketLogsToStderrAfterOneWarning() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        host.environment = ["BGTASK_LOG_FORMAT": "journal", "BGTASK_JOURNAL_SOCKET": scratch.url.appendingPathComponent("none.sock").path, "BGTASK_LOG_LEVEL": nil]
        try host.start()
        #expect(host.stop() == 0)
        let stderr = try String(contentsOfFile: host.logPath, encoding: .utf8)
        #expect(stderr.components(separatedBy: "cannot log to the journal").count == 2, "\(stderr)")
        #expect(stderr.contains("none.sock"), "\(stderr)")
        #expect(stderr.contains("host started"), "\(stderr)")
    }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A connected `socketpair(AF_UNIX, SOCK_STREAM)`. Either end may be closed early with
/// `closeA()`/`closeB()`; `close()` closes whatever is still open.
private final class StreamPair: @unchecked Sendable {
    private(set) var a: Int32
    private(set) var b: Int32

    init() throws {
        var fds: [Int32] = [-1, -1]
        let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        try #require(socketpair(AF_UNIX, kind, 0, &fds) == 0, "socketpair: \(String(cString: strerror(errno)))")
        a = fds[0]
        b = fds[1]
    }

    func closeA() { if a >= 0 { _ = Glibc.close(a); a = -1 } }
    func closeB() { if b >= 0 { _ = Glibc.close(b); b = -1 } }
    func close() { closeA(); closeB() }

    /// Writes raw bytes to `a` (small amounts: they fit in the socket buffer).
    func rawWrite(_ bytes: [UInt8]) {
        let sent = bytes.withUnsafeBytes { send(a, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        #expect(sent == bytes.count)
    }

    /// What is waiting on `b` right now, without blocking.
    func pending(on fd: Int32) -> [UInt8] {
        var result: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n <= 0 { return result }
            result += buffer[0..<n]
        }
    }
}

/// Runs `body` on a new thread; `wait()` joins it and returns what it returned (checked on the
/// test's own thread, where Swift Testing attributes failures to the test).
private final class Background<T>: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private var result: T?

    init(_ body: @escaping @Sendable () -> T) {
        let thread = Thread { [self] in
            result = body()
            done.signal()
        }
        thread.start()
    }

    @discardableResult
    func wait() -> T {
        done.wait()
        return result!
    }
}

/// Writes one frame, returning the error instead of throwing it.
private func writeFrame(_ payload: Data, to fd: Int32) -> ControlFrame.FrameError? {
    do throws(ControlFrame.FrameError) {
        try ControlFrame.write(payload, to: fd)
        return nil
    } catch {
        return error
    }
}

private func header(magic: (UInt8, UInt8) = (0x42, 0x47), version: UInt8 = 1, flags: UInt8 = 0, length: UInt32) -> [UInt8] {
    [magic.0, magic.1, version, flags,
     UInt8(length >> 24), UInt8((length >> 16) & 0xff), UInt8((length >> 8) & 0xff), UInt8(length & 0xff)]
}

private func payload(_ count: Int, seed: UInt8 = 0) -> Data {
    Data((0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed)) })
}

@Suite struct ControlFrameTests {
    // MARK: Encoding and header validation

    @Test func encodeWritesTheHeaderThenThePayload() throws {
        let frame = try ControlFrame.encode(Data("{\"a\":1}".utf8))
        #expect(Array(frame) == [0x42, 0x47, 1, 0, 0, 0, 0, 7] + Array("{\"a\":1}".utf8))
        #expect(Array(try ControlFrame.encode(Data())) == [0x42, 0x47, 1, 0, 0, 0, 0, 0])
        let big = try ControlFrame.encode(payload(0x010203))
        #expect(Array(big.prefix(8)) == [0x42, 0x47, 1, 0, 0, 0x01, 0x02, 0x03])
        #expect(big.count == 8 + 0x010203)
    }

    @Test func encodeRefusesOversizedPayloads() throws {
        _ = try ControlFrame.encode(payload(ControlFrame.maximumPayload))
        let error = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.encode(payload(ControlFrame.maximumPayload + 1))
        }
        #expect(error?.code == .oversized)
        #expect(error?.description.contains("\(ControlFrame.maximumPayload + 1)") == true, "\(error!)")
        #expect(error?.description.contains("\(ControlFrame.maximumPayload)") == true)
    }

    @Test func payloadLengthOfValidHeaders() throws {
        #expect(try ControlFrame.payloadLength(header: header(length: 0)) == 0)
        #expect(try ControlFrame.payloadLength(header: header(length: 0x1234)) == 0x1234)
        #expect(try ControlFrame.payloadLength(header: header(length: UInt32(ControlFrame.maximumPayload))) == ControlFrame.maximumPayload)
    }

    @Test func payloadLengthRejectsBadHeaders() {
        let magic = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.payloadLength(header: Array("ABCDEFGH".utf8))
        }
        #expect(magic?.code == .badMagic)
        #expect(magic?.description == "frame header has magic 0x4142, expected 0x4247 (\"BG\")")

        let version = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.payloadLength(header: header(version: 2, length: 4))
        }
        #expect(version?.code == .unsupportedVersion)
        #expect(version?.description.contains("version 2") == true, "\(version!)")
        #expect(version?.description.contains("version 1") == true, "\(version!)")

        let oversized = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.payloadLength(header: header(length: UInt32(ControlFrame.maximumPayload + 1)))
        }
        #expect(oversized?.code == .oversized)
        #expect(oversized?.description.contains("\(ControlFrame.maximumPayload + 1)") == true, "\(oversized!)")
        #expect(oversized?.description.contains("limit of \(ControlFrame.maximumPayload)") == true, "\(oversized!)")

        let huge = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.payloadLength(header: header(length: .max))
        }
        #expect(huge?.code == .oversized)
        #expect(huge?.description.contains("\(UInt32.max)") == true)

        let flags = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.payloadLength(header: header(flags: 0x80, length: 4))
        }
        #expect(flags?.code == .unsupportedVersion)
        #expect(flags?.description.contains("flags 0x80") == true, "\(flags!)")

        let short = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.payloadLength(header: [0x42, 0x47, 1])
        }
        #expect(short?.code == .truncated)
    }

    // MARK: Round trips over a real socketpair

    @Test(arguments: [0, 1, 13, 4096, 65_537])
    func roundTrip(_ size: Int) throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let sent = payload(size, seed: 7)
        let writer = Background { [a = pair.a] in writeFrame(sent, to: a) }
        let received = try ControlFrame.read(from: pair.b)
        #expect(writer.wait() == nil)
        #expect(received == sent)
        #expect(pair.pending(on: pair.b).isEmpty, "nothing past the frame")
    }

    @Test func roundTripOfExactlyTheMaximumPayload() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let sent = payload(ControlFrame.maximumPayload, seed: 3)
        // A megabyte does not fit in the socket buffer: the writer blocks until the reader reads.
        let writer = Background { [a = pair.a] in writeFrame(sent, to: a) }
        let received = try ControlFrame.read(from: pair.b)
        #expect(writer.wait() == nil)
        #expect(received?.count == ControlFrame.maximumPayload)
        #expect(received == sent)
    }

    @Test func severalFramesBackToBack() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let messages = [Data("{\"op\":\"list\"}".utf8), Data(), Data("{\"op\":\"why\",\"id\":\"com.example\"}".utf8), payload(3000)]
        for message in messages { try ControlFrame.write(message, to: pair.a) }
        pair.closeA()
        for message in messages {
            #expect(try ControlFrame.read(from: pair.b) == message)
        }
        #expect(try ControlFrame.read(from: pair.b) == nil, "clean end of stream after the last frame")
    }

    @Test func frameSplitIntoOneByteWrites() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let sent = Data("{\"op\":\"submit\",\"identifier\":\"com.example.feed.refresh\"}".utf8)
        let bytes = Array(try ControlFrame.encode(sent)) + Array(try ControlFrame.encode(Data("{}".utf8)))
        let writer = Background { [a = pair.a] in
            var written = 0
            for byte in bytes {
                var one = byte
                if send(a, &one, 1, Int32(MSG_NOSIGNAL)) == 1 { written += 1 }
                usleep(200)
            }
            return written
        }
        #expect(try ControlFrame.read(from: pair.b) == sent)
        #expect(try ControlFrame.read(from: pair.b) == Data("{}".utf8))
        #expect(writer.wait() == bytes.count)
    }

    // MARK: Bad frames

    @Test func garbageHeader() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.rawWrite(Array("ABCDEFGH{}".utf8))
        let error = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(error?.code == .badMagic)
        #expect(error?.description.contains("0x4142") == true)
        #expect(error?.description.contains("0x4247") == true)
        #expect(pair.pending(on: pair.b) == Array("{}".utf8), "exactly the header was consumed")
    }

    @Test func wrongVersion() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.rawWrite(header(version: 9, length: 2) + Array("{}".utf8))
        let error = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(error?.code == .unsupportedVersion)
        #expect(error?.description.contains("9") == true)
        #expect(error?.description.contains("1") == true)
    }

    @Test func nonZeroFlags() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.rawWrite(header(flags: 1, length: 2) + Array("{}".utf8))
        let error = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(error?.code == .unsupportedVersion)
        #expect(error?.description.contains("flags") == true)
    }

    @Test func oversizedLengthIsRejectedBeforeReadingThePayload() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        // The writer stays open and sends only a few bytes of the announced 4 GiB: a reader that
        // tried to allocate or read the payload would block or run out of memory here.
        pair.rawWrite(header(length: .max) + Array("tail".utf8))
        let error = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(error?.code == .oversized)
        #expect(error?.description.contains("\(UInt32.max)") == true, "\(error!)")
        #expect(error?.description.contains("\(ControlFrame.maximumPayload)") == true, "\(error!)")
        #expect(pair.pending(on: pair.b) == Array("tail".utf8), "the payload was not read")

        pair.rawWrite(header(length: UInt32(ControlFrame.maximumPayload + 1)))
        let justOver = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(justOver?.code == .oversized)
    }

    @Test func truncatedHeader() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.rawWrite([0x42, 0x47, 1])
        pair.closeA()
        let error = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(error?.code == .truncated)
        #expect(error?.description.contains("3 of 8") == true, "\(error!)")
    }

    @Test func truncatedPayload() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.rawWrite(header(length: 10) + Array("{\"a\"".utf8))
        pair.closeA()
        let error = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(error?.code == .truncated)
        #expect(error?.description.contains("4 of 10") == true, "\(error!)")
    }

    @Test func peerClosedBeforeAnything() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.closeA()
        #expect(try ControlFrame.read(from: pair.b) == nil)
        #expect(try ControlFrame.read(from: pair.b) == nil, "still nil when asked again")
    }

    @Test func receiveTimeoutEndsTheReadInsteadOfWaitingForever() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        #expect(setsockopt(pair.b, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0)
        let idle = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(idle?.code == .closed)
        #expect(idle?.description.contains("timed out after 0 of 8 bytes of a frame header") == true, "\(idle!)")
        pair.rawWrite(header(length: 100) + Array("{\"op\"".utf8))
        let stalled = #expect(throws: ControlFrame.FrameError.self) { try ControlFrame.read(from: pair.b) }
        #expect(stalled?.code == .closed)
        #expect(stalled?.description.contains("after 5 of 100 bytes of a frame payload") == true, "\(stalled!)")
    }

    @Test func sendTimeoutEndsTheWriteInsteadOfWaitingForever() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        #expect(setsockopt(pair.a, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0)
        // Nobody reads b: a megabyte cannot fit in the socket buffers.
        let error = writeFrame(payload(ControlFrame.maximumPayload), to: pair.a)
        #expect(error?.code == .closed)
        #expect(error?.description.contains("timed out") == true, "\(String(describing: error))")
    }

    @Test func writingToAClosedPeerIsClosedNotSIGPIPE() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        pair.closeB()
        // Without MSG_NOSIGNAL this would raise SIGPIPE and kill the test process.
        let error = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.write(Data("{\"op\":\"list\"}".utf8), to: pair.a)
        }
        #expect(error?.code == .closed)
        // And a large frame the peer stops reading halfway through.
        let other = try StreamPair()
        defer { other.close() }
        // The reader takes the first kilobyte, then closes while the writer is blocked on a
        // full socket buffer.
        let reader = Background { [other] in
            var buffer = [UInt8](repeating: 0, count: 1000)
            let n = buffer.withUnsafeMutableBytes { recv(other.b, $0.baseAddress, $0.count, Int32(MSG_WAITALL)) }
            other.closeB()
            return n
        }
        let midway = writeFrame(payload(ControlFrame.maximumPayload), to: other.a)
        #expect(reader.wait() == 1000)
        #expect(midway?.code == .closed)
        #expect(midway?.description.contains("peer closed") == true, "\(midway!)")
    }

    @Test func writeRefusesOversizedPayloadWithoutWritingAnything() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let error = #expect(throws: ControlFrame.FrameError.self) {
            try ControlFrame.write(payload(ControlFrame.maximumPayload + 1), to: pair.a)
        }
        #expect(error?.code == .oversized)
        #expect(pair.pending(on: pair.b).isEmpty)
    }

    // MARK: The buffered reader (pipelined frames)

    @Test func readerTakesPipelinedFramesFromOneReadAndNeverWaitsInPoll() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let messages = [Data("{\"verb\":\"submit\"}".utf8), Data(), payload(3000, seed: 1), Data("{}".utf8)]
        try ControlFrame.write(payloads: messages, to: pair.a)
        var reader = ControlFrameReader(fd: pair.b)
        #expect(try reader.next() == messages[0])
        // The rest arrived with the first read: handed out without touching the socket.
        #expect(pair.pending(on: pair.b).isEmpty, "the reader took every frame in one read")
        for message in messages.dropFirst() { #expect(try reader.poll() == .frame(message)) }
        // Nothing more: pending at once (the writer is still open, a blocking read would hang).
        #expect(try reader.poll() == .pending)
        // Half a frame stays buffered for `next`, which waits for the rest.
        let frame = Array(try ControlFrame.encode(Data("{\"verb\":\"status\"}".utf8)))
        pair.rawWrite(Array(frame.prefix(5)))
        #expect(try reader.poll() == .pending)
        let writer = Background { [a = pair.a] in
            usleep(20_000)
            return frame.dropFirst(5).withUnsafeBytes { send(a, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
        #expect(try reader.next() == Data("{\"verb\":\"status\"}".utf8))
        #expect(writer.wait() == frame.count - 5)
        pair.closeA()
        #expect(try reader.next() == nil, "clean end of stream between frames")
    }

    @Test func readerGrowsForTheMaximumPayloadAndSurvivesOneByteWrites() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        let big = payload(ControlFrame.maximumPayload, seed: 9)
        let writer = Background { [a = pair.a] in writeFrame(big, to: a) }
        var reader = ControlFrameReader(fd: pair.b)
        #expect(try reader.next() == big)
        #expect(writer.wait() == nil)

        let small = Data("{\"verb\":\"pending\"}".utf8)
        let bytes = Array(try ControlFrame.encode(small)) + Array(try ControlFrame.encode(Data("{}".utf8)))
        let trickle = Background { [a = pair.a] in
            for byte in bytes {
                var one = byte
                _ = send(a, &one, 1, Int32(MSG_NOSIGNAL))
                usleep(200)
            }
        }
        #expect(try reader.next() == small)
        #expect(try reader.next() == Data("{}".utf8))
        trickle.wait()
    }

    @Test func readerReportsBadFramesLikeRead() throws {
        for (bytes, code, words) in [
            (Array("ABCDEFGH{}".utf8), ControlFrame.FrameError.Code.badMagic, "0x4142"),
            (header(length: .max) + Array("tail".utf8), .oversized, "\(UInt32.max)"),
            ([0x42, 0x47, 1], .truncated, "3 of 8"),
            (header(length: 10) + Array("{\"a\"".utf8), .truncated, "4 of 10"),
        ] {
            let pair = try StreamPair()
            defer { pair.close() }
            pair.rawWrite(bytes)
            pair.closeA()
            var reader = ControlFrameReader(fd: pair.b)
            let error = #expect(throws: ControlFrame.FrameError.self) { try reader.next() }
            #expect(error?.code == code)
            #expect(error?.description.contains(words) == true, "\(error!)")
        }
        // A good frame, then garbage: the good one is read; the garbage is an error after it.
        let pair = try StreamPair()
        defer { pair.close() }
        pair.rawWrite(Array(try ControlFrame.encode(Data("{}".utf8))) + Array("XXXXXXXX".utf8))
        var reader = ControlFrameReader(fd: pair.b)
        #expect(try reader.next() == Data("{}".utf8))
        let error = #expect(throws: ControlFrame.FrameError.self) { try reader.poll() }
        #expect(error?.code == .badMagic)
    }

    @Test func readerReceiveTimeout() throws {
        let pair = try StreamPair()
        defer { pair.close() }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        #expect(setsockopt(pair.b, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0)
        var reader = ControlFrameReader(fd: pair.b)
        pair.rawWrite(header(length: 100) + Array("{\"op\"".utf8))
        let stalled = #expect(throws: ControlFrame.FrameError.self) { try reader.next() }
        #expect(stalled?.code == .closed)
        #expect(stalled?.description.contains("timed out after 5 of 100 bytes of a frame payload") == true, "\(stalled!)")
    }
}

/// `ControlRequest`'s own decoder (it reads only the keys a request has).
@Suite struct ControlRequestDecodingTests {
    func decode(_ json: String) throws -> ControlRequest {
        try JSONDecoder().decode(ControlRequest.self, from: Data(json.utf8))
    }

    @Test func everyKeyRoundTrips() throws {
        let request = ControlRequest(
            verb: "submit", app: "com.example.feed", identifier: "com.example.feed.refresh",
            request: TaskRequest(kind: .processing, identifier: "com.example.feed.refresh", earliestBeginDate: 12.5,
                                     requiresNetworkConnectivity: true, requiresExternalPower: false),
            force: true, wait: false, device: ["power": "on"], advance: 3.5, limit: 7, event: "{}", delay: 60, after: "a.b")
        #expect(try JSONDecoder().decode(ControlRequest.self, from: JSONEncoder().encode(request)) == request)
    }

    @Test func absentNullAndUnknownKeys() throws {
        let request = try decode(#"{"verb":"apps","app":null,"limit":5,"color":"blue"}"#)
        #expect(request == ControlRequest(verb: "apps", limit: 5))
    }

    @Test func aMissingVerbOrAWrongTypeIsAnError() throws {
        #expect(throws: DecodingError.self) { try decode(#"{"app":"com.example.feed"}"#) }
        #expect(throws: DecodingError.self) { try decode(#"{"verb":null}"#) }
        #expect(throws: DecodingError.self) { try decode(#"{"verb":"apps","limit":"five"}"#) }
        #expect(throws: DecodingError.self) { try decode(#"{"verb":"submit","request":{"kind":"refresh"}}"#) }
    }
}

/// The control server's fast path for requests: whatever it accepts it decodes exactly as
/// `JSONDecoder` does; everything else it leaves to `JSONDecoder` (nil).
@Suite struct ControlRequestParserTests {
    func jsonDecoder(_ json: String) -> ControlRequest? {
        try? JSONDecoder().decode(ControlRequest.self, from: Data(json.utf8))
    }

    @Test func everyRequestTheClientEncodesIsReadAsJSONDecoderReadsIt() throws {
        var generator = SystemRandomNumberGenerator()
        let kinds = TaskKind.allCases
        for i in 0..<2_000 {
            func maybe<T>(_ value: T) -> T? { Bool.random(using: &generator) ? value : nil }
            let task = TaskRequest(
                kind: kinds[i % kinds.count], identifier: "com.example.app\(i).task-\(i % 7)",
                earliestBeginDate: maybe(Double.random(in: -1e10...1e10, using: &generator)),
                requiresNetworkConnectivity: .random(using: &generator), requiresExternalPower: .random(using: &generator),
                protectionType: .random(in: .min ... .max, using: &generator), title: maybe("Export é \(i)"), subtitle: maybe(""),
                strategyFail: .random(using: &generator), requiredResources: .random(in: 0 ... .max, using: &generator))
            let request = ControlRequest(
                verb: ControlRequest.verbs[i % ControlRequest.verbs.count], app: maybe("com.example.app\(i)"),
                identifier: maybe("id\(i)"), request: maybe(task), force: maybe(.random(using: &generator)),
                wait: maybe(false), device: maybe(["power": "on", "app": "com.example.a\(i)"]),
                advance: maybe(Double(i) * 0.25), limit: maybe(Int.random(in: -5...Int.max, using: &generator)),
                event: maybe("{}"), delay: maybe(-Double(i) / 3), after: maybe("com.example.app\(i)"))
            let data = try JSONEncoder.control.encode(request)
            let parsed = try #require(ControlRequestParser.parse(data), "declined: \(String(decoding: data, as: UTF8.self))")
            #expect(parsed == request, "\(String(decoding: data, as: UTF8.self))")
            #expect(parsed == (try JSONDecoder.control.decode(ControlRequest.self, from: data)))
        }
    }

    @Test(arguments: [
        #"{"verb":"status"}"#,
        #" { "verb" : "apps" , "limit" : 5 , "after" : null } "#,
        "{\n\t\"verb\": \"submit\", \"app\": \"a.b\", \"request\": {\"kind\": \"refresh\", \"identifier\": \"a.b.c\", \"requiresNetworkConnectivity\": false, \"requiresExternalPower\": true, \"protectionType\": -1, \"strategyFail\": false, \"requiredResources\": 3, \"title\": null, \"earliestBeginDate\": 1.5e9}}",
        #"{"verb":"clock","advance":-0.5e-3}"#,
        #"{"verb":"device","device":{}}"#,
        #"{"verb":"x","app":"ünïcödé ✓"}"#,
        #"{"verb":"apps","limit":-9223372036854775808}"#,
        #"{"verb":"apps","limit":9223372036854775807}"#,
        #"{"verb":"clock","advance":-0}"#,
        #"{"verb":"clock","advance":123456789012345678}"#,
        #"{"verb":"clock","advance":0.1}"#,
    ])
    func accepted(_ json: String) throws {
        let parsed = try #require(ControlRequestParser.parse(Data(json.utf8)))
        let expected = try #require(jsonDecoder(json))
        #expect(parsed == expected)
        #expect(parsed.advance?.sign == expected.advance?.sign)
    }

    @Test(arguments: [
        "", "[]", "null", #""verb""#, "{", #"{"verb":"status"} x"#, #"{"verb":"status",}"#,
        #"{"app":"a.b"}"#, #"{"verb":null}"#, #"{"verb":"a\"b"}"#, #"{"verb":"status","app":"a\nb"}"#,
        #"{"verb":"status","verb":"apps"}"#, #"{"verb":"status","color":"blue"}"#,
        #"{"verb":"apps","limit":5.0}"#, #"{"verb":"apps","limit":05}"#, #"{"verb":"apps","limit":"5"}"#,
        #"{"verb":"apps","limit":99999999999999999999}"#, #"{"verb":"apps","limit":9223372036854775808}"#,
        #"{"verb":"apps","limit":-9223372036854775809}"#, #"{"verb":"clock","advance":1e999}"#,
        #"{"verb":"clock","advance":.5}"#, #"{"verb":"clock","advance":1.}"#, #"{"verb":"apps","force":1}"#,
        #"{"verb":"submit","request":{"kind":"refresh","identifier":"a.b.c"}}"#,
        #"{"verb":"submit","request":{"kind":"sometimes","identifier":"a","requiresNetworkConnectivity":false,"requiresExternalPower":false,"protectionType":0,"strategyFail":false,"requiredResources":0}}"#,
        #"{"verb":"submit","request":{"kind":"refresh","identifier":"a","requiresNetworkConnectivity":false,"requiresExternalPower":false,"protectionType":0,"strategyFail":false,"requiredResources":-1}}"#,
        #"{"verb":"device","device":{"power":1}}"#,
    ])
    func declined(_ json: String) {
        #expect(ControlRequestParser.parse(Data(json.utf8)) == nil)
    }

    @Test func invalidUTF8IsDeclined() {
        #expect(ControlRequestParser.parse(Data([0x7B, 0x22, 0x76, 0x65, 0x72, 0x62, 0x22, 0x3A, 0x22, 0xFF, 0x22, 0x7D])) == nil)
    }
}

@Suite struct BareOKResponseTests {
    /// The server sends a bare success as fixed bytes: they must be what the encoder writes,
    /// and `isBareOK` must know every field (a new one fails the count below until it does).
    @Test func theFixedBytesAreTheEncodersAndEveryFieldIsChecked() throws {
        #expect(try JSONEncoder.control.encode(ControlResponse()) == ControlFrame.bareOK)
        #expect(ControlResponse().isBareOK)
        #expect(!ControlResponse(ok: false).isBareOK)
        #expect(!ControlResponse.failure(.badRequest, "y").isBareOK)
        var removed = ControlResponse()
        removed.removed = 0
        #expect(!removed.isBareOK)
        var paged = ControlResponse()
        paged.next = "a"
        #expect(!paged.isBareOK)
        var truncated = ControlResponse()
        (truncated.truncated, truncated.omitted) = (true, 1)
        #expect(!truncated.isBareOK)
        var pushed = ControlResponse()
        pushed.deviceToken = "00"
        #expect(!pushed.isBareOK)
        var refused = ControlResponse()
        refused.apnsReason = "BadPriority"
        #expect(!refused.isBareOK)
        var listed = ControlResponse()
        listed.notifications = []
        #expect(!listed.isBareOK)
        var apps = ControlResponse()
        apps.notificationApps = []
        #expect(!apps.isBareOK)
        var transfers = ControlResponse()
        transfers.transfers = []
        #expect(!transfers.isBareOK)
        var metrics = ControlResponse()
        metrics.metrics = []
        #expect(!metrics.isBareOK)
        var running = ControlResponse()
        running.running = []
        #expect(!running.isBareOK)
        #expect(Mirror(reflecting: ControlResponse()).children.count == 25, "a new ControlResponse field: add it to isBareOK")
    }
}

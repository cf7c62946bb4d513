#if canImport(Glibc)
import Glibc
#endif
import Foundation
import _BGTaskSystemShims

/// Frames on the control socket: an 8-byte header — magic "BG" (0x42 0x47), version (1 byte,
/// currently 1), flags (1 byte, 0), payload length (4 bytes, big-endian) — then a JSON payload
/// of at most `maximumPayload` bytes.
public enum ControlFrame {
    /// The answer `{"ok":true}` as its exact bytes: written without an encoder, recognised without a decoder.
    package static let bareOK = Data(#"{"ok":true}"#.utf8)
    public static let version: UInt8 = 1
    public static let headerSize = 8
    public static let maximumPayload = 1 << 20

    public struct FrameError: Error, CustomStringConvertible, Equatable, Sendable {
        /// `timedOut`: a request not complete by its deadline (`ControlFrameReader.requestTimeout`).
        public enum Code: String, Sendable { case badMagic, unsupportedVersion, oversized, truncated, malformedPayload, closed, timedOut }
        public var code: Code
        public var description: String

        /// The memberwise initializer, for the modules above this one.
        package init(code: Code, description: String) {
            self.code = code
            self.description = description
        }
    }

    /// Header + payload.
    public static func encode(_ payload: Data) throws(FrameError) -> Data {
        guard payload.count <= maximumPayload else {
            throw FrameError(code: .oversized, description:
                "frame payload of \(payload.count) bytes is over the limit of \(maximumPayload) bytes")
        }
        var frame = Data(capacity: headerSize + payload.count)
        frame.append(contentsOf: header(length: payload.count))
        frame.append(payload)
        return frame
    }

    /// "BG" as a big-endian 16-bit number.
    package static let magic: UInt16 = 0x4247

    /// The header of a frame whose payload is `length` bytes (≤ `maximumPayload`).
    package static func header(length: Int) -> [UInt8] {
        let n = UInt32(length)
        return [UInt8(magic >> 8), UInt8(magic & 0xff), version, 0,
                UInt8(n >> 24), UInt8((n >> 16) & 0xff), UInt8((n >> 8) & 0xff), UInt8(n & 0xff)]
    }

    /// Validates a header; returns the payload length.
    public static func payloadLength(header: [UInt8]) throws(FrameError) -> Int {
        guard header.count >= headerSize else {
            throw FrameError(code: .truncated, description:
                "frame header is \(header.count) bytes, expected \(headerSize)")
        }
        let found = UInt16(header[0]) << 8 | UInt16(header[1])
        guard found == magic else {
            throw FrameError(code: .badMagic, description:
                "frame header has magic \(hex(found, digits: 4)), expected \(hex(magic, digits: 4)) (\"BG\")")
        }
        guard header[2] == version else {
            throw FrameError(code: .unsupportedVersion, description:
                "frame header has version \(header[2]), expected version \(version) (the only one this host speaks)")
        }
        // No flags are defined in version 1: a set flag means the peer speaks something else.
        guard header[3] == 0 else {
            throw FrameError(code: .unsupportedVersion, description:
                "frame header has flags \(hex(header[3], digits: 2)), expected 0x00 (version \(version) defines no flags)")
        }
        let length = Int(header[4]) << 24 | Int(header[5]) << 16 | Int(header[6]) << 8 | Int(header[7])
        guard length <= maximumPayload else {
            throw FrameError(code: .oversized, description:
                "frame header declares a payload of \(length) bytes, over the limit of \(maximumPayload) bytes")
        }
        return length
    }

    package static func hex<T: BinaryInteger>(_ value: T, digits: Int) -> String {
        let text = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, digits - text.count)) + text
    }

    /// Writes one frame to a blocking socket (all bytes, retrying EINTR and short writes).
    public static func write(_ payload: Data, to fd: Int32) throws(FrameError) {
        try send(try encode(payload), to: fd, what: "a frame (\(payload.count)-byte payload)")
    }

    /// Writes several frames with one `send` (answers to pipelined requests). With `deadline`
    /// (CLOCK_MONOTONIC nanoseconds), a peer still reading when it passes is given up on, however
    /// slowly it keeps reading (each `send` is bounded by the socket's SO_SNDTIMEO).
    public static func write(payloads: [Data], to fd: Int32, deadline: UInt64? = nil) throws(FrameError) {
        var frames = Data(capacity: payloads.reduce(0) { $0 + headerSize + $1.count })
        for payload in payloads { frames.append(try encode(payload)) }
        try send(frames, to: fd, what: "\(payloads.count) frames (\(frames.count) bytes)", deadline: deadline)
    }

    package static func send(_ frame: Data, to fd: Int32, what: String, deadline: UInt64? = nil) throws(FrameError) {
        var failure: FrameError?
        frame.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) in
            var offset = 0
            while offset < buffer.count {
                if offset > 0, let deadline, bgtask_monotonic_ns() > deadline {
                    failure = FrameError(code: .closed, description:
                        "peer reads the control socket too slowly: \(offset) of \(buffer.count) bytes of \(what) taken by the answer's deadline")
                    return
                }
                // MSG_NOSIGNAL: a closed peer is EPIPE, not a SIGPIPE that kills the process.
                let sent = Glibc.send(fd, buffer.baseAddress! + offset, buffer.count - offset, Int32(MSG_NOSIGNAL))
                if sent >= 0 {
                    offset += sent
                    continue
                }
                let error = errno
                switch error {
                case EINTR:
                    continue
                case EAGAIN, EWOULDBLOCK:
                    // SO_SNDTIMEO expired (or a non-blocking descriptor): the peer stopped reading.
                    failure = FrameError(code: .closed, description:
                        "peer stopped reading the control socket: send timed out after \(offset) of \(buffer.count) bytes of \(what)")
                case EPIPE, ECONNRESET:
                    failure = FrameError(code: .closed, description:
                        "peer closed the control socket after \(offset) of \(buffer.count) bytes of \(what) were written: \(describe(error))")
                default:
                    failure = FrameError(code: .closed, description:
                        "cannot write \(what) to descriptor \(fd) after \(offset) of \(buffer.count) bytes: send: \(describe(error))")
                }
                return
            }
        }
        if let failure { throw failure }
    }

    package static func describe(_ error: Int32) -> String { String(cString: strerror(error)) }

    /// Outcome of filling a buffer from a descriptor.
    package enum Fill {
        case complete
        /// End of stream after this many bytes.
        case ended(Int)
        /// A read error (errno) after this many bytes.
        case failed(Int, Int32)
    }

    /// Reads exactly `buffer.count` bytes (fewer only at end of stream or on an error).
    package static func fill(_ buffer: UnsafeMutableRawBufferPointer, from fd: Int32) -> Fill {
        var offset = 0
        while offset < buffer.count {
            let count = Glibc.read(fd, buffer.baseAddress! + offset, buffer.count - offset)
            if count > 0 {
                offset += count
            } else if count == 0 {
                return .ended(offset)
            } else {
                let error = errno
                if error == EINTR { continue }
                // EAGAIN included: SO_RCVTIMEO expired (the owner's bound on an idle or stalled
                // peer), which must not be waited out here.
                return .failed(offset, error)
            }
        }
        return .complete
    }

    /// Reads one frame from a blocking socket. nil at a clean end of stream before a header;
    /// `truncated` when the stream ends inside a frame; other codes as named. Never reads past
    /// the frame, never allocates more than `maximumPayload`.
    public static func read(from fd: Int32) throws(FrameError) -> Data? {
        var header = [UInt8](repeating: 0, count: headerSize)
        switch header.withUnsafeMutableBytes({ fill($0, from: fd) }) {
        case .complete:
            break
        case .ended(0):
            return nil
        case .ended(let count):
            throw FrameError(code: .truncated, description:
                "stream ended inside a frame header: \(count) of \(headerSize) bytes (\(hex(header.prefix(count))))")
        case .failed(let count, let error):
            throw readFailure(error, "after \(count) of \(headerSize) bytes of a frame header")
        }
        let length = try payloadLength(header: header)
        guard length > 0 else { return Data() }
        var payload = Data(count: length)
        switch payload.withUnsafeMutableBytes({ fill($0, from: fd) }) {
        case .complete:
            return payload
        case .ended(let count):
            throw FrameError(code: .truncated, description:
                "stream ended inside a frame payload: \(count) of \(length) bytes")
        case .failed(let count, let error):
            throw readFailure(error, "after \(count) of \(length) bytes of a frame payload")
        }
    }

    package static func readFailure(_ error: Int32, _ position: String) -> FrameError {
        let detail = switch error {
        case ECONNRESET: "peer reset the control socket \(position)"
        case EAGAIN, EWOULDBLOCK: "control socket receive timed out \(position)"
        default: "cannot read the control socket \(position): read: \(describe(error))"
        }
        return FrameError(code: .closed, description: detail)
    }

    package static func hex(_ bytes: ArraySlice<UInt8>) -> String {
        bytes.map { hex($0, digits: 2) }.joined(separator: " ")
    }
}

/// Reads frames from a stream through a buffer, so that frames a peer pipelines (sends without
/// waiting for each answer) arrive in one read and can be handled together. The same checks and
/// errors as `ControlFrame.read`.
public struct ControlFrameReader {
    public let fd: Int32
    /// How long `next` waits for the first byte of a frame; then the stream counts as ended
    /// (`closed`: an idle peer). Nil: for ever (a client waiting for its answer).
    public var idleTimeout: Duration?
    /// How long a frame may take from its first byte to its last; then `next` throws `timedOut`
    /// (a peer sending one byte a second must not hold its connection for ever). Nil: no bound.
    public var requestTimeout: Duration?
    /// Received bytes live in `storage[start..<end]`; the rest is room for the next read.
    private var storage = [UInt8](repeating: 0, count: ControlFrameReader.chunk)
    private var start = 0
    private var end = 0
    /// When the first buffered byte of the frame being read arrived (nil: nothing buffered).
    private var frameStartNs: UInt64?
    package static let chunk = 64 * 1024

    public init(fd: Int32, idleTimeout: Duration? = nil, requestTimeout: Duration? = nil) {
        self.fd = fd
        self.idleTimeout = idleTimeout
        self.requestTimeout = requestTimeout
    }

    private var available: Int { end - start }

    /// The next frame's payload, waiting for it; nil when the stream ends between frames.
    public mutating func next() throws(ControlFrame.FrameError) -> Data? {
        let idleDeadline = idleTimeout.map { bgtask_monotonic_ns() + UInt64($0.nanoseconds) }
        while true {
            if let frame = try bufferedFrame() { return frame }
            let needed = try neededBytes()
            if try !awaitBytes(idleDeadline: idleDeadline) { return nil }
            switch receive(wait: true, needed: needed) {
            case .complete:
                continue
            case .ended:
                if available == 0 { return nil }
                throw endedInsideFrame(needed: needed)
            case .failed(_, let error):
                throw readFailure(error, needed: needed)
            }
        }
    }

    /// The stream ended with part of a frame buffered.
    private func endedInsideFrame(needed: Int) -> ControlFrame.FrameError {
        if available < ControlFrame.headerSize {
            return .init(code: .truncated, description:
                "stream ended inside a frame header: \(available) of \(ControlFrame.headerSize) bytes (\(ControlFrame.hex(storage[start..<end])))")
        }
        return .init(code: .truncated, description:
            "stream ended inside a frame payload: \(available - ControlFrame.headerSize) of \(needed - ControlFrame.headerSize) bytes")
    }

    /// A read failed with `error`, `needed` bytes making the frame being read.
    private func readFailure(_ error: Int32, needed: Int) -> ControlFrame.FrameError {
        ControlFrame.readFailure(error, available < ControlFrame.headerSize
            ? "after \(available) of \(ControlFrame.headerSize) bytes of a frame header"
            : "after \(available - ControlFrame.headerSize) of \(needed - ControlFrame.headerSize) bytes of a frame payload")
    }

    /// The frame being read was not whole `timeout` after its first byte.
    package func requestTimedOut(_ timeout: Duration) -> ControlFrame.FrameError {
        let needed = (try? neededBytes()) ?? ControlFrame.headerSize
        return .init(code: .timedOut, description:
            "the request was not complete \(ControlFrameReader.describe(timeout)) after its first byte (\(available) of \(needed) bytes arrived): the whole-request deadline")
    }

    /// What `poll` found.
    public enum Polled: Equatable {
        case frame(Data)
        /// Nothing whole yet (a partial frame stays buffered).
        case pending
        /// The peer ended the stream between frames.
        case ended
    }

    /// The next frame from a non-blocking socket, reading what has arrived; `truncated` when the
    /// stream ends inside a frame, `closed` on a read error.
    public mutating func poll() throws(ControlFrame.FrameError) -> Polled {
        while true {
            if let frame = try bufferedFrame() { return .frame(frame) }
            let needed = try neededBytes()
            switch receive(wait: false, needed: needed) {
            case .complete:
                continue
            case .ended:
                if available == 0 { return .ended }
                throw endedInsideFrame(needed: needed)
            case .failed(_, let error):
                if error == EAGAIN || error == EWOULDBLOCK { return .pending }
                throw readFailure(error, needed: needed)
            }
        }
    }

    /// When the first byte of a frame not yet whole arrived (nil: none is buffered).
    public var partialSinceNs: UInt64? { available > 0 ? frameStartNs : nil }

    /// Waits until the socket is readable, within the deadline that applies: the request's
    /// (from its first byte) once part of a frame is buffered, else the idle one. False when an
    /// idle peer's time is up (the stream counts as ended); `timedOut` for a request's.
    private func awaitBytes(idleDeadline: UInt64?) throws(ControlFrame.FrameError) -> Bool {
        let deadline: UInt64
        if available > 0 {
            guard let requestTimeout, let frameStartNs else { return true }
            deadline = frameStartNs + UInt64(requestTimeout.nanoseconds)
        } else {
            guard let idleDeadline else { return true }
            deadline = idleDeadline
        }
        while true {
            let now = bgtask_monotonic_ns()
            if now < deadline {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ready = bgtask_poll_ns(&pfd, 1, Int64(clamping: deadline - now))
                if ready > 0 { return true }
                if ready < 0 && errno == EINTR { continue }
                if ready < 0 { return true } // let the read report the error
            }
            guard available > 0 else { return false }
            throw requestTimedOut(requestTimeout ?? .zero)
        }
    }

    /// `5 s`, `250 ms`.
    package static func describe(_ duration: Duration) -> String {
        let ms = duration.nanoseconds / 1_000_000
        return ms % 1000 == 0 ? "\(ms / 1000) s" : "\(ms) ms"
    }

    /// The frame's total size (header included) once its header is buffered, else the header's.
    private func neededBytes() throws(ControlFrame.FrameError) -> Int {
        guard available >= ControlFrame.headerSize else { return ControlFrame.headerSize }
        let header = Array(storage[start..<start + ControlFrame.headerSize])
        return ControlFrame.headerSize + (try ControlFrame.payloadLength(header: header))
    }

    /// A whole frame from the buffer, consumed; nil when the buffer holds less.
    private mutating func bufferedFrame() throws(ControlFrame.FrameError) -> Data? {
        let needed = try neededBytes()
        guard available >= ControlFrame.headerSize, available >= needed else { return nil }
        let payload = storage.withUnsafeBytes { Data(bytes: $0.baseAddress! + start + ControlFrame.headerSize, count: needed - ControlFrame.headerSize) }
        start += needed
        if start == end {
            (start, end) = (0, 0)
            frameStartNs = nil
        } else {
            // The next frame has begun (pipelined): its deadline counts from now at the latest.
            frameStartNs = bgtask_monotonic_ns()
        }
        return payload
    }

    /// One read into the buffer, with room for at least `needed` bytes from `start`:
    /// `.complete` when bytes arrived, `.ended` at end of stream, `.failed` on an error (EAGAIN
    /// without waiting: nothing there yet).
    private mutating func receive(wait: Bool, needed: Int) -> ControlFrame.Fill {
        if storage.count - start < max(needed, Self.chunk / 2) {
            // Move what is buffered to the front, and grow for a frame bigger than the buffer.
            let kept = available
            storage.withUnsafeMutableBytes { raw in
                _ = memmove(raw.baseAddress!, raw.baseAddress! + start, kept)
            }
            (start, end) = (0, kept)
            if storage.count < needed { storage += [UInt8](repeating: 0, count: needed - storage.count) }
        }
        while true {
            let room = storage.count - end
            let count = storage.withUnsafeMutableBytes { raw in
                recv(fd, raw.baseAddress! + end, room, wait ? 0 : Int32(MSG_DONTWAIT))
            }
            let error = errno
            if count > 0 {
                if end == start { frameStartNs = bgtask_monotonic_ns() }
                end += count
                return .complete
            }
            if count < 0 && error == EINTR { continue }
            return count == 0 ? .ended(0) : .failed(0, error)
        }
    }
}

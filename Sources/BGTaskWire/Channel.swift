import BGTaskModel
import BGTaskSystem
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What went wrong on a launch channel. The description names the frame and the problem.
public struct ChannelError: Error, CustomStringConvertible, Equatable {
    /// `wouldBlock`: a non-blocking receive found nothing waiting.
    public enum Code: Equatable, Sendable { case closed, oversized, malformed, wouldBlock, system }
    public var code: Code
    public var detail: String

    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { detail }
}

/// One end of a launch's socketpair (`SOCK_SEQPACKET`): one message per packet, so a reader
/// never sees half a message, and a packet larger than `maximumMessageBytes` is rejected.
///
/// Sends are serialized by the kernel per packet, so any thread may send; one thread receives.
public struct LaunchChannel: Sendable {
    public static let maximumMessageBytes = 256 * 1024

    public let fd: Int32

    public init(fd: Int32) { self.fd = fd }

    /// Creates the pair; both ends close on exec (the spawner dups the child's onto fd 3).
    public static func makePair() throws -> (parent: LaunchChannel, child: LaunchChannel) {
        var fds: [Int32] = [0, 0]
        let kind = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, kind, 0, &fds) == 0 else {
            throw ChannelError(.system, "socketpair: \(String(cString: strerror(errno)))")
        }
        // A packet must fit the send buffer whole (the default, ~208 KiB, is below the limit).
        var size = Int32(maximumMessageBytes * 2)
        for fd in fds {
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        return (LaunchChannel(fd: fds[0]), LaunchChannel(fd: fds[1]))
    }

    public func send(_ message: some WireMessage) throws(ChannelError) {
        var writer = WireWriter()
        message.write(to: &writer)
        try send(bytes: writer.bytes)
    }

    /// Sends one packet as it is: one encoded ahead (the zygote's rehearsal start), or, in
    /// tests, a misbehaving peer's bytes.
    public func send(bytes data: [UInt8]) throws(ChannelError) {
        guard data.count <= Self.maximumMessageBytes else {
            throw ChannelError(.oversized, "message of \(data.count) bytes exceeds \(Self.maximumMessageBytes)")
        }
        let sent = data.withUnsafeBytes { buffer in
            retryingEINTR { Glibc.send(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL)) }
        }
        if sent < 0 {
            let e = errno
            if e == EMSGSIZE {
                throw ChannelError(.oversized, "message of \(data.count) bytes does not fit the channel's buffer")
            }
            throw ChannelError(e == EPIPE || e == ECONNRESET ? .closed : .system,
                               "send: \(String(cString: strerror(e)))")
        }
    }

    /// Reads one raw packet. Returns nil at end of stream (the peer closed its end).
    ///
    /// The packet's size is asked first (`MSG_PEEK | MSG_TRUNC`), so that a small message costs
    /// a small buffer, not a zeroed one of the maximum size (a launch exchanges dozens).
    public func receivePacket(nonBlocking: Bool = false) throws -> [UInt8]? {
        let wait = nonBlocking ? Int32(MSG_DONTWAIT) : 0
        var byte: UInt8 = 0
        let size = retryingEINTR { recv(fd, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_TRUNC) | wait) }
        if size < 0 {
            let e = errno
            if e == EAGAIN || e == EWOULDBLOCK { throw ChannelError(.wouldBlock, "would block") }
            if e == ECONNRESET { return nil }
            throw ChannelError(.system, "recv: \(String(cString: strerror(e)))")
        }
        if size == 0 { return nil }
        guard size <= Self.maximumMessageBytes else {
            // Taken off the socket, so that the next packet can be read.
            _ = retryingEINTR { recv(fd, &byte, 1, Int32(MSG_TRUNC)) }
            throw ChannelError(.oversized, "frame of \(size) bytes exceeds the limit of \(Self.maximumMessageBytes) bytes")
        }
        var failure: Int32 = 0
        let packet = [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            let n = retryingEINTR { recv(fd, buffer.baseAddress, size, 0) }
            if n < 0 { failure = errno }
            count = max(0, n)
        }
        if failure != 0 {
            if failure == ECONNRESET { return nil }
            throw ChannelError(.system, "recv: \(String(cString: strerror(failure)))")
        }
        return packet.isEmpty ? nil : packet
    }

    /// Decodes a packet, naming the frame and the field in the error when it is not a message
    /// of type `M` (see WireCodec).
    public static func decode<M: WireMessage>(_ type: M.Type, from packet: [UInt8]) throws(ChannelError) -> M {
        do throws(ChannelError) {
            var reader = try WireReader(packet)
            let message = try M(from: &reader)
            guard reader.atEnd else { throw ChannelError(.malformed, "bytes left after the message") }
            return message
        } catch {
            let preview = String(decoding: packet.prefix(80), as: UTF8.self)
                .unicodeScalars.map { $0.value < 0x20 || $0.value >= 0x7f ? "." : String($0) }.joined()
            throw ChannelError(.malformed, "malformed frame of \(packet.count) bytes (\"\(preview)\"): not a \(M.self): \(error.detail)")
        }
    }

    public func receive<M: WireMessage>(_ type: M.Type) throws -> M? {
        guard let packet = try receivePacket() else { return nil }
        return try Self.decode(type, from: packet)
    }

    public func close() { _ = Glibc.close(fd) }
}

import Foundation

/// Frames on the control socket: an 8-byte header — magic "BG" (0x42 0x47), version (1 byte,
/// currently 1), flags (1 byte, 0), payload length (4 bytes, big-endian) — then a JSON payload
/// of at most `maximumPayload` bytes.
public enum ControlFrame {
    public static let version: UInt8 = 1
    public static let headerSize = 8
    public static let maximumPayload = 1 << 20

    public struct FrameError: Error, CustomStringConvertible, Equatable, Sendable {
        public enum Code: String, Sendable { case badMagic, unsupportedVersion, oversized, truncated, malformedPayload, closed }
        public var code: Code
        public var description: String
    }

    /// Header + payload.
    public static func encode(_ payload: Data) throws(FrameError) -> Data { fatalError("unimplemented") }

    /// Validates a header; returns the payload length.
    public static func payloadLength(header: [UInt8]) throws(FrameError) -> Int { fatalError("unimplemented") }

    /// Writes one frame to a blocking socket (all bytes, retrying EINTR and short writes).
    public static func write(_ payload: Data, to fd: Int32) throws(FrameError) { fatalError("unimplemented") }

    /// Reads one frame from a blocking socket. nil at a clean end of stream before a header;
    /// `truncated` when the stream ends inside a frame; other codes as named. Never reads past
    /// the frame, never allocates more than `maximumPayload`.
    public static func read(from fd: Int32) throws(FrameError) -> Data? { fatalError("unimplemented") }
}

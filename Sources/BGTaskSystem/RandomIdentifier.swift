import _BGTaskSystemShims

/// Identifiers the host makes (transfers, pushes, anything stored under a UNIQUE key): random
/// version-4 UUIDs whose bytes come from getrandom(2), which needs no descriptor.
///
/// Why not Foundation's `UUID()`: on Linux it reads /dev/urandom, and when the process is out
/// of descriptors (a hostile app's thousand downloads once took the host there) it silently
/// returns `00000000-0000-4000-8000-000000000000` — the same "random" ID every time, so the
/// second create fails its UNIQUE key. Any thread may call it.
public enum RandomIdentifier {
    /// A new random UUID in the canonical form Foundation's `uuidString` has (upper-case hex,
    /// 8-4-4-4-12), so stored IDs look as before.
    public static func uuidString() -> String {
        format(bytes())
    }

    /// 16 random bytes with the version (4) and variant (RFC 4122) bits set.
    static func bytes() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)
        let status = bytes.withUnsafeMutableBytes { bgtask_getrandom($0.baseAddress, $0.count) }
        if status != 0 {
            // Only a kernel without getrandom (before 3.17) gets here: the standard library's
            // generator (which itself traps rather than return a constant).
            var generator = SystemRandomNumberGenerator()
            for index in bytes.indices { bytes[index] = generator.next() }
        }
        bytes[6] = (bytes[6] & 0x0F) | 0x40
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        return bytes
    }

    /// The canonical text of 16 bytes.
    public static func format(_ bytes: [UInt8]) -> String {
        precondition(bytes.count == 16, "a UUID is 16 bytes")
        let digits = Array("0123456789ABCDEF".utf8)
        var text = [UInt8]()
        text.reserveCapacity(36)
        for (index, byte) in bytes.enumerated() {
            if index == 4 || index == 6 || index == 8 || index == 10 { text.append(UInt8(ascii: "-")) }
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}

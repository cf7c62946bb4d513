#if canImport(Glibc)
import Glibc
#endif

/// apns-id values the host makes when a provider sends none, as APNs makes them: a random
/// (version 4) UUID in canonical upper-case form.
///
/// From getentropy(3), which is the getrandom(2) system call: it needs no descriptor.
/// Foundation's `UUID()` is not used here: once the process is out of descriptors it returns
/// `00000000-0000-4000-8000-000000000000` (issue 28), and two pushes would share an id.
enum APNsID {
    /// A fresh identifier, or nil if the kernel gave no random bytes (getrandom(2) failed).
    static func make() -> String? {
        var bytes = [UInt8](repeating: 0, count: 16)
        guard bytes.withUnsafeMutableBytes({ getentropy($0.baseAddress, $0.count) }) == 0 else { return nil }
        bytes[6] = (bytes[6] & 0x0f) | 0x40  // version 4
        bytes[8] = (bytes[8] & 0x3f) | 0x80  // RFC 4122 variant
        let digits = Array("0123456789ABCDEF".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(36)
        for (index, byte) in bytes.enumerated() {
            if [4, 6, 8, 10].contains(index) { text.append(UInt8(ascii: "-")) }
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}

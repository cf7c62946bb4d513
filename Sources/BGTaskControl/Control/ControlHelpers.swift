import Foundation
import Glibc

/// The address of the Unix socket at `path`, which must fit `sun_path`.
package func unixAddress(_ path: String) throws(BGTaskError) -> sockaddr_un {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        throw BGTaskError(.invalidRequest, file: path, "the control socket path is too long for a Unix socket (\(bytes.count) bytes, at most 107): use a shorter --state directory")
    }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        raw.copyBytes(from: bytes)
        raw[bytes.count] = 0
    }
    return address
}

extension JSONEncoder {
    /// The control protocol's encoder (a new one each time: an encoder is not thread-safe).
    /// Keys are not sorted: nothing reads the frames but a decoder, and sorting costs.
    package static var control: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }
}

extension JSONDecoder {
    package static var control: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// The words the control protocol uses for what a client sent.
package enum ControlWords {
    /// A client's word quoted back in an error: its first 64 characters, and how long it was
    /// when longer (a megabyte-long verb must not make the answer a megabyte).
    package static func quoted(_ text: String) -> String {
        text.count <= 64 ? text : "\(text.prefix(64))… (\(text.utf8.count) bytes)"
    }

    package static func describe(_ error: Error) -> String {
        switch error {
        case let DecodingError.keyNotFound(key, _): "missing key '\(key.stringValue)'"
        case let DecodingError.typeMismatch(_, context), let DecodingError.valueNotFound(_, context):
            "wrong type at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        case let DecodingError.dataCorrupted(context): context.debugDescription
        default: "\(error)"
        }
    }
}

import BGTaskModel
import Foundation

/// A fast path for decoding control requests: a strict reader of the JSON that clients send
/// (`JSONEncoder`'s output: flat objects, plain strings, numbers, booleans, `null`), which
/// builds the `ControlRequest` directly.
///
/// Foundation's `JSONDecoder` spent ~13 µs of the host's ~60 µs per pipelined submission
/// (generic containers and metadata lookups for every key); this reads one in ~1 µs. It
/// handles only what it can decode exactly as `JSONDecoder` would, and returns nil for
/// anything else — escapes in strings, unknown or repeated keys, a value of the wrong type,
/// fractional integers, invalid UTF-8, trailing bytes — so the caller decodes that frame with
/// `JSONDecoder`, which gives the same result or the same error as before.
package enum ControlRequestParser {
    package static func parse(_ data: Data) -> ControlRequest? {
        data.withUnsafeBytes { raw in
            var reader = Reader(bytes: raw.bindMemory(to: UInt8.self))
            guard let request = reader.request(), reader.atEnd() else { return nil }
            return request
        }
    }

    private struct Reader {
        let bytes: UnsafeBufferPointer<UInt8>
        var at = 0

        mutating func skipSpace() {
            while at < bytes.count, bytes[at] == 0x20 || bytes[at] == 0x0A || bytes[at] == 0x0D || bytes[at] == 0x09 { at += 1 }
        }

        mutating func atEnd() -> Bool {
            skipSpace()
            return at == bytes.count
        }

        /// Consumes `byte` (after whitespace) if it is next.
        mutating func take(_ byte: UInt8) -> Bool {
            skipSpace()
            guard at < bytes.count, bytes[at] == byte else { return false }
            at += 1
            return true
        }

        mutating func take(literal: StaticString) -> Bool {
            skipSpace()
            let count = literal.utf8CodeUnitCount
            guard at + count <= bytes.count else { return false }
            for i in 0..<count where bytes[at + i] != literal.utf8Start[i] { return false }
            at += count
            return true
        }

        /// `null`, consumed if it is next.
        mutating func null() -> Bool { take(literal: "null") }

        /// The bytes of a string without escapes or control characters (its quotes consumed).
        mutating func stringBytes() -> UnsafeBufferPointer<UInt8>? {
            guard take(0x22) else { return nil }
            let start = at
            while at < bytes.count {
                let byte = bytes[at]
                if byte == 0x22 {
                    defer { at += 1 }
                    return UnsafeBufferPointer(rebasing: bytes[start..<at])
                }
                if byte == 0x5C || byte < 0x20 { return nil }
                at += 1
            }
            return nil
        }

        /// A string without escapes or control characters, valid UTF-8.
        mutating func string() -> String? {
            guard let raw = stringBytes() else { return nil }
            if raw.allSatisfy({ $0 < 0x80 }) { return String(decoding: raw, as: UTF8.self) }
            return String(validating: raw, as: UTF8.self)
        }

        /// The index in `keys` of the key that comes next (consumed with its colon).
        mutating func key(in keys: [[UInt8]]) -> Int? {
            guard let raw = stringBytes(), take(0x3A) else { return nil }
            return keys.firstIndex { $0.count == raw.count && $0.elementsEqual(raw) }
        }

        mutating func bool() -> Bool? {
            if take(literal: "true") { return true }
            if take(literal: "false") { return false }
            return nil
        }

        /// A JSON number (its grammar checked): its bytes, and whether it is an integer.
        mutating func number() -> (bytes: UnsafeBufferPointer<UInt8>, integer: Bool)? {
            skipSpace()
            let start = at
            if at < bytes.count, bytes[at] == 0x2D { at += 1 }
            func digits() -> Int {
                let from = at
                while at < bytes.count, bytes[at] >= 0x30, bytes[at] <= 0x39 { at += 1 }
                return at - from
            }
            let intDigits = digits()
            guard intDigits > 0, !(intDigits > 1 && bytes[at - intDigits] == 0x30) else { return nil }
            var integer = true
            if at < bytes.count, bytes[at] == 0x2E {
                at += 1
                integer = false
                guard digits() > 0 else { return nil }
            }
            if at < bytes.count, bytes[at] == 0x65 || bytes[at] == 0x45 {
                at += 1
                integer = false
                if at < bytes.count, bytes[at] == 0x2B || bytes[at] == 0x2D { at += 1 }
                guard digits() > 0 else { return nil }
            }
            return (UnsafeBufferPointer(rebasing: bytes[start..<at]), integer)
        }

        /// The value of an integer's bytes (`-?[0-9]+`), if `T` holds it.
        static func value<T: FixedWidthInteger>(_ digits: UnsafeBufferPointer<UInt8>, as: T.Type) -> T? {
            let negative = digits.first == 0x2D
            guard !negative || T.isSigned else { return nil }
            var magnitude: UInt64 = 0
            for byte in digits.dropFirst(negative ? 1 : 0) {
                let (times10, o1) = magnitude.multipliedReportingOverflow(by: 10)
                let (sum, o2) = times10.addingReportingOverflow(UInt64(byte - 0x30))
                guard !o1, !o2 else { return nil }
                magnitude = sum
            }
            if negative {
                guard magnitude <= UInt64(Int64.max) + 1 else { return nil }
                return magnitude == UInt64(Int64.max) + 1 ? T(exactly: Int64.min) : T(exactly: -Int64(magnitude))
            }
            return T(exactly: magnitude)
        }

        mutating func double() -> Double? {
            guard let (digits, integer) = number() else { return nil }
            // Integers of up to 15 digits are exact doubles; anything else goes through the
            // standard library's correctly rounded conversion.
            if integer, digits.count <= 15, let whole = Self.value(digits, as: Int64.self), whole != 0 || digits.first != 0x2D {
                return Double(whole)
            }
            guard let value = Double(String(decoding: digits, as: UTF8.self)), value.isFinite else { return nil }
            return value
        }

        mutating func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
            guard let (digits, integer) = number(), integer else { return nil }
            return Self.value(digits, as: T.self)
        }

        /// The members of an object whose keys are among `keys`, each read by `member` (which
        /// returns false to give up). Every key may appear once.
        mutating func object(keys: [[UInt8]], _ member: (inout Reader, Int) -> Bool) -> Bool {
            guard take(0x7B) else { return false }
            if take(0x7D) { return true }
            var seen: UInt64 = 0
            repeat {
                guard let index = key(in: keys), seen & (1 << index) == 0, member(&self, index) else { return false }
                seen |= 1 << index
            } while take(0x2C)
            return take(0x7D)
        }

        /// The members of an object of strings (any keys, once each).
        mutating func stringObject() -> [String: String]? {
            guard take(0x7B) else { return nil }
            var result: [String: String] = [:]
            if take(0x7D) { return result }
            repeat {
                guard let name = string(), take(0x3A), let value = string(), result.updateValue(value, forKey: name) == nil else { return nil }
            } while take(0x2C)
            return take(0x7D) ? result : nil
        }

        static let requestKeys = ["verb", "app", "identifier", "request", "force", "wait", "device", "advance", "limit", "event", "delay", "after"]
            .map { Array($0.utf8) }
        static let taskKeys = ["kind", "identifier", "earliestBeginDate", "requiresNetworkConnectivity", "requiresExternalPower",
                               "protectionType", "title", "subtitle", "strategyFail", "requiredResources"].map { Array($0.utf8) }

        mutating func request() -> ControlRequest? {
            var request = ControlRequest(verb: "")
            var sawVerb = false
            let complete = object(keys: Self.requestKeys) { reader, key in
                if reader.null() { return key != 0 }
                switch key {
                case 0:
                    guard let verb = reader.string() else { return false }
                    request.verb = verb
                    sawVerb = true
                    return true
                case 1: request.app = reader.string(); return request.app != nil
                case 2: request.identifier = reader.string(); return request.identifier != nil
                case 3: request.request = reader.taskRequest(); return request.request != nil
                case 4: request.force = reader.bool(); return request.force != nil
                case 5: request.wait = reader.bool(); return request.wait != nil
                case 6: request.device = reader.stringObject(); return request.device != nil
                case 7: request.advance = reader.double(); return request.advance != nil
                case 8: request.limit = reader.integer(Int.self); return request.limit != nil
                case 9: request.event = reader.string(); return request.event != nil
                case 10: request.delay = reader.double(); return request.delay != nil
                default: request.after = reader.string(); return request.after != nil
                }
            }
            return complete && sawVerb ? request : nil
        }

        mutating func taskRequest() -> TaskRequest? {
            var kind: TaskKind?, identifier: String?, earliest: Double?, title: String?, subtitle: String?
            var network: Bool?, power: Bool?, strategyFail: Bool?
            var protection: Int32?, resources: UInt32?
            let complete = object(keys: Self.taskKeys) { reader, key in
                switch key {
                case 0: kind = reader.string().flatMap(TaskKind.init(rawValue:)); return kind != nil
                case 1: identifier = reader.string(); return identifier != nil
                case 2:
                    if reader.null() { return true }
                    earliest = reader.double(); return earliest != nil
                case 3: network = reader.bool(); return network != nil
                case 4: power = reader.bool(); return power != nil
                case 5: protection = reader.integer(Int32.self); return protection != nil
                case 6:
                    if reader.null() { return true }
                    title = reader.string(); return title != nil
                case 7:
                    if reader.null() { return true }
                    subtitle = reader.string(); return subtitle != nil
                case 8: strategyFail = reader.bool(); return strategyFail != nil
                default: resources = reader.integer(UInt32.self); return resources != nil
                }
            }
            guard complete, let kind, let identifier, let network, let power, let strategyFail, let protection, let resources else { return nil }
            return TaskRequest(
                kind: kind, identifier: identifier, earliestBeginDate: earliest, requiresNetworkConnectivity: network,
                requiresExternalPower: power, protectionType: protection, title: title, subtitle: subtitle,
                strategyFail: strategyFail, requiredResources: resources)
        }
    }
}

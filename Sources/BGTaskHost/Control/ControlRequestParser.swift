import BGTaskWire
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
enum ControlRequestParser {
    static func parse(_ data: Data) -> ControlRequest? {
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

        /// A string without escapes or control characters, valid UTF-8.
        mutating func string() -> String? {
            guard take(0x22) else { return nil }
            let start = at
            while at < bytes.count {
                let byte = bytes[at]
                if byte == 0x22 {
                    defer { at += 1 }
                    return String(validating: UnsafeBufferPointer(rebasing: bytes[start..<at]), as: UTF8.self)
                }
                if byte == 0x5C || byte < 0x20 { return nil }
                at += 1
            }
            return nil
        }

        mutating func bool() -> Bool? {
            if take(literal: "true") { return true }
            if take(literal: "false") { return false }
            return nil
        }

        /// The bytes of a JSON number (its grammar checked), and whether it is an integer.
        mutating func number() -> (text: String, integer: Bool)? {
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
            return (String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<at]), as: UTF8.self), integer)
        }

        mutating func double() -> Double? {
            guard let (text, _) = number(), let value = Double(text), value.isFinite else { return nil }
            return value
        }

        mutating func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
            guard let (text, integer) = number(), integer, T.isSigned || !text.hasPrefix("-") else { return nil }
            return T(text)
        }

        /// The members of an object, each read by `member` (which returns false to give up).
        /// Every key may appear once.
        mutating func object(_ member: (inout Reader, String) -> Bool) -> Bool {
            guard take(0x7B) else { return false }
            if take(0x7D) { return true }
            var seen = Set<String>()
            repeat {
                guard let key = string(), seen.insert(key).inserted, take(0x3A), member(&self, key) else { return false }
            } while take(0x2C)
            return take(0x7D)
        }

        mutating func request() -> ControlRequest? {
            var request = ControlRequest(verb: "")
            var sawVerb = false
            let complete = object { reader, key in
                if reader.null() { return key != "verb" }
                switch key {
                case "verb":
                    guard let verb = reader.string() else { return false }
                    request.verb = verb
                    sawVerb = true
                case "app": request.app = reader.string()
                case "identifier": request.identifier = reader.string()
                case "event": request.event = reader.string()
                case "after": request.after = reader.string()
                case "force": request.force = reader.bool()
                case "wait": request.wait = reader.bool()
                case "advance": request.advance = reader.double()
                case "delay": request.delay = reader.double()
                case "limit": request.limit = reader.integer(Int.self)
                case "request": request.request = reader.taskRequest()
                case "device":
                    var device: [String: String] = [:]
                    guard reader.object({ reader, name in
                        guard let value = reader.string() else { return false }
                        device[name] = value
                        return true
                    }) else { return false }
                    request.device = device
                    return true
                default: return false
                }
                return Self.isSet(key, in: request)
            }
            return complete && sawVerb ? request : nil
        }

        /// Whether the member just read for `key` was read (its field is no longer nil).
        static func isSet(_ key: String, in request: ControlRequest) -> Bool {
            switch key {
            case "app": request.app != nil
            case "identifier": request.identifier != nil
            case "event": request.event != nil
            case "after": request.after != nil
            case "force": request.force != nil
            case "wait": request.wait != nil
            case "advance": request.advance != nil
            case "delay": request.delay != nil
            case "limit": request.limit != nil
            case "request": request.request != nil
            default: true
            }
        }

        mutating func taskRequest() -> WireTaskRequest? {
            var kind: TaskKind?, identifier: String?, earliest: Double?, title: String?, subtitle: String?
            var network: Bool?, power: Bool?, strategyFail: Bool?
            var protection: Int32?, resources: UInt32?
            let complete = object { reader, key in
                switch key {
                case "kind": kind = reader.string().flatMap(TaskKind.init(rawValue:)); return kind != nil
                case "identifier": identifier = reader.string(); return identifier != nil
                case "earliestBeginDate":
                    if reader.null() { return true }
                    earliest = reader.double(); return earliest != nil
                case "title":
                    if reader.null() { return true }
                    title = reader.string(); return title != nil
                case "subtitle":
                    if reader.null() { return true }
                    subtitle = reader.string(); return subtitle != nil
                case "requiresNetworkConnectivity": network = reader.bool(); return network != nil
                case "requiresExternalPower": power = reader.bool(); return power != nil
                case "strategyFail": strategyFail = reader.bool(); return strategyFail != nil
                case "protectionType": protection = reader.integer(Int32.self); return protection != nil
                case "requiredResources": resources = reader.integer(UInt32.self); return resources != nil
                default: return false
                }
            }
            guard complete, let kind, let identifier, let network, let power, let strategyFail, let protection, let resources else { return nil }
            return WireTaskRequest(
                kind: kind, identifier: identifier, earliestBeginDate: earliest, requiresNetworkConnectivity: network,
                requiresExternalPower: power, protectionType: protection, title: title, subtitle: subtitle,
                strategyFail: strategyFail, requiredResources: resources)
        }
    }
}

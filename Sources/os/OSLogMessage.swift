public import Foundation

/// How an interpolated value is shown in what is stored: Apple's privacy options. A redacted
/// value is `<private>`, or with the hash mask `<mask.hash: 'BASE64'>` (a hash of the value,
/// the same for the same value, so that entries can be correlated without the value).
///
/// - `.auto` (the default): integers, floating-point numbers and booleans are shown; strings,
///   objects and other values are redacted.
/// - `.public`: shown. `.private`: redacted. `.sensitive`: redacted, always.
///
/// A launch told to keep private values (`bgtask run --log-private`, `bgtask host
/// --log-private`: `BGTASK_LOG_PRIVATE=1` in its environment) shows `.auto` and `.private`
/// values, as a device with private data enabled does; `.sensitive` ones stay redacted.
public struct OSLogPrivacy: Equatable, Hashable, Sendable {
    public enum Mask: Equatable, Hashable, Sendable {
        case hash
        case none
    }

    enum Kind: Equatable, Hashable, Sendable { case auto, `public`, `private`, sensitive }

    let kind: Kind
    let mask: Mask

    public static var auto: OSLogPrivacy { OSLogPrivacy(kind: .auto, mask: .none) }
    public static var `public`: OSLogPrivacy { OSLogPrivacy(kind: .public, mask: .none) }
    public static var `private`: OSLogPrivacy { OSLogPrivacy(kind: .private, mask: .none) }
    public static var sensitive: OSLogPrivacy { OSLogPrivacy(kind: .sensitive, mask: .none) }
    public static func auto(mask: OSLogPrivacy.Mask) -> OSLogPrivacy { OSLogPrivacy(kind: .auto, mask: mask) }
    public static func `private`(mask: OSLogPrivacy.Mask) -> OSLogPrivacy { OSLogPrivacy(kind: .private, mask: mask) }
    public static func sensitive(mask: OSLogPrivacy.Mask) -> OSLogPrivacy { OSLogPrivacy(kind: .sensitive, mask: mask) }

    /// Whether a value of this privacy is redacted: `scalar` for numbers and booleans.
    func redacts(scalar: Bool, keepingPrivate: Bool) -> Bool {
        switch kind {
        case .public: false
        case .sensitive: true
        case .private: !keepingPrivate
        case .auto: !scalar && !keepingPrivate
        }
    }

    /// What stands in a stored entry for a redacted `value`.
    func redaction(of value: String) -> String {
        guard mask == .hash else { return "<private>" }
        return "<mask.hash: '\(Self.hash(value))'>"
    }

    /// A 128-bit FNV-1a hash of the value, base64: stable across launches (Apple salts it per
    /// boot), so that the same value gives the same mask in every launch's log.
    static func hash(_ value: String) -> String {
        var a: UInt64 = 0xcbf2_9ce4_8422_2325
        var b: UInt64 = 0x6c62_272e_07bb_0142
        for byte in value.utf8 {
            a = (a ^ UInt64(byte)) &* 0x0000_0100_0000_01B3
            b = (b ^ UInt64(byte)) &* 0x0000_0100_0000_01B3 ^ (a >> 29)
        }
        var bytes: [UInt8] = []
        for word in [a, b] { for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) } }
        return Data(bytes).base64EncodedString()
    }
}

/// Alignment of an interpolated value in a column (`align: .right(columns: 8)`).
public struct OSLogStringAlignment: Sendable {
    enum Side: Sendable { case none, left, right }
    let side: Side
    let columns: Int

    public static var none: OSLogStringAlignment { OSLogStringAlignment(side: .none, columns: 0) }
    public static func right(columns: @autoclosure () -> Int) -> OSLogStringAlignment { OSLogStringAlignment(side: .right, columns: columns()) }
    public static func left(columns: @autoclosure () -> Int) -> OSLogStringAlignment { OSLogStringAlignment(side: .left, columns: columns()) }

    func apply(_ text: String) -> String {
        let padding = String(repeating: " ", count: max(0, columns - text.count))
        switch side {
        case .none: return text
        case .left: return text + padding
        case .right: return padding + text
        }
    }
}

/// How an integer is written (`format: .hex`, `.decimal(minDigits: 4)`, `.octal(includePrefix: true)`).
public struct OSLogIntegerFormatting: Sendable {
    enum Radix: Sendable { case decimal, hex, octal }
    let radix: Radix
    let explicitPositiveSign: Bool
    let includePrefix: Bool
    let uppercase: Bool
    let minDigits: Int

    public static var decimal: OSLogIntegerFormatting { .decimal() }
    public static func decimal(explicitPositiveSign: Bool = false) -> OSLogIntegerFormatting {
        OSLogIntegerFormatting(radix: .decimal, explicitPositiveSign: explicitPositiveSign, includePrefix: false, uppercase: false, minDigits: 0)
    }
    public static func decimal(explicitPositiveSign: Bool = false, minDigits: @autoclosure () -> Int) -> OSLogIntegerFormatting {
        OSLogIntegerFormatting(radix: .decimal, explicitPositiveSign: explicitPositiveSign, includePrefix: false, uppercase: false, minDigits: minDigits())
    }
    public static var hex: OSLogIntegerFormatting { .hex() }
    public static func hex(explicitPositiveSign: Bool = false, includePrefix: Bool = false, uppercase: Bool = false) -> OSLogIntegerFormatting {
        OSLogIntegerFormatting(radix: .hex, explicitPositiveSign: explicitPositiveSign, includePrefix: includePrefix, uppercase: uppercase, minDigits: 0)
    }
    public static func hex(explicitPositiveSign: Bool = false, includePrefix: Bool = false, uppercase: Bool = false,
                           minDigits: @autoclosure () -> Int) -> OSLogIntegerFormatting {
        OSLogIntegerFormatting(radix: .hex, explicitPositiveSign: explicitPositiveSign, includePrefix: includePrefix, uppercase: uppercase, minDigits: minDigits())
    }
    public static var octal: OSLogIntegerFormatting { .octal() }
    public static func octal(explicitPositiveSign: Bool = false, includePrefix: Bool = false, uppercase: Bool = false) -> OSLogIntegerFormatting {
        OSLogIntegerFormatting(radix: .octal, explicitPositiveSign: explicitPositiveSign, includePrefix: includePrefix, uppercase: uppercase, minDigits: 0)
    }
    public static func octal(explicitPositiveSign: Bool = false, includePrefix: Bool = false, uppercase: Bool = false,
                             minDigits: @autoclosure () -> Int) -> OSLogIntegerFormatting {
        OSLogIntegerFormatting(radix: .octal, explicitPositiveSign: explicitPositiveSign, includePrefix: includePrefix, uppercase: uppercase, minDigits: minDigits())
    }

    func format<T: BinaryInteger>(_ value: T) -> String {
        let base = radix == .decimal ? 10 : radix == .hex ? 16 : 8
        var digits = String(value.magnitude, radix: base, uppercase: uppercase)
        if digits.count < minDigits { digits = String(repeating: "0", count: minDigits - digits.count) + digits }
        if includePrefix { digits = (radix == .hex ? (uppercase ? "0X" : "0x") : radix == .octal ? "0" : "") + digits }
        if value < 0 { return "-" + digits }
        return explicitPositiveSign ? "+" + digits : digits
    }
}

/// How a floating-point number is written (`format: .fixed(precision: 2)`, `.exponential`).
public struct OSLogFloatFormatting: Sendable {
    enum Style: Sendable { case fixed, hex, exponential, hybrid }
    let style: Style
    let precision: Int?
    let explicitPositiveSign: Bool
    let uppercase: Bool

    public static var fixed: OSLogFloatFormatting { .fixed() }
    public static func fixed(explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .fixed, precision: nil, explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }
    public static func fixed(precision: @autoclosure () -> Int, explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .fixed, precision: precision(), explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }
    public static var hex: OSLogFloatFormatting { .hex() }
    public static func hex(explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .hex, precision: nil, explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }
    public static var exponential: OSLogFloatFormatting { .exponential() }
    public static func exponential(explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .exponential, precision: nil, explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }
    public static func exponential(precision: @autoclosure () -> Int, explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .exponential, precision: precision(), explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }
    public static var hybrid: OSLogFloatFormatting { .hybrid() }
    public static func hybrid(explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .hybrid, precision: nil, explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }
    public static func hybrid(precision: @autoclosure () -> Int, explicitPositiveSign: Bool = false, uppercase: Bool = false) -> OSLogFloatFormatting {
        OSLogFloatFormatting(style: .hybrid, precision: precision(), explicitPositiveSign: explicitPositiveSign, uppercase: uppercase)
    }

    func format(_ value: Double) -> String {
        var spec = "%"
        if explicitPositiveSign { spec += "+" }
        if let precision { spec += ".\(max(0, precision))" }
        let conversion = switch style {
        case .fixed: "f"
        case .hex: "a"
        case .exponential: "e"
        case .hybrid: "g"
        }
        spec += uppercase ? conversion.uppercased() : conversion
        return String(format: spec, value)
    }
}

/// How a boolean is written: `true`/`false` (`.truth`) or `YES`/`NO` (`.answer`).
public enum OSLogBoolFormat: Sendable {
    case truth
    case answer
}

/// A log message: a string literal with interpolated values, each with its privacy and format.
/// Apple's type; here the values are formatted when the message is made.
public struct OSLogMessage: ExpressibleByStringInterpolation, ExpressibleByStringLiteral, Sendable {
    let interpolation: OSLogInterpolation

    public init(stringInterpolation: OSLogInterpolation) {
        interpolation = stringInterpolation
    }

    public init(stringLiteral value: String) {
        var interpolation = OSLogInterpolation(literalCapacity: value.utf8.count, interpolationCount: 0)
        interpolation.appendLiteral(value)
        self.interpolation = interpolation
    }

    /// The message as it is stored: redacted values replaced unless `keepingPrivate`.
    package func rendered(keepingPrivate: Bool) -> String {
        var text = ""
        for segment in interpolation.segments {
            switch segment {
            case .literal(let literal): text += literal
            case .value(let value, let privacy, let scalar):
                text += privacy.redacts(scalar: scalar, keepingPrivate: keepingPrivate) ? privacy.redaction(of: value) : value
            }
        }
        return text
    }
}

public struct OSLogInterpolation: StringInterpolationProtocol, Sendable {
    enum Segment: Sendable {
        case literal(String)
        /// A formatted value, its privacy, and whether it is a scalar (shown under `.auto`).
        case value(String, OSLogPrivacy, scalar: Bool)
    }

    var segments: [Segment] = []

    public init(literalCapacity: Int, interpolationCount: Int) {
        segments.reserveCapacity(interpolationCount * 2 + 1)
    }

    public mutating func appendLiteral(_ literal: String) {
        segments.append(.literal(literal))
    }

    public mutating func appendInterpolation(_ argumentString: @autoclosure () -> String,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(argumentString()), privacy, scalar: false))
    }

    public mutating func appendInterpolation<T: CustomStringConvertible>(_ value: @autoclosure () -> T,
                                                                        align: OSLogStringAlignment = .none,
                                                                        privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(value().description), privacy, scalar: false))
    }

    public mutating func appendInterpolation<T: FixedWidthInteger>(_ number: @autoclosure () -> T,
                                                                  format: OSLogIntegerFormatting = .decimal,
                                                                  align: OSLogStringAlignment = .none,
                                                                  privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    // The integer types one by one, as Apple's overlay has them: a concrete overload wins over
    // the CustomStringConvertible one for a literal (`\(12)`), which a generic one does not.
    public mutating func appendInterpolation(_ number: @autoclosure () -> Int, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> Int8, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> Int16, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> Int32, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> Int64, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> UInt, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> UInt8, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> UInt16, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> UInt32, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> UInt64, format: OSLogIntegerFormatting = .decimal,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> Double, format: OSLogFloatFormatting = .fixed,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(number())), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> Float, format: OSLogFloatFormatting = .fixed,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(Double(number()))), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ number: @autoclosure () -> CGFloat, format: OSLogFloatFormatting = .fixed,
                                             align: OSLogStringAlignment = .none, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(format.format(Double(number()))), privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ boolean: @autoclosure () -> Bool, format: OSLogBoolFormat = .truth,
                                             privacy: OSLogPrivacy = .auto) {
        let value = boolean()
        let text = format == .truth ? (value ? "true" : "false") : (value ? "YES" : "NO")
        segments.append(.value(text, privacy, scalar: true))
    }

    public mutating func appendInterpolation(_ argumentObject: @autoclosure () -> NSObject, privacy: OSLogPrivacy = .auto) {
        segments.append(.value(argumentObject().description, privacy, scalar: false))
    }

    public mutating func appendInterpolation(_ value: @autoclosure () -> Any.Type, align: OSLogStringAlignment = .none,
                                             privacy: OSLogPrivacy = .auto) {
        segments.append(.value(align.apply(String(reflecting: value())), privacy, scalar: false))
    }
}

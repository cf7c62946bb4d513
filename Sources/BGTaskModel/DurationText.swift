// Durations as people write them on a command line, and as the CLI and the host print them: one
// parser and one formatter, so that whatever is printed can be pasted back.

/// Durations as text: `1d`, `7d`, `1h30m`, `90s`, `250ms`, `1.5h`, or a plain number of seconds
/// (`30`, `0.25`).
///
/// Read (`parse`): one or more components, each a decimal number and a unit, from the largest
/// unit to the smallest, each unit at most once: `d` (24 hours), `h`, `m`, `s`, `ms` (case does
/// not matter). A number without a unit is seconds, alone only. The result is rounded to the
/// millisecond and is at most `maximum` (100 years); never negative.
///
/// Printed (`format`): the same components, largest first, without zero ones: `1d2h`, `2h`,
/// `1m30s`, `1s500ms`, `0s`. `parse(format(d)) == d` for every duration `parse` accepts.
public enum DurationText {
    /// The units, largest first, with their length in milliseconds.
    public static let units: [(name: String, milliseconds: Int64)] = [
        ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1),
    ]

    /// The longest duration any option takes: 100 years of 365.25 days (36525d).
    public static let maximum: Duration = .seconds(36_525 * 86_400)

    /// Why a text is not a duration: `description` names the text and, where there is one, the
    /// part or unit at fault.
    public struct ParseError: Error, Equatable, Sendable, CustomStringConvertible {
        /// The whole text as given.
        public var text: String
        /// What is wrong with it.
        public var reason: String

        public init(text: String, reason: String) {
            self.text = text
            self.reason = reason
        }

        public var description: String { "'\(text)' is not a duration: \(reason)" }
    }

    static let unitList = "d, h, m, s, ms"
    static let examples = "e.g. 90s, 1h30m, 7d, 250ms"

    /// Reads a duration (see the type's documentation). Leading and trailing whitespace is
    /// ignored.
    public static func parse(_ text: String) throws(ParseError) -> Duration {
        func fail(_ reason: String) -> ParseError { ParseError(text: text, reason: reason) }
        let body = Array(text.trimmingWhitespace())
        guard !body.isEmpty else { throw fail("it is empty (\(examples))") }
        if body[0] == "-" { throw fail("a duration is never negative") }
        if body[0] == "+" { throw fail("a duration takes no sign here (\(examples))") }

        var milliseconds: Int64 = 0
        var index = 0
        var previousUnit: Int? = nil  // index into `units` of the last component's unit
        while index < body.count {
            // The number: digits, optionally one '.' and more digits.
            let numberStart = index
            var integer: Int64 = 0
            var integerOverflow = false
            while index < body.count, let digit = body[index].digit {
                let (times, overflow1) = integer.multipliedReportingOverflow(by: 10)
                let (plus, overflow2) = times.addingReportingOverflow(Int64(digit))
                if overflow1 || overflow2 { integerOverflow = true } else { integer = plus }
                index += 1
            }
            var fraction: Int64 = 0  // the first 9 digits after the point
            var fractionScale: Int64 = 1
            let hasPoint = index < body.count && body[index] == "."
            if hasPoint {
                index += 1
                while index < body.count, let digit = body[index].digit {
                    if fractionScale < 1_000_000_000 {
                        fraction = fraction * 10 + Int64(digit)
                        fractionScale *= 10
                    }
                    index += 1
                }
            }
            let number = String(body[numberStart..<index])
            if index - numberStart - (hasPoint ? 1 : 0) == 0 {
                if hasPoint { throw fail("'\(number)' is not a number") }
                let character = body[index]
                if character.isWhitespace { throw fail("no spaces inside a duration (write 1h30m, not 1h 30m)") }
                if previousUnit == nil {
                    throw fail("it does not start with a number (\(examples))")
                }
                throw fail("unexpected '\(character)' after '\(String(body[..<index]))'")
            }

            // The unit: the letters that follow.
            let unitStart = index
            while index < body.count, body[index].isLetter { index += 1 }
            let unitText = String(body[unitStart..<index]).lowercased()
            let unitIndex: Int
            if unitText.isEmpty {
                if index < body.count {
                    let character = body[index]
                    if character.isWhitespace { throw fail("no spaces inside a duration (write 1h30m, not 1h 30m)") }
                    throw fail("unexpected '\(character)' after '\(String(body[..<index]))'")
                }
                // A bare number: seconds, and only on its own.
                if let previousUnit {
                    throw fail("'\(number)' after '\(String(body[..<numberStart]))' has no unit (after \(units[previousUnit].name) comes \(units[(previousUnit + 1)...].map(\.name).joined(separator: ", ")))")
                }
                unitIndex = 3  // s
            } else if let found = units.firstIndex(where: { $0.name == unitText }) {
                unitIndex = found
            } else {
                throw fail("unknown unit '\(unitText)' after '\(number)' (units: \(unitList))")
            }
            if let previousUnit {
                if unitIndex == previousUnit { throw fail("the unit '\(units[unitIndex].name)' comes twice") }
                if unitIndex < previousUnit {
                    throw fail("'\(number)\(units[unitIndex].name)' comes after '\(units[previousUnit].name)': units go from the largest to the smallest (\(unitList))")
                }
            }

            // This component in milliseconds, exactly: integer × unit + fraction × unit, rounded.
            let unit = units[unitIndex].milliseconds
            let (whole, overflow) = integer.multipliedReportingOverflow(by: unit)
            if integerOverflow || overflow { throw tooLong(text) }
            // fraction < 1e9 and unit ≤ 8.64e7: the product fits an Int64.
            let part = (fraction * unit + fractionScale / 2) / fractionScale
            let (sum1, overflow1) = milliseconds.addingReportingOverflow(whole)
            let (sum2, overflow2) = sum1.addingReportingOverflow(part)
            if overflow1 || overflow2 { throw tooLong(text) }
            milliseconds = sum2
            if milliseconds > maximumMilliseconds { throw tooLong(text) }
            previousUnit = unitIndex
        }
        return .milliseconds(milliseconds)
    }

    /// `parse` for seconds as a `Double` (what the control protocol carries).
    public static func parseSeconds(_ text: String) throws(ParseError) -> Double {
        Double(try parse(text).totalMilliseconds) / 1000
    }

    static var maximumMilliseconds: Int64 { maximum.totalMilliseconds }

    static func tooLong(_ text: String) -> ParseError {
        ParseError(text: text, reason: "longer than the most any duration may be, \(format(maximum)) (100 years)")
    }

    /// The canonical text of a duration, to the millisecond: `1d2h`, `2h`, `1m30s`, `250ms`,
    /// `0s`. A negative one gets a `-` before it (`parse` refuses it: no option takes one).
    public static func format(_ duration: Duration) -> String {
        format(milliseconds: duration.totalMilliseconds)
    }

    /// `format` for seconds (rounded to the millisecond). NaN prints as `0s`; infinities and
    /// values beyond what an Int64 of milliseconds holds are clamped to it.
    public static func format(seconds: Double) -> String {
        guard !seconds.isNaN else { return "0s" }
        let milliseconds = (seconds * 1000).rounded()
        if milliseconds >= 9.2e18 { return format(milliseconds: .max) }
        if milliseconds <= -9.2e18 { return format(milliseconds: .min + 1) }
        return format(milliseconds: Int64(milliseconds))
    }

    static func format(milliseconds: Int64) -> String {
        if milliseconds == 0 { return "0s" }
        if milliseconds < 0 { return "-" + format(milliseconds: milliseconds == .min ? .max : -milliseconds) }
        var rest = milliseconds
        var text = ""
        for (name, length) in units {
            let count = rest / length
            rest %= length
            if count > 0 { text += "\(count)\(name)" }
        }
        return text
    }
}

extension Duration {
    /// The duration in whole milliseconds, rounded to the nearest (saturating at Int64's bounds).
    var totalMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        let (ms, overflow1) = seconds.multipliedReportingOverflow(by: 1000)
        // 1 ms = 1e15 attoseconds; attoseconds is in (-1e18, 1e18).
        let fractional = (attoseconds + (attoseconds >= 0 ? 500_000_000_000_000 : -500_000_000_000_000)) / 1_000_000_000_000_000
        let (sum, overflow2) = ms.addingReportingOverflow(fractional)
        if overflow1 || overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }
}

private extension Character {
    /// 0 to 9 for an ASCII digit (not other scripts' digits).
    var digit: Int? { isASCII ? wholeNumberValue : nil }
}

private extension String {
    func trimmingWhitespace() -> Substring {
        let whitespace: Set<Character> = [" ", "\t", "\n", "\r"]
        var slice = self[...]
        while let first = slice.first, whitespace.contains(first) { slice = slice.dropFirst() }
        while let last = slice.last, whitespace.contains(last) { slice = slice.dropLast() }
        return slice
    }
}

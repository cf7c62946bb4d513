import Foundation

/// A JSON value that keeps its keys in the order they were set.
indirect enum JSON {
    case number(Double, digits: Int)
    case int(Int)
    case string(String)
    case bool(Bool)
    case null
    case object([(String, JSON)])

    static func num(_ value: Double, _ digits: Int = 3) -> JSON { value.isFinite ? .number(value, digits: digits) : .null }

    var text: String {
        switch self {
        case let .number(value, digits):
            var text = String(format: "%.\(digits)f", value)
            if text.contains(".") {
                while text.hasSuffix("0") { text.removeLast() }
                if text.hasSuffix(".") { text.removeLast() }
            }
            return text == "-0" ? "0" : text
        case let .int(value): return String(value)
        case let .string(value): return Self.quote(value)
        case let .bool(value): return value ? "true" : "false"
        case .null: return "null"
        case let .object(members): return "{" + members.map { "\(Self.quote($0.0)):\($0.1.text)" }.joined(separator: ",") + "}"
        }
    }

    static func quote(_ string: String) -> String {
        var out = "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            default:
                if scalar.value < 0x20 { out += String(format: "\\u%04x", scalar.value) } else { out.unicodeScalars.append(scalar) }
            }
        }
        return out + "\""
    }
}

/// Everything one run measured: the JSON object and the table rows, in order.
final class Report {
    private(set) var keys: [(String, JSON)] = []
    private(set) var rows: [Row] = []
    private(set) var notes: [String] = []

    struct Row {
        var figure: String
        var value: String
        var floor: String
        var ratio: String
        var target: String
        var verdict: String
    }

    func set(_ key: String, _ value: JSON) {
        if let index = keys.firstIndex(where: { $0.0 == key }) { keys[index].1 = value } else { keys.append((key, value)) }
    }

    func set(_ key: String, _ value: Double, _ digits: Int = 3) { set(key, .num(value, digits)) }

    func row(_ figure: String, _ value: String, floor: String = "", ratio: String = "", target: String = "", verdict: String = "") {
        rows.append(Row(figure: figure, value: value, floor: floor, ratio: ratio, target: target, verdict: verdict))
    }

    func section(_ title: String) { rows.append(Row(figure: "## " + title, value: "", floor: "", ratio: "", target: "", verdict: "")) }

    func note(_ text: String) { notes.append(text) }

    var json: String { JSON.object(keys).text }

    /// The table as aligned text.
    var table: String {
        let header = Row(figure: "figure", value: "value", floor: "floor (same run)", ratio: "ratio", target: "target", verdict: "met?")
        let all = [header] + rows.filter { !$0.figure.hasPrefix("## ") }
        func width(_ column: (Row) -> String) -> Int { all.map { column($0).count }.max() ?? 0 }
        let widths = [width(\.figure), width(\.value), width(\.floor), width(\.ratio), width(\.target), width(\.verdict)]
        func line(_ row: Row) -> String {
            let cells = [row.figure, row.value, row.floor, row.ratio, row.target, row.verdict]
            return zip(cells, widths).map { $0.0.padding(toLength: $0.1, withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces)
        }
        var lines = [line(header), String(repeating: "-", count: widths.reduce(0, +) + 2 * (widths.count - 1))]
        for row in rows {
            if row.figure.hasPrefix("## ") {
                lines.append("")
                lines.append(String(row.figure.dropFirst(3)))
            } else {
                lines.append(line(row))
            }
        }
        if !notes.isEmpty {
            lines.append("")
            lines.append(contentsOf: notes.map { "note: " + $0 })
        }
        return lines.joined(separator: "\n")
    }
}

// MARK: Formatting

func us(_ value: Double) -> String { value.isFinite ? String(format: value >= 100 ? "%.0f µs" : "%.1f µs", value) : "n/a" }
func ms(_ value: Double) -> String { value.isFinite ? String(format: "%.2f ms", value) : "n/a" }
func perSecond(_ value: Double) -> String { value.isFinite ? String(format: value >= 100 ? "%.0f/s" : "%.1f/s", value) : "n/a" }
func pct(_ value: Double) -> String { value.isFinite ? String(format: "%.1f %%", value) : "n/a" }
func times(_ value: Double) -> String { value.isFinite ? String(format: "%.2f×", value) : "n/a" }
func mib(_ bytes: Double) -> String { bytes.isFinite ? String(format: "%.1f MiB", bytes / 1_048_576) : "n/a" }
func count(_ value: Int) -> String {
    let formatter = NumberFormatter()
    formatter.numberStyle = .decimal
    formatter.groupingSeparator = ","
    formatter.locale = Locale(identifier: "en_US_POSIX")
    return formatter.string(from: NSNumber(value: value)) ?? String(value)
}
func verdict(_ met: Bool, missedBy: String? = nil) -> String { met ? "yes" : "no" + (missedBy.map { " (\($0))" } ?? "") }

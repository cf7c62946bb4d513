import BGTaskModel
import Foundation

/// How much CPU a background launch may use: more than `percentOfCore` of one core averaged over
/// any trailing `window` (all its threads and processes counted together) and it is killed with
/// termination `cpu-limit`. iOS's CPU monitor kills a background app past 80 % of a core over
/// 60 s (its crash reports say "exceeding limit of 80% cpu over 60 seconds"), and turns the
/// monitor off for processing tasks while the device is on external power.
public struct CPULimit: Sendable, Equatable, CustomStringConvertible {
    /// Percent of one core (100: a whole core; 150: one and a half).
    public var percentOfCore: Double
    public var window: Duration

    public init(percentOfCore: Double, window: Duration) {
        self.percentOfCore = percentOfCore
        self.window = window
    }

    /// iOS's background CPU monitor: 80 % of a core over 60 s.
    public static let ios = CPULimit(percentOfCore: 80, window: .seconds(60))

    /// CPU time the window allows, in nanoseconds.
    public var allowedNs: UInt64 {
        UInt64(max(0, percentOfCore / 100 * Double(window.nanoseconds)))
    }

    /// "80% of a core over 60s", as `parse` reads it back.
    public var description: String {
        "\(Self.number(percentOfCore))% of a core over \(DurationText.format(window))"
    }

    /// The short form `bgtask host --cpu-limit` takes: "80%/60s".
    public var argument: String { "\(Self.number(percentOfCore))%/\(DurationText.format(window))" }

    /// Reads "PERCENT%/DURATION" (`80%/60s`, `50%/2s`, `150%/1m`); nil with anything else. The
    /// percent is over 0 and at most 6400 (64 cores); the window at least 100 ms and at most a day.
    public static func parse(_ text: String) -> CPULimit? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].hasSuffix("%"), let percent = Double(parts[0].dropLast()),
              percent.isFinite, percent > 0, percent <= 6400,
              let seconds = try? DurationText.parseSeconds(String(parts[1])), seconds >= 0.1, seconds <= 86_400 else { return nil }
        return CPULimit(percentOfCore: percent, window: .nanoseconds(Int64(seconds * 1e9)))
    }

    private static func number(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(format: "%.1f", value)
    }
}

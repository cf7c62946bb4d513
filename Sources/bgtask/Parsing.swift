import ArgumentParser
import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation

/// A duration on the command line, read by `DurationText` (BGTaskModel): `30` (seconds), `90s`,
/// `250ms`, `15m`, `1h30m`, `1d`, `7d`, `1.5h`. Every option that takes one parses it with
/// `DurationArgument.parse` (its `transform:`), so that a bad value is refused with the reason:
/// the text, and the unit or part at fault.
struct DurationArgument: ExpressibleByArgument {
    var duration: Duration

    init(duration: Duration) { self.duration = duration }

    init?(argument: String) {
        guard let duration = try? DurationText.parse(argument) else { return nil }
        self.duration = duration
    }

    /// The `transform:` of every duration option: the parser's reason becomes the message
    /// after ArgumentParser's "The value 'X' is invalid for '--option <duration>': ".
    @Sendable static func parse(_ text: String) throws -> DurationArgument {
        do { return DurationArgument(duration: try DurationText.parse(text)) } catch {
            throw ValidationError("\(error.reason)")
        }
    }

    static var defaultCompletionKind: CompletionKind { .default }
}

/// A size: `50MB`, `64MiB`, `1G`, `65536` (bytes). K, M and G are binary (1024-based).
struct ByteCountArgument: ExpressibleByArgument {
    var bytes: UInt64

    init?(argument: String) {
        let text = argument.trimmingCharacters(in: .whitespaces).uppercased()
        let units: [(String, UInt64)] = [
            ("KIB", 1 << 10), ("MIB", 1 << 20), ("GIB", 1 << 30),
            ("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30),
            ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("B", 1),
        ]
        var number = text
        var scale: UInt64 = 1
        for (suffix, factor) in units where text.hasSuffix(suffix) {
            number = String(text.dropLast(suffix.count))
            scale = factor
            break
        }
        guard let value = Double(number.trimmingCharacters(in: .whitespaces)), value >= 0, value.isFinite else { return nil }
        bytes = UInt64(value * Double(scale))
    }
}

/// `--cpu-limit 80%/60s`, or `off`.
struct CPULimitArgument {
    /// Nil: off.
    var limit: CPULimit?

    @Sendable static func parse(_ text: String) throws -> CPULimitArgument {
        if text == "off" { return CPULimitArgument(limit: nil) }
        guard let limit = CPULimit.parse(text) else {
            throw ValidationError("'\(text)' is not PERCENT%/DURATION (e.g. 80%/60s: more than 80 % of a core over any 60 s), with a percent over 0 and up to 6400 and a duration from 100ms to 1d, nor off")
        }
        return CPULimitArgument(limit: limit)
    }
}

extension TaskKind: ExpressibleByArgument {}
extension ThermalSetting: ExpressibleByArgument {}

/// `--task IDENTIFIER` or `--task IDENTIFIER:TYPE`.
struct TaskArgument: ExpressibleByArgument {
    var identifier: String
    var kind: TaskKind?

    init?(argument: String) {
        if let colon = argument.lastIndex(of: ":") {
            guard let kind = TaskKind(rawValue: String(argument[argument.index(after: colon)...])) else { return nil }
            identifier = String(argument[..<colon])
            self.kind = kind
        } else {
            identifier = argument
        }
        guard !identifier.isEmpty else { return nil }
    }
}

// MARK: Fixed value sets: each an enum, so that parsing, --help, completion and the error for
// a wrong value come from ArgumentParser, and nothing compares strings by hand.

extension DeviceSetting: ExpressibleByArgument {}

/// on or off.
enum Switch: String, CaseIterable, ExpressibleByArgument {
    case on, off
}

/// How the host starts a launch's process (`bgtask host --launcher`).
enum Launcher: String, CaseIterable, ExpressibleByArgument {
    /// Forked from a pre-warmed launcher: the fast path.
    case zygote
    /// posix_spawn of the runner each time.
    case spawn
}

/// A health-research request's protectionTypeOfRequiredData (`bgtask submit --protection`), by
/// the names of Foundation's FileProtectionType.
enum ProtectionClass: String, CaseIterable, ExpressibleByArgument {
    case none, complete
    case completeUnlessOpen = "complete-unless-open"
    case untilFirstAuth = "until-first-auth"

    /// Its code in a task request.
    var code: Int32 {
        switch self {
        case .none: 0
        case .complete: 1
        case .completeUnlessOpen: 2
        case .untilFirstAuth: 3
        }
    }
}

import ArgumentParser
import BGTaskModel
import Foundation

/// A duration on the command line: `30` or `30s`, `500ms`, `2m`, `1h`, `1.5s`.
struct DurationArgument: ExpressibleByArgument {
    var duration: Duration

    init?(argument: String) {
        let text = argument.trimmingCharacters(in: .whitespaces).lowercased()
        let units: [(String, Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)]
        var number = text
        var scale = 1.0
        for (suffix, factor) in units where text.hasSuffix(suffix) {
            number = String(text.dropLast(suffix.count))
            scale = factor
            break
        }
        // Bounded so that the milliseconds fit an Int64 (1e308 would trap); the host refuses
        // what is further than its own bound (100 years) with an error that names it.
        guard let value = Double(number), value >= 0, value.isFinite, value * scale < 1e15 else { return nil }
        duration = .milliseconds(Int64((value * scale * 1000).rounded()))
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

extension TaskKind: ExpressibleByArgument {}

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

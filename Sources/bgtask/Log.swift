import ArgumentParser
import BGTaskHost
import BGTaskControl
import BGTaskLogLine
import Foundation

extension UnifiedLogLine.Level: ExpressibleByArgument {
    public init?(argument: String) { self.init(name: argument) }
    public static var allValueStrings: [String] { allCases.map(\.rawValue) }
}

extension BGTaskCommand {
    struct Log: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "log",
            abstract: "Show the unified-logging entries (Logger, os_log) of launches, as `log show` and `log stream` do.",
            discussion: """
                Entries come from the launch logs in STATE/logs (a launch's log is kept as long \
                as its record: `host --history-per-app`), oldest first, one a line: time (UTC), \
                level, app, launch, [subsystem:category], message. Private values are stored \
                redacted (<private>) unless the launch ran with --log-private. With --follow, \
                entries are shown as launches write them, until interrupted or --timeout.
                """)

        @Option(name: .long, help: ArgumentHelp("Only this app's entries (a bundle identifier; an extension's own).", valueName: "bundle-id"))
        var app: String?

        @Option(name: .long, help: "Only entries of this subsystem (Logger(subsystem:category:)'s).")
        var subsystem: String?

        @Option(name: .long, help: "Only entries of this category.")
        var category: String?

        @Option(name: .long, help: ArgumentHelp(
            "Only entries of this level and above: debug, info, default (or notice), error, fault. Default: all.",
            valueName: "level"))
        var level: UnifiedLogLine.Level?

        @Option(name: .long, help: ArgumentHelp("Only this launch's entries.", valueName: "launch-id"))
        var launch: String?

        @Option(name: .long, help: ArgumentHelp(
            "Only entries made within this long before now (e.g. 5m, 1h30m, 1d); with --follow, show them first.",
            valueName: "duration"), transform: DurationArgument.parse)
        var last: DurationArgument?

        @Flag(name: .shortAndLong, help: "Keep showing entries as launches write them (new ones only, unless --last).")
        var follow = false

        @Option(name: .long, help: ArgumentHelp("With --follow: stop after this long (e.g. 30s, 10m).", valueName: "duration"),
                transform: DurationArgument.parse)
        var timeout: DurationArgument?

        @Flag(name: .long, help: "One JSON object per entry and line (time, app, launch_id, level, subsystem, category, message).")
        var json = false

        @OptionGroup var options: StateOptions

        /// How often --follow looks for what was written.
        static let pollInterval: useconds_t = 200_000

        func validate() throws {
            if timeout != nil && !follow { throw ValidationError("--timeout goes with --follow") }
            if let launch, !UnifiedLogReader.isLaunchID(launch) { throw ValidationError("--launch takes a launch id (20261122T041140-91cea49f), not a path") }
        }

        func run() throws {
            let now = UnifiedLogLine.now()
            var since: Int64?
            if let last { since = now - Self.milliseconds(last.duration) }
            if follow && since == nil { since = now }
            let filter = UnifiedLogFilter(app: app, subsystem: subsystem, category: category, minimumLevel: level,
                                          launchID: launch, since: since)
            let reader = UnifiedLogReader(stateDirectory: options.stateDirectory, filter: filter)
            let stored = reader.stored()
            // --follow alone is `log stream`: what is written from now on.
            if !follow || last != nil { try show(stored) }
            guard follow else { return }
            let deadline = timeout.map { DispatchTime.now().uptimeNanoseconds + UInt64(Self.milliseconds($0.duration)) * 1_000_000 }
            while deadline.map({ DispatchTime.now().uptimeNanoseconds < $0 }) ?? true {
                usleep(Self.pollInterval)
                try show(reader.poll())
            }
        }

        static func milliseconds(_ duration: Duration) -> Int64 {
            duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        }

        private func show(_ entries: [UnifiedLogEntry]) throws {
            guard !entries.isEmpty else { return }
            var output = Data()
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                for entry in entries { output += try encoder.encode(entry) + Data("\n".utf8) }
            } else {
                for entry in entries { output += Data((entry.text + "\n").utf8) }
            }
            FileHandle.standardOutput.write(output)
        }
    }
}

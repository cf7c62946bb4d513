import ArgumentParser
import BGTaskControl
import BGTaskModel
import Foundation

extension BGTaskCommand {
    struct Metrics: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show an app's use of the device per day: CPU, memory, storage, wake-ups, network, exits by reason, crashes and hangs.",
            discussion: "What the host's energy accounting judges (a day over its budget schedules the app less: bgtask why says so) and what MetricKit's payloads for each day hold; a day's payload is handed to the app's first launch after the day ends (MXMetricManager subscribers). Days are the host clock's (a virtual clock's too), from midnight UTC.")
        @Argument(help: "The app's bundle identifier.") var app: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let reports = try host.call(.metrics(app: app))
            if host.json { return try host.printJSON(reports) }
            if reports.isEmpty { print("no launches of \(app) have ended yet") }
            for report in reports { print(Self.text(report)) }
        }

        static func text(_ report: MetricReport) -> String {
            let day = report.day
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withFullDate]
            var lines = ["\(formatter.string(from: day.begin)): \(day.launches) launch(es)\(report.delivered ? ", delivered to the app" : "")"]
            lines.append("  cpu \(DurationText.format(seconds: day.cpuMs / 1000)), background \(DurationText.format(seconds: day.backgroundMs / 1000)), foreground \(DurationText.format(seconds: day.foregroundMs / 1000)), peak memory \(RunRecord.bytesText(day.peakMemoryBytes))")
            lines.append("  storage \(RunRecord.bytesText(day.diskWrittenBytes)) written, \(RunRecord.bytesText(day.diskReadBytes)) read; \(day.wakeups) wake-ups; network \(RunRecord.bytesText(day.networkUploadBytes)) up, \(RunRecord.bytesText(day.networkDownloadBytes)) down")
            let exits = day.exits
            let counts = [("normal", exits.normal), ("memory-limit", exits.memoryLimit), ("memory-pressure", exits.memoryPressure), ("cpu-limit", exits.cpuLimit), ("watchdog", exits.watchdog),
                          ("background-task-assertion-timeout", exits.backgroundTaskAssertionTimeout), ("abnormal", exits.abnormal), ("disk", exits.disk)]
                .filter { $0.1 > 0 }.map { "\($0.0) \($0.1)" }
            lines.append("  background exits: \(counts.isEmpty ? "none" : counts.joined(separator: ", "))")
            if let excess = report.excess { lines.append("  excessive: \(excess)") }
            for diagnostic in report.diagnostics {
                let how = [diagnostic.signal, diagnostic.reason].compactMap { $0 }.joined(separator: ": ")
                lines.append("  \(diagnostic.kind.rawValue) in launch \(diagnostic.launchID) after \(DurationText.format(seconds: diagnostic.durationMs / 1000))\(how.isEmpty ? "" : ": \(how)")")
            }
            return lines.joined(separator: "\n")
        }
    }
}

extension BGTaskCommand {
    struct Respond: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Open a delivered notification, as the user who taps it: its app comes to the foreground and its notification center's delegate hears didReceive.",
            discussion: "ID is a delivered notification's id (bgtask notifications lists them). --action names a category action the user chose (default: opening it, UNNotificationDefaultActionIdentifier; com.apple.UNNotificationDismissActionIdentifier to dismiss it). The launch counts as a use of the app (its usage pattern).")
        @Argument(help: "The delivered notification's id.") var id: Int64
        @Option(name: .long, help: ArgumentHelp("The action identifier (default: UNNotificationDefaultActionIdentifier).", valueName: "identifier")) var action: String?
        @Flag(name: .long, help: "Wait for the launch to end and print its record.") var wait = false
        @OptionGroup var host: HostOptions

        func run() throws {
            try host.printLaunch(try host.send(.respond(notification: id, action: action, wait: wait)), started: "opened notification \(id)")
        }
    }
}

import ArgumentParser
import BGTaskControl
import BGTaskModel
import Foundation
import Glibc

extension BGTaskCommand {
    struct Top: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Watch the launches running now: time against budget, memory against limit, live.",
            discussion: "Redraws every --interval until interrupted (Ctrl-C); --once prints one table and returns. For a terminal over SSH what the dashboard (bgtask host --http-port) shows in a browser.")
        @Option(help: ArgumentHelp("Time between redraws (e.g. 1s, 500ms). Default: 1s.", valueName: "duration"), transform: DurationArgument.parse)
        var interval: DurationArgument?
        @Flag(help: "Print the running launches once and return.")
        var once = false
        @OptionGroup var host: HostOptions

        func run() throws {
            let period = interval?.duration ?? .seconds(1)
            guard period >= .milliseconds(100) else { throw ValidationError("--interval must be at least 100ms") }
            let terminal = isatty(STDOUT_FILENO) == 1 && !once
            while true {
                let running = try host.call(.running)
                if host.json {
                    try host.printJSON(running)
                } else {
                    // Home and clear: the table redrawn in place (written at once, unbuffered).
                    let table = Self.table(running, now: Date(), width: terminal ? Self.columns() : 200)
                    FileHandle.standardOutput.write(Data(((terminal ? "\u{1B}[H\u{1B}[2J" : "") + table + "\n").utf8))
                }
                if once || host.json { return }
                Thread.sleep(forTimeInterval: Double(period.components.seconds) + Double(period.components.attoseconds) / 1e18)
            }
        }

        static func table(_ launches: [RunningLaunchReport], now: Date, width: Int) -> String {
            var lines = ["\(launches.count) launch(es) running at \(ISO8601DateFormatter().string(from: now))"]
            guard !launches.isEmpty else { return lines.joined(separator: "\n") }
            func row(_ cells: [String]) -> String {
                let widths = [28, 26, 22, 24]
                let line = zip(cells, widths).map { cell, width in cell.count >= width ? cell + " " : cell.padding(toLength: width + 1, withPad: " ", startingAt: 0) }
                    .joined() + (cells.last ?? "")
                return String(line.prefix(max(width, 40)))
            }
            lines.append(row(["APP", "LAUNCH", "TIME / BUDGET", "MEMORY / LIMIT", "TASKS"]))
            for launch in launches {
                let elapsed = now.timeIntervalSince(launch.startedAt) * 1000
                let time = "\(bar(elapsed / max(launch.budgetMs, 1))) \(DurationText.format(seconds: elapsed / 1000))/\(DurationText.format(seconds: launch.budgetMs / 1000))"
                let memory = launch.residentBytes.map { "\(bar(Double($0) / Double(max(launch.memoryLimitBytes, 1)))) \(RunRecord.mib($0))" } ?? "-"
                let tasks = (launch.expired ? "EXPIRED " : "") + launch.identifiers.joined(separator: ",")
                lines.append(row([String(launch.app.suffix(28)), launch.launchID, time, memory, tasks]))
            }
            return lines.joined(separator: "\n")
        }

        /// A share as eight cells: `[####    ]`, `!` past the whole.
        static func bar(_ share: Double) -> String {
            let filled = Int((min(max(share, 0), 1) * 8).rounded())
            return "[" + String(repeating: share > 1 ? "!" : "#", count: filled) + String(repeating: " ", count: 8 - filled) + "]"
        }

        static func columns() -> Int {
            var size = winsize()
            return ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0 && size.ws_col > 0 ? Int(size.ws_col) : 120
        }
    }
}

import ArgumentParser
import BGTaskHost
import Foundation

extension BGTaskCommand {
    struct Transfers: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List background URL sessions' transfers the host carries: where each stands, what holds it, what came back.",
            discussion: """
                One line each, newest first: id, app, session#task, kind, state, bytes sent and received (of the expected), \
                the HTTP status, the condition holding a waiting transfer (held: ...) and a failed one's error. \
                bgtask why TRANSFER_ID explains one (attempts, resumes, the launch it was delivered in).
                """)
        @Argument(help: "Only this app's transfers.") var app: String?
        @Option(name: .long, help: ArgumentHelp("At most this many, newest first.", valueName: "n")) var limit: Int = 100
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.transfers(app: app, limit: limit))
            let reports = response.transfers ?? []
            if host.json { return try host.printJSON(reports) }
            if reports.isEmpty { print("no transfers\(app.map { " for \($0)" } ?? "")") }
            for report in reports { print(report.text) }
            if let omitted = response.omitted { printError("transfers: \(omitted) left out to fit the answer's size limit (ask for fewer with --limit, or one app)") }
        }
    }
}

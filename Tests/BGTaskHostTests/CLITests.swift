@testable import BGTaskHost
import BGTaskControl
import Foundation
import Testing

/// The CLI's help is part of its interface: verbs and options users look for must be there.
@Suite struct CLITests {
    @Test func helpListsEveryVerb() throws {
        let help = try runCLI(["--help"])
        #expect(help.status == 0)
        for verb in ["run", "bundle", "validate", "host", "apps", "submit", "pending", "cancel", "cancel-all",
                     "simulate-launch", "simulate-expire", "history", "why", "device", "clock"] {
            #expect(help.stdout.contains("\n  \(verb) "), "bgtask --help does not list \(verb)")
        }
    }

    @Test func runHelpDocumentsLimitsAndExitStatuses() throws {
        let help = try runCLI(["run", "--help"])
        for text in ["--expire-after", "--budget", "--grace", "--memory-limit", "--cgroup", "--json", "Exit status: 0 when every task succeeded"] {
            #expect(help.stdout.contains(text), "bgtask run --help lacks \(text)")
        }
    }

    @Test func unknownVerbsAndBadValuesAreUsageErrors() throws {
        #expect(try runCLI(["frobnicate"]).status == 64)
        let badDuration = try runCLI(["run", "X.app", "--task", "a.b", "--budget", "soon"])
        #expect(badDuration.status == 64)
        #expect(badDuration.stderr.contains("--budget"), "\(badDuration.stderr)")
        let badDevice = try runCLI(["device", "--power", "maybe", "--state", "/nonexistent"])
        #expect(badDevice.status == 64)
        #expect(badDevice.stderr.contains("--power") && badDevice.stderr.contains("'on', 'off' or 'auto'"), "\(badDevice.stderr)")
        let noHost = try runCLI(["apps", "--state", FileManager.default.temporaryDirectory.appendingPathComponent("no-host-\(UUID())").path])
        #expect(noHost.status == 69)
        #expect(noHost.stderr.contains("no bgtask host is listening"))
        let noHistory = try runCLI(["host", "--plugins", "/nonexistent", "--history-per-app", "0"])
        #expect(noHistory.status == 64)
        #expect(noHistory.stderr.contains("--history-per-app"), "\(noHistory.stderr)")
        #expect(try runCLI(["host", "--help"]).stdout.contains("--history-per-app"))
    }

    /// `apps` answers in pages (`limit`, `after`, `next`) so that any catalog fits the control
    /// frame limit: across pages every app comes once, in order, with invalid bundles on the
    /// first page only; the CLI joins the pages, so its output is the same whatever their size.
    @Test func appsArePagedAndTheCLIShowsEveryAppOnce() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        for bundle in [TestBundle.feed, .counter, .misbehaving] { try host.install(bundle.library, info: bundle.info, as: bundle.name) }
        let broken = try host.installBrokenBundle()
        try host.start()
        defer { host.stop() }
        let expected = ["com.example.counter", "com.example.feed", "com.example.misbehaving"]
        #expect(try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--earliest", "+1h"]).status == 0)
        #expect(try host.cli(["device", "--app", "com.example.counter", "--refresh", "off"]).status == 0)

        // A client from before paging gets every app at once, and no `next`.
        let everything = try host.send(.apps())
        #expect(everything.apps?.map(\.identifier) == expected)
        #expect(everything.apps?.map(\.pending) == [0, 1, 0])
        #expect(everything.apps?.map(\.refreshEnabled) == [false, true, true])
        #expect(everything.next == nil && everything.invalid?.count == 1)
        #expect(everything.invalid?.first?.path.hasPrefix(broken.path) == true, "the invalid bundle is Broken.app: \(everything.invalid ?? [])")

        for size in [1, 2, 3, 10] {
            var seen: [AppSummary] = []
            var after: String?
            var pages = 0
            repeat {
                let page = try host.send(.apps(limit: size, after: after))
                #expect(page.ok && (page.apps?.count ?? 0) <= size, "page size \(size): \(page.apps?.count ?? -1) apps")
                #expect(after == nil ? page.invalid?.count == 1 : page.invalid == nil, "invalid bundles come with the first page only")
                if let next = page.next { #expect(next == page.apps?.last?.identifier) }
                seen += page.apps ?? []
                pages += 1
                after = page.next
            } while after != nil && pages <= expected.count
            #expect(seen.map(\.identifier) == expected, "page size \(size)")
            #expect(seen == everything.apps, "page size \(size)")
            #expect(pages == (expected.count + size - 1) / size, "page size \(size)")
        }
        let pastTheEnd = try host.send(.apps(limit: 2, after: "com.example.zzz"))
        #expect(pastTheEnd.apps == [] && pastTheEnd.next == nil && pastTheEnd.invalid == nil)
        #expect(try host.send(.apps(limit: 0)).failure?.code == .badRequest)

        // The CLI: the same output (text and --json) whatever the page size.
        let json = try host.cli(["apps", "--json"])
        #expect(json.status == 0, "\(json.stderr)")
        struct Body: Decodable { var apps: [AppSummary]; var invalid: [InvalidBundle] }
        let body = try JSONDecoder.control.decode(Body.self, from: Data(json.stdout.utf8))
        #expect(body.apps == everything.apps && body.invalid == everything.invalid)
        let text = try host.cli(["apps"])
        for size in ["1", "2"] {
            #expect(try host.cli(["apps", "--json", "--page-size", size]).stdout == json.stdout, "page size \(size)")
            #expect(try host.cli(["apps", "--page-size", size]).stdout == text.stdout, "page size \(size)")
        }
        let lines = text.stdout.split(separator: "\n")
        for identifier in expected { #expect(lines.filter { $0.hasPrefix("\(identifier)  ") }.count == 1, "\(text.stdout)") }
        #expect(lines.contains("com.example.feed  1 pending"), "\(text.stdout)")
        #expect(lines.contains("com.example.counter  0 pending, refresh off"), "\(text.stdout)")
        #expect(lines.filter { $0.hasPrefix("invalid: ") }.count == 1, "\(text.stdout)")
    }

    /// `bgtask host --history-per-app N` keeps each app's newest N ended launches.
    @Test func theHostKeepsTheNewestLaunchesOfEachApp() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--history-per-app", "2"], installing: [.feed])
        defer { host.stop() }
        var launched: [String] = []
        for _ in 0..<4 {
            let result = try host.cli(["simulate-launch", "com.example.feed.refresh", "--force", "--type", "refresh", "--json"])
            #expect(result.status == 0, "\(result.stderr)")
            launched.append(try RunRecord.decode(Data(result.stdout.utf8)).launchID)
        }
        let history = try host.send(.history(limit: 100)).records ?? []
        #expect(history.map(\.launchID) == Array(launched.suffix(2).reversed()))
        // The pruned launches' logs went with them; the kept ones' stay.
        let logs = Set(try FileManager.default.contentsOfDirectory(atPath: scratch.state.appendingPathComponent("logs").path))
        #expect(logs.isSuperset(of: launched.suffix(2).map { "\($0).log" }), "\(logs)")
        #expect(logs.isDisjoint(with: launched.prefix(2).map { "\($0).log" }), "\(logs)")
    }
}

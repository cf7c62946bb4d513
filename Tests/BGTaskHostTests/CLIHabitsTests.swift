@testable import BGTaskHost
import BGTaskModel
import Foundation
import Testing

/// The CLI as people expect it (issue 17): durations with days and compound units wherever a
/// duration is read, printed as they are read (what `why` suggests can be pasted back),
/// `--version`, completions for bash, zsh and fish, help on every option and argument, and
/// `run --task` taking the type from the identifier's history when its bundle leaves it open.
@Suite struct CLIHabitsTests {
    // MARK: Durations

    /// Every option that takes a duration reads days and compound units, and refuses a bad one
    /// naming the option, the text and the unit at fault (exit 64).
    @Test func everyDurationOptionReadsCompoundUnitsAndNamesWhatIsWrong() throws {
        let missing = FileManager.default.temporaryDirectory.appendingPathComponent("no-such-\(UUID()).app").path
        let nowhere = FileManager.default.temporaryDirectory.appendingPathComponent("no-host-\(UUID())").path
        // (command before the option, option, command after it): with a good value each gets past
        // parsing to what comes next (a missing bundle: 65; no host: 69; a refused history size: 64
        // naming it).
        let cases: [([String], String, [String], Int32)] = [
            (["run", missing, "--task", "a.b:refresh"], "--budget", [], 65),
            (["run", missing, "--task", "a.b:refresh"], "--grace", [], 65),
            (["run", missing, "--task", "a.b:refresh"], "--expire-after", [], 65),
            (["host", "--plugins", "/nonexistent", "--history-per-app", "0"], "--stall", [], 64),
            (["host", "--plugins", "/nonexistent", "--history-per-app", "0"], "--foreground-stay", [], 64),
            (["host", "--plugins", "/nonexistent", "--history-per-app", "0"], "--request-timeout", [], 64),
            (["host", "--plugins", "/nonexistent", "--history-per-app", "0"], "--idle-timeout", [], 64),
            (["host", "--plugins", "/nonexistent", "--history-per-app", "0"], "--budget", [], 64),
            (["progress", "--state", nowhere], "--wait", [], 69),
            (["log", "--state", nowhere], "--last", [], 0),
        ]
        for (before, option, after, expected) in cases {
            for good in ["1d", "1h30m", "2h0m", "250ms", "90"] {
                let result = try runCLI(before + [option, good] + after)
                #expect(result.status == expected, "\(option) \(good): \(result.status) \(result.stderr)")
                #expect(!result.stderr.contains("'\(good)' is invalid"), "\(option) \(good): \(result.stderr)")
            }
            let bad = try runCLI(before + [option, "1h30"] + after)
            #expect(bad.status == 64, "\(option) 1h30")
            #expect(bad.stderr.contains("The value '1h30' is invalid for '\(option) <duration>': '30' after '1h' has no unit"), "\(option): \(bad.stderr)")
        }

        // A positional duration, and the huge, negative and non-finite ones: refused, never a trap.
        for (text, reason) in [("1e308", "unknown unit 'e' after '1'"), ("nan", "it does not start with a number"),
                               ("99999999999999999999d", "longer than the most any duration may be, 36525d (100 years)"),
                               ("1m1h", "'1h' comes after 'm': units go from the largest to the smallest")] {
            let result = try runCLI(["clock", "advance", text, "--state", nowhere])
            #expect(result.status == 64, "clock advance \(text): \(result.status)")
            #expect(result.stderr.contains("The value '\(text)' is invalid for '<duration>': \(reason)"), "clock advance \(text): \(result.stderr)")
        }
        let negative = try runCLI(["run", missing, "--task", "a.b:refresh", "--budget=-5m"])
        #expect(negative.status == 64)
        #expect(negative.stderr.contains("The value '-5m' is invalid for '--budget <duration>': a duration is never negative"), "\(negative.stderr)")
        let earliest = try runCLI(["submit", "a.b", "a.b.c", "--earliest", "+1x", "--state", nowhere])
        #expect(earliest.status == 64)
        #expect(earliest.stderr.contains("neither +DURATION (e.g. +15m, +1h30m, +1d) nor an ISO 8601 date"), "\(earliest.stderr)")
        #expect(earliest.stderr.contains("unknown unit 'x'"), "\(earliest.stderr)")
    }

    /// `submit --earliest +1d` and `+1h30m` work; `why` says how far in the form the CLI reads,
    /// and its suggestion, pasted as it is, makes the request run.
    @Test func whySuggestsAClockAdvanceThatCanBePastedBack() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }

        for (earliest, printed) in [("+1h30m", "1h30m"), ("+1d", "1d"), ("+90s", "1m30s")] {
            let submitted = try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--earliest", earliest])
            #expect(submitted.status == 0, "\(earliest): \(submitted.stderr)")
            let why = try host.cli(["why", "com.example.feed.refresh"])
            #expect(why.stdout.contains(", \(printed) from now (virtual clock: bgtask clock advance \(printed)) [not-due]"), "\(earliest): \(why.stdout)")
        }
        // The last one, pasted back: the request becomes due and runs.
        let why = try host.cli(["why", "com.example.feed.refresh"]).stdout
        let suggestion = try #require(why.range(of: "bgtask clock advance ").map { why[$0.upperBound...].prefix { $0 != ")" } })
        let advance = try host.cli(["clock", "advance", String(suggestion)])
        #expect(advance.status == 0, "bgtask clock advance \(suggestion): \(advance.stderr)")
        let records = try host.waitForHistory(count: 1)
        #expect(records.first?.task("com.example.feed.refresh")?.outcome == .succeeded)
    }

    // MARK: Version, completions, help

    @Test func versionIsPrintedAndDoctorSaysIt() throws {
        let version = try runCLI(["--version"])
        #expect(version.status == 0)
        let text = version.stdout.trimmingCharacters(in: .newlines)
        #expect(text.range(of: #"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$"#, options: .regularExpression) != nil, "\(version.stdout)")
        let doctor = try runCLI(["doctor"])
        #expect(doctor.stdout.hasPrefix("bgtask \(text) on Linux "), "\(doctor.stdout)")
        #expect(try runCLI(["help"]).stdout.contains("--version"))
    }

    /// swift-argument-parser's own completion scripts, for each shell, know every verb and the
    /// values an option takes.
    @Test(arguments: [("bash", "complete -o filenames -F _bgtask bgtask"), ("zsh", "#compdef bgtask"), ("fish", "complete -c 'bgtask'")])
    func completionScriptsAreGeneratedForEachShell(_ shell: String, _ marker: String) throws {
        let result = try runCLI(["--generate-completion-script", shell])
        #expect(result.status == 0, "\(shell): \(result.stderr)")
        #expect(result.stdout.contains(marker), "\(shell) completion lacks \(marker)")
        // (fish names options without their dashes: -l earliest.)
        for word in ["simulate-launch", "cancel-all", "earliest", "low-power", "budget", "zygote", "health-research"] {
            #expect(result.stdout.contains(word), "\(shell) completion lacks \(word)")
        }
        #expect(result.stdout.contains("auto"), "\(shell): device switches complete to on, off, auto")
    }

    /// Every option and argument of every command (hidden ones aside) says what it is for, as
    /// the man page and `--help` show it.
    @Test func everyOptionAndArgumentHasHelp() throws {
        let dump = try runCLI(["--experimental-dump-help"])
        #expect(dump.status == 0)
        let root = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])
        var missing: [String] = []
        var seen = 0
        func walk(_ command: [String: Any], _ path: String) {
            for argument in command["arguments"] as? [[String: Any]] ?? [] where argument["shouldDisplay"] as? Bool != false {
                seen += 1
                let name = (argument["preferredName"] as? [String: Any])?["name"] as? String ?? argument["valueName"] as? String ?? "?"
                if (argument["abstract"] as? String ?? "").isEmpty { missing.append("\(path) \(name)") }
            }
            // ArgumentParser's own `help` command is not ours to document.
            for sub in command["subcommands"] as? [[String: Any]] ?? [] where sub["commandName"] as? String != "help" {
                walk(sub, "\(path) \(sub["commandName"] as? String ?? "?")")
            }
        }
        walk(try #require(root["command"] as? [String: Any]), "bgtask")
        #expect(seen > 100)
        #expect(missing.isEmpty, "no help text: \(missing)")
    }

    // MARK: run --task and the identifier's history

    /// Feed has both fetch and processing: `run --task ID` takes the type from the identifier's
    /// pending request, else from its past launches (from the host, or its database when no
    /// host runs), and refuses, naming what to pass, when there is none or they disagree.
    @Test func runTakesTheTypeFromTheIdentifiersHistory() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")

        // Nothing to go by: the clear error, naming the options.
        let none = try runCLI(["run", app.path, "--task", "com.example.feed.cleanup", "--state", scratch.state.path])
        #expect(none.status == 64)
        #expect(none.stderr.contains("--task com.example.feed.cleanup: the type is ambiguous"), "\(none.stderr)")
        #expect(none.stderr.contains("no host answers on \(scratch.state.path)"), "\(none.stderr)")
        #expect(none.stderr.contains("--task com.example.feed.cleanup:refresh") && none.stderr.contains("--type TYPE"), "\(none.stderr)")

        let host = try HostProcess.started(scratch, installing: [.feed])
        // A pending request says processing.
        #expect(try host.cli(["submit", "com.example.feed", "com.example.feed.cleanup", "--type", "processing", "--earliest", "+1d"]).status == 0)
        let (pending, pendingRun) = try scratch.run(app, ["--task", "com.example.feed.cleanup"])
        #expect(pending.task("com.example.feed.cleanup")?.type == .processing, "\(pendingRun.stderr)")
        #expect(pendingRun.stderr.contains("--task com.example.feed.cleanup: processing, from its pending request (the host at \(scratch.state.path))"), "\(pendingRun.stderr)")

        // Past launches say refresh for the refresh identifier; and both for one run as either.
        for (identifier, type) in [("com.example.feed.refresh", "refresh"), ("com.example.feed.cleanup", "processing")] {
            let launched = try host.cli(["simulate-launch", identifier, "--force", "--type", type])
            #expect(launched.status == 0, "\(identifier): \(launched.stderr)")
        }
        #expect(try host.cli(["cancel-all", "com.example.feed"]).status == 0)
        let (refresh, refreshRun) = try scratch.run(app, ["--task", "com.example.feed.refresh"])
        #expect(refresh.task("com.example.feed.refresh")?.type == .refresh, "\(refreshRun.stderr)")
        #expect(refreshRun.stderr.contains("refresh, from its past launches (the host at \(scratch.state.path))"), "\(refreshRun.stderr)")
        // A launch that ran the cleanup identifier as refresh too (its handler expects a
        // processing task: that launch fails, and its record still says what it ran).
        _ = try host.cli(["simulate-launch", "com.example.feed.cleanup", "--force", "--type", "refresh"])
        let both = try runCLI(["run", app.path, "--task", "com.example.feed.cleanup", "--state", scratch.state.path])
        #expect(both.status == 64)
        #expect(both.stderr.contains("ran it as processing and refresh"), "\(both.stderr)")
        host.stop()

        // No host: its database still tells.
        let (offline, offlineRun) = try scratch.run(app, ["--task", "com.example.feed.refresh"])
        #expect(offline.task("com.example.feed.refresh")?.type == .refresh, "\(offlineRun.stderr)")
        #expect(offlineRun.stderr.contains("from its past launches (\(scratch.state.appendingPathComponent("bgtask.sqlite").path))"), "\(offlineRun.stderr)")
        // An explicit type always wins, and says nothing.
        let (explicit, explicitRun) = try scratch.run(app, ["--task", "com.example.feed.refresh:processing"])
        #expect(explicit.task("com.example.feed.refresh")?.type == .processing)
        #expect(!explicitRun.stderr.contains("from its"), "\(explicitRun.stderr)")
    }

    // MARK: Installation

    /// `make install` with DESTDIR and PREFIX stages the binaries, completions for each shell,
    /// the man page (where swift-argument-parser's generate-manual tool is built) and the unit;
    /// `make uninstall` removes them and keeps the state directory.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/make"), "skipped: make is not installed"))
    func makeInstallAndUninstallStageTheTree() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let stage = scratch.url.appendingPathComponent("stage").path
        let make = ["/usr/bin/make", "-s", "-C", Products.packageRoot.path]
        let variables = ["DESTDIR=\(stage)", "PREFIX=/opt/bgtask", "NO_BUILD=1", "BUILD_DIR=\(Products.directory.path)"]
        let installed = try runCommand(make + ["install"] + variables)
        #expect(installed.status == 0, "\(installed.stderr)")
        let files = FileManager.default
        let prefix = stage + "/opt/bgtask"
        for path in ["bin/bgtask", "bin/bgtask-runner"] {
            #expect(files.isExecutableFile(atPath: "\(prefix)/\(path)"), "\(path)")
        }
        for (path, marker) in [("share/bash-completion/completions/bgtask", "_bgtask"), ("share/zsh/site-functions/_bgtask", "#compdef bgtask"),
                               ("share/fish/vendor_completions.d/bgtask.fish", "complete -c 'bgtask'")] {
            let text = (try? String(contentsOfFile: "\(prefix)/\(path)", encoding: .utf8)) ?? ""
            #expect(text.contains(marker) && text.contains("simulate-launch"), "\(path)")
            #expect(ServiceTests.mode("\(prefix)/\(path)") == 0o644, "\(path)")
        }
        let manual = "\(prefix)/share/man/man1/bgtask.1"
        if files.isExecutableFile(atPath: Products.directory.appendingPathComponent("generate-manual").path) {
            let page = try String(contentsOfFile: manual, encoding: .utf8)
            #expect(page.contains(".Dt BGTASK 1") && page.contains("simulate-launch") && page.contains("--low-power"), "\(manual)")
        } else {
            #expect(installed.stderr.contains("no man page: \(Products.directory.path)/generate-manual is not built"), "\(installed.stderr)")
        }
        let unit = try String(contentsOfFile: "\(stage)/etc/systemd/system/bgtask.service", encoding: .utf8)
        #expect(unit.contains("\nExecStart=/opt/bgtask/bin/bgtask host --plugins /var/lib/bgtask/plugins --state /var/lib/bgtask"))
        #expect(unit.contains("\nRestart=on-failure\n"))

        let removed = try runCommand(make + ["uninstall"] + variables)
        #expect(removed.status == 0, "\(removed.stderr)")
        for path in ["bin/bgtask", "bin/bgtask-runner", "share/bash-completion/completions/bgtask", "share/zsh/site-functions/_bgtask",
                     "share/fish/vendor_completions.d/bgtask.fish", "share/man/man1/bgtask.1", "share/doc/bgtask"] {
            #expect(!files.fileExists(atPath: "\(prefix)/\(path)"), "\(path) left after uninstall")
        }
        #expect(!files.fileExists(atPath: "\(stage)/etc/systemd/system/bgtask.service"))
        #expect(files.fileExists(atPath: "\(stage)/var/lib/bgtask/plugins"), "the state directory is kept")
        #expect(removed.stderr.contains("kept \(stage)/var/lib/bgtask"), "\(removed.stderr)")
    }
}

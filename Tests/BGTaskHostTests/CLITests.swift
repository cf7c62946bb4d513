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
        #expect(badDevice.stderr.contains("on, off or auto"))
        let noHost = try runCLI(["apps", "--state", FileManager.default.temporaryDirectory.appendingPathComponent("no-host-\(UUID())").path])
        #expect(noHost.status == 69)
        #expect(noHost.stderr.contains("no bgtask host is listening"))
    }
}

import ArgumentParser
import BGTaskHost
import Foundation
import Glibc

/// `swift run -c release bgtask-bench [--quick] [--json]`: issue 6's benchmark. Every figure is
/// measured against a floor taken in the same run, with real processes and the product's code.
struct BGTaskBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bgtask-bench",
        abstract: "Measure launches, limits, submissions and the idle host against floors taken in the same run.",
        discussion: """
            Prints a table (and with --json one JSON object on stdout; the table then goes to \
            stderr). Builds the products it drives (bgtask, bgtask-runner, libBenchPlugin.so) \
            first unless --no-build. Set BGTASK_BENCH_CGROUP to a delegated cgroup v2 directory \
            to measure the cgroup jetsam mechanism too. See BENCHMARKS.md.
            """)

    enum Section: String, CaseIterable, ExpressibleByArgument {
        case launch, limits, submit, pending
    }

    @Flag(help: "Fewer iterations and 100,000 pending requests instead of 1,000,000 (under 2 minutes).")
    var quick = false

    @Flag(help: "Print one JSON object on stdout (the table goes to stderr).")
    var json = false

    @Flag(name: .customLong("no-build"), help: "Do not run `swift build` for the products the bench drives.")
    var noBuild = false

    @Option(help: ArgumentHelp("Where the scratch directory goes (the disk the SQLite figures are about).", valueName: "dir"))
    var scratch: String = FileManager.default.temporaryDirectory.path

    @Flag(help: "Keep the scratch directory.")
    var keep = false

    @Option(parsing: .upToNextOption, help: "Run only these sections (launch, limits, submit, pending).")
    var only: [Section] = []

    func run() throws {
        let iterations = quick ? Iterations.quickRun : Iterations.full
        try Products.ensure(rebuild: !noBuild)
        let begun = monotonicNs()
        if Products.configuration != "release" {
            progress("warning: a \(Products.configuration) build; the figures mean something only for -c release")
        }

        var template = Array("\(scratch)/bgtask-bench-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw BenchError("cannot create a scratch directory in \(scratch)") }
        let root = URL(fileURLWithPath: String(cString: made))
        defer {
            if keep { progress("scratch kept: \(root.path)") } else { try? FileManager.default.removeItem(at: root) }
        }
        // Launch children of this process must not inherit a launch id from ours.
        unsetenv("BGTASK_LAUNCH_ID")

        let machine = Machine.describe(scratch: root)
        let report = Report()
        report.set("mode", .string(quick ? "quick" : "full"))
        report.set("machine", .object([
            ("nproc", .int(machine.cores)), ("cpu", .string(machine.cpu)), ("kernel", .string(machine.kernel)),
            ("swift", .string(machine.swift)), ("memory", .string(machine.memory)), ("build", .string(machine.build)),
            ("scratch", .string(machine.scratch)), ("scratch_fs", .string(machine.scratchDevice)), ("loadavg_at_start", .string(machine.load)),
        ]))
        let header = """
            bgtask-bench \(quick ? "--quick (fewer iterations; \(count(iterations.pending)) pending requests instead of 1,000,000)" : "(full run)")
            machine: \(machine.cores) cores, \(machine.cpu), \(machine.memory), Linux \(machine.kernel), \(machine.swift), \(machine.build) build
            scratch: \(machine.scratch) on \(machine.scratchDevice); load average at start \(machine.load)
            """
        progress(header.replacingOccurrences(of: "\n", with: "\n             "))

        let sections = Section.allCases.filter { only.isEmpty || only.contains($0) }
        let runner = SectionRunner(report: report, iterations: iterations, root: root)
        for section in sections {
            let t0 = monotonicNs()
            switch section {
            case .launch: try runner.launch()
            case .limits: try runner.limits()
            case .submit: try runner.submit()
            case .pending: try runner.pending()
            }
            progress("\(section.rawValue): done in \(String(format: "%.1f", seconds(since: t0))) s")
        }

        let total = seconds(since: begun)
        report.set("duration_s", total, 1)
        report.note("bench wall time \(String(format: "%.1f", total)) s (\(quick ? "--quick" : "full run")), build excluded")
        let text = header + "\n\n" + report.table + "\n"
        if json {
            FileHandle.standardError.write(Data(text.utf8))
            print(report.json)
        } else {
            print(text, terminator: "")
        }
    }
}

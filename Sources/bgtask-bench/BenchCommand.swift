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
        case launch, limits, submit, pending, e2e, scale, confinement, transfer, dashboard
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

    @Option(parsing: .upToNextOption, help: "Run only these sections (launch, limits, submit, pending, e2e, scale, confinement, transfer, dashboard).")
    var only: [Section] = []

    @Option(name: .customLong("scale-sizes"), parsing: .upToNextOption, help: ArgumentHelp(
        "Launches at once in the scale section (default 10 100 1000; 10 50 with --quick).", valueName: "n"))
    var scaleSizes: [Int] = []

    @Option(name: .customLong("profile-launches"), help: ArgumentHelp(
        "Only run this many no-op zygote launches back to back and print their rate: a steady load to profile (perf record -p, -a).",
        valueName: "n"))
    var profileLaunches: Int?

    @Option(name: .customLong("profile-submissions"), help: ArgumentHelp(
        "Only run pipelined submissions (4 threads, 64 in flight each) to a host with 1,000 apps for this many seconds, and print their rate and CPU: a steady load to profile.",
        valueName: "seconds"))
    var profileSubmissions: Double?

    @Option(name: .customLong("profile-drain"), help: ArgumentHelp(
        "Only submit every one of 200 apps' requests at once to a host (immediate policy, --max-launches 2) this many times, each drained to its last handler, and print the launches/s and the host's CPU per launch: a steady load to profile.",
        valueName: "rounds"))
    var profileDrain: Int?

    func run() throws {
        var iterations = quick ? Iterations.quickRun : Iterations.full
        if !scaleSizes.isEmpty { iterations.scaleSizes = scaleSizes }
        try Products.ensure(rebuild: !noBuild)
        let begun = monotonicNs()
        if Products.configuration != "release" {
            progress("warning: a \(Products.configuration) build; the figures mean something only for -c release")
        }

        var template = Array("\(scratch)/bgtask-bench-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw BenchError("cannot create a scratch directory in \(scratch)") }
        let root = URL(fileURLWithPath: String(cString: made))
        // mkdtemp makes it 0700; launches run as their app's uid (this process is root) and must
        // reach their bundles and containers through it, as through a host's state directory.
        chmod(made, 0o711)
        defer {
            if keep { progress("scratch kept: \(root.path)") } else { try? FileManager.default.removeItem(at: root) }
        }
        // Launch children of this process must not inherit a launch id from ours.
        unsetenv("BGTASK_LAUNCH_ID")
        if let profileSubmissions {
            try Self.profileSubmissions(profileSubmissions, root: root)
            return
        }
        if let profileLaunches {
            try Self.profile(profileLaunches, root: root)
            return
        }
        if let profileDrain {
            try Self.profileDrain(profileDrain, root: root)
            return
        }

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
            case .e2e: try runner.endToEnd()
            case .scale: try runner.scale()
            case .confinement: try runner.confinement()
            case .transfer: try runner.transfer()
            case .dashboard: try runner.dashboard()
            }
            progress("\(section.rawValue): done in \(String(format: "%.1f", seconds(since: t0))) s")
        }

        let total = seconds(since: begun)
        report.set("duration_s", total, 1)
        // Other work on the machine skews every figure: how loaded it was when the run ended.
        let loadAtEnd = ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "").split(separator: " ").prefix(3).joined(separator: " ")
        report.set("loadavg_at_end", .string(loadAtEnd))
        report.note("load average at the end \(loadAtEnd) (at the start \(machine.load)); 2 cores: above 1 another process shared them")
        report.note("bench wall time \(String(format: "%.1f", total)) s (\(quick ? "--quick" : "full run")), build excluded")
        let text = header + "\n\n" + report.table + "\n"
        if json {
            FileHandle.standardError.write(Data(text.utf8))
            print(report.json)
        } else {
            print(text, terminator: "")
        }
    }

    /// `--profile-launches N`: N no-op zygote launches back to back, and where each one's time
    /// went (p50 of each phase, from the supervisor's start timestamp).
    static func profile(_ n: Int, root: URL) throws {
        let bench = try LaunchBench(root: root, launcher: .zygote)
        defer { bench.stop() }
        for _ in 0..<3 { _ = try bench.noop() }
        var entered = Samples(), completed = Samples(), reaped = Samples(), returned = Samples(), period = Samples()
        /// CPU of this process and its reaped children (runners, spares, the zygote once
        /// stopped), µs: less at the mercy of other load than the wall clock.
        func cpuUs() -> Double {
            var mine = rusage(), children = rusage()
            getrusage(RUSAGE_SELF.rawValue, &mine)
            getrusage(RUSAGE_CHILDREN.rawValue, &children)
            return [mine.ru_utime, mine.ru_stime, children.ru_utime, children.ru_stime]
                .reduce(0) { $0 + Double($1.tv_sec) * 1e6 + Double($1.tv_usec) }
        }
        let cpu0 = cpuUs()
        let t0 = monotonicNs()
        var last = t0
        for _ in 0..<n {
            let launch = try bench.noop()
            let now = monotonicNs()
            let record = launch.record
            entered.append(record.tasks[0].startedMs! * 1000)
            completed.append((record.tasks[0].completedMs ?? .nan) * 1000)
            reaped.append(record.wallMs * 1000)
            returned.append(Date().timeIntervalSince(record.startedAt) * 1e6)
            period.append(Double(now - last) / 1000)
            last = now
        }
        let rate = Double(n) / seconds(since: t0)
        bench.stop()
        let cpu = (cpuUs() - cpu0) / Double(n)
        func us(_ samples: Samples) -> String { "\(Int(samples.p50.rounded())) µs (p99 \(Int(samples.p99.rounded())))" }
        print("""
            \(n) no-op zygote launches: \(Int(rate.rounded()))/s, one every \(us(period)), \(Int(cpu.rounded())) µs of CPU each; from the launch's start (p50):
              handler entered  \(us(entered))
              task completed   \(us(completed))
              runner reaped    \(us(reaped))
              run() returned   \(us(returned))
            """)
    }

    /// `--profile-submissions SECONDS`: the pipelined submission load alone.
    static func profileSubmissions(_ duration: Double, root: URL) throws {
        let workload = SubmitWorkload(apps: 1_000)
        let plugins = root.appendingPathComponent("plugins")
        try workload.makeBundles(in: plugins)
        let host = HostProcess(plugins: plugins, state: root.appendingPathComponent("state"),
                               log: root.appendingPathComponent("host.log"), arguments: ["--clock", "real"])
        try host.start()
        defer { host.stop() }
        var before = rusage(), after = rusage()
        getrusage(RUSAGE_SELF.rawValue, &before)
        let result = workload.submit(threads: 4, duration: duration, mode: .pipelined(window: 64), state: host.state, hostPID: host.pid)
        getrusage(RUSAGE_SELF.rawValue, &after)
        func us(_ t: timeval) -> Double { Double(t.tv_sec) * 1e6 + Double(t.tv_usec) }
        let client = (us(after.ru_utime) + us(after.ru_stime) - us(before.ru_utime) - us(before.ru_stime)) / Double(max(result.acknowledged, 1))
        print(String(format: "%.0f submissions/s (pipelined, 4 threads × 64), host CPU %.1f µs and client CPU %.1f µs each, %d refused",
                     result.perSecond, result.hostCPUPerSubmitUs, client, result.refused))
    }

    /// `--profile-drain ROUNDS`: the e2e section's sustained load alone (200 apps due at once,
    /// drained), with the host's CPU per launch from its threads' schedstat.
    static func profileDrain(_ rounds: Int, root: URL) throws {
        raiseDescriptorLimit()
        let apps = Iterations.full.e2eApps
        let inProcess = try LaunchBench(root: root.appendingPathComponent("inprocess"), launcher: .zygote)
        let floor = try inProcess.throughput(Iterations.full.launchThroughput, threads: 2).perSecond
        inProcess.stop()
        let e2e = try EndToEndHost(root: root.appendingPathComponent("drain"), apps: apps)
        defer { e2e.stop() }
        // One round unmeasured: the host's first launches of each app (its caches, the zygote's spares).
        var rates = Samples(), hostCPU = Samples()
        for round in 0...max(rounds, 1) {
            for fifo in e2e.fifos.values { _ = fifo.take() }
            let batch = e2e.apps.map { EndToEndHost.submission($0, "bench.stamp") }
            let cpu0 = ProcStat.cpuNanoseconds(e2e.host.pid)
            let t0 = monotonicNs()
            let responses = try e2e.client.send(batch, window: 256)
            guard responses.allSatisfy(\.ok) else { throw BenchError("submit refused: \(responses.first { !$0.ok }?.error?.message ?? "?")") }
            let stamps = collectStamps(Array(e2e.fifos.values), what: .handler, count: apps, timeout: 120)
            let last = stamps.map(\.stamp.monotonicNs).max() ?? monotonicNs()
            usleep(300_000) // the last launches end and are recorded
            let cpu = Double(ProcStat.growth(from: cpu0, to: ProcStat.cpuNanoseconds(e2e.host.pid))) / 1000 / Double(max(stamps.count, 1))
            if stamps.count < apps { progress("only \(stamps.count) of \(apps) handlers entered") }
            guard round > 0 else { continue }
            rates.append(Double(stamps.count) / (Double(last - t0) / 1e9))
            hostCPU.append(cpu)
        }
        print(String(format: "%d apps due at once, %d rounds: %.0f launches/s (p50; min %.0f, max %.0f), %.1f %% of in-process launches on 2 threads (%.0f/s); host CPU %.0f µs per launch (p50; min %.0f)",
                     apps, rounds, rates.p50, rates.min, rates.max, rates.p50 / floor * 100, floor, hostCPU.p50, hostCPU.min))
    }
}

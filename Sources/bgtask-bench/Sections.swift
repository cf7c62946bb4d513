import BGTaskControl
import BGTaskHost
import BGTaskStore
import BGTaskLaunch
import BGTaskModel
import Foundation
import Glibc

/// The four sections of the run; each measures its figures and their floors back to back.
struct SectionRunner {
    let report: Report
    let iterations: Iterations
    let root: URL

    // MARK: Launch latency and throughput

    struct LauncherFigures {
        var latency: (start: Samples, call: Samples)
        var sequential: LaunchBench.Throughput
        var concurrent: LaunchBench.Throughput
    }

    func launch() throws {
        report.section("launch: fork floor vs LaunchSupervisor.run of the BenchPlugin, through the zygote (default) and posix_spawn (fallback)")
        let n = iterations
        progress("launch: fork floor (\(n.forkLatency) × fork + _exit + waitpid)")
        let fork = try Floors.forkLatency(n.forkLatency)
        let benchRSS = ProcStat.rss(getpid()).map { Double($0) } ?? .nan
        progress("launch: fork throughput (\(n.forkThroughput) forks, sequential and 2 threads)")
        let forkSeq = Floors.forkThroughput(n.forkThroughput, threads: 1)
        let forkC2 = Floors.forkThroughput(n.forkThroughput, threads: 2)
        let smallParent = Floors.smallParentFork(n.forkLatency)

        var figures: [LaunchBench.Launcher: LauncherFigures] = [:]
        var zygoteRSS = Double.nan
        var unconfined: Samples?
        for launcher in [LaunchBench.Launcher.zygote, .spawn] {
            let bench = try LaunchBench(root: root.appendingPathComponent("launch-\(launcher.rawValue)"), launcher: launcher)
            defer { bench.stop() }
            progress("launch (\(launcher.rawValue)): \(n.launchLatency) no-op launches for latency, then \(n.launchThroughput) sequential and \(n.launchThroughput) on 2 threads")
            let latency = try bench.latency(n.launchLatency)
            if launcher == .zygote, let zygote = ProcStat.children(of: getpid()).first(where: { ProcStat.commandLine($0).contains("--zygote") }) {
                zygoteRSS = ProcStat.rss(zygote).map { Double($0) } ?? .nan
            }
            let sequential = try bench.throughput(n.launchThroughput, threads: 1)
            let concurrent = try bench.throughput(n.launchThroughput, threads: 2)
            figures[launcher] = LauncherFigures(latency: latency, sequential: sequential, concurrent: concurrent)
            if launcher == .zygote {
                // What confinement costs: the same launches with --no-sandbox.
                let open = try LaunchBench(root: root.appendingPathComponent("launch-zygote-unconfined"), launcher: .zygote, confined: false)
                defer { open.stop() }
                progress("launch (zygote, --no-sandbox): \(n.launchLatency) no-op launches for latency")
                unconfined = try open.latency(n.launchLatency).start
            }
            for (name, result) in [("sequential", sequential), ("concurrency 2", concurrent)] where result.failures > 0 {
                report.note("\(launcher.rawValue) launch throughput, \(name): \(result.failures) of \(n.launchThroughput) no-op launches failed (not counted in the rate); first:\n      \(result.firstFailure?.replacingOccurrences(of: "\n", with: "\n      ") ?? "?")")
            }
        }

        let floor = fork.p50
        report.set("fork_floor_p50_us", floor, 1)
        report.set("fork_floor_p99_us", fork.p99, 1)
        report.set("fork_floor_samples", .int(fork.count))
        report.set("fork_floor_parent_rss_mib", benchRSS / 1_048_576, 1)
        report.set("fork_floor_small_parent_us", smallParent, 1)
        report.set("fork_throughput_per_s", forkSeq, 1)
        report.set("fork_throughput_c2_per_s", forkC2, 1)
        report.set("launch_launcher", .string("zygote"))
        report.set("zygote_rss_mib", zygoteRSS / 1_048_576, 1)
        for launcher in [LaunchBench.Launcher.zygote, .spawn] {
            guard let f = figures[launcher] else { continue }
            // The host's default launcher (zygote) gets the issue's keys; the fallback is prefixed.
            let prefix = launcher == .zygote ? "launch" : "launch_spawn"
            report.set("\(prefix)_p50_us", f.latency.start.p50, 1)
            report.set("\(prefix)_p50_over_floor", f.latency.start.p50 / floor, 2)
            report.set("\(prefix)_p99_us", f.latency.start.p99, 1)
            report.set("\(prefix)_p99_over_floor", f.latency.start.p99 / floor, 2)
            report.set("\(prefix)_samples", .int(f.latency.start.count))
            report.set("\(prefix)_from_call_p50_us", f.latency.call.p50, 1)
            report.set("\(prefix)_from_call_p99_us", f.latency.call.p99, 1)
            report.set("\(prefix)_throughput_per_s", f.sequential.perSecond, 1)
            report.set("\(prefix)_throughput_over_floor", f.sequential.perSecond / forkSeq, 3)
            report.set("\(prefix)_throughput_c2_per_s", f.concurrent.perSecond, 1)
            report.set("\(prefix)_throughput_c2_over_floor", f.concurrent.perSecond / forkC2, 3)
            report.set("\(prefix)_throughput_failures", .int(f.sequential.failures + f.concurrent.failures))
        }

        report.row("fork floor p50 (fork+_exit+waitpid, this process)", us(floor), ratio: "RSS \(mib(benchRSS))", target: "floor")
        report.row("fork floor mean, small C parent (dash subshell)", us(smallParent), ratio: times(floor / smallParent) + " below", target: "context")
        for launcher in [LaunchBench.Launcher.zygote, .spawn] {
            guard let f = figures[launcher] else { continue }
            let p50 = f.latency.start.p50, p99 = f.latency.start.p99, call = f.latency.call.p50
            let isDefault = launcher == .zygote
            let name = launcher.rawValue + (isDefault ? "" : ", fallback")
            report.row("launch p50 (\(name): start → handler)", us(p50), floor: "fork p50 \(us(floor))", ratio: times(p50 / floor),
                       target: "≤ 2× floor", verdict: verdict(p50 <= 2 * floor, missedBy: times(p50 / (2 * floor)) + " over"))
            report.row("launch p99 (\(name): start → handler)", us(p99), floor: "fork p50 \(us(floor))", ratio: times(p99 / floor),
                       target: "≤ 3× floor", verdict: verdict(p99 <= 3 * floor, missedBy: times(p99 / (3 * floor)) + " over"))
            report.row("launch p50 (\(name): run() called → handler)", us(call), floor: "fork p50 \(us(floor))", ratio: times(call / floor),
                       target: "(+ pre-spawn setup)")
            let seq = f.sequential.perSecond, c2 = f.concurrent.perSecond
            report.row("no-op launches/s (\(name)), sequential", perSecond(seq), floor: "forks/s \(perSecond(forkSeq))",
                       ratio: pct(seq / forkSeq * 100), target: "≥ 50 % of floor", verdict: verdict(seq >= forkSeq / 2))
            report.row("no-op launches/s (\(name)), concurrency 2", perSecond(c2), floor: "forks/s \(perSecond(forkC2))",
                       ratio: pct(c2 / forkC2 * 100), target: "≥ 50 % of floor", verdict: verdict(c2 >= forkC2 / 2))
            if isDefault, let unconfined {
                report.row("launch p50 (zygote, --no-sandbox)", us(unconfined.p50), floor: "fork p50 \(us(floor))", ratio: times(unconfined.p50 / floor),
                           target: "confinement adds \(us(p50 - unconfined.p50))")
                report.row("launch p99 (zygote, --no-sandbox)", us(unconfined.p99), floor: "fork p50 \(us(floor))", ratio: times(unconfined.p99 / floor),
                           target: "confinement adds \(us(p99 - unconfined.p99))")
                report.set("launch_unconfined_p50_us", unconfined.p50, 1)
                report.set("launch_unconfined_p99_us", unconfined.p99, 1)
            }
        }
    }

    // MARK: Expiration, watchdog, jetsam

    func limits() throws {
        report.section("limits: expiration, watchdog and jetsam of real launches (zygote) vs this machine's timer and kill floors")
        let n = iterations
        // Through the host's default launcher.
        let bench = try LaunchBench(root: root.appendingPathComponent("limits"), launcher: .zygote)
        defer { bench.stop() }
        report.set("limits_launcher", .string(bench.launcher.rawValue))

        progress("limits: timer and kill floors (\(n.timerFloor) × 50 ms deadlines each)")
        let timer = Floors.timerLateness(n.timerFloor)
        let killFloor = Floors.killLateness(n.timerFloor)

        progress("limits: \(n.expiry) launches with 1 s budgets (expiration handler completes the task)")
        let expiry = try bench.expiryLateness(n.expiry)
        progress("limits: \(n.watchdog) launches blocked in pause(), 200 ms budget + 200 ms grace")
        let watchdog = try bench.watchdogLateness(n.watchdog)

        progress("limits: \(n.jetsam) launches touching memory under a 64 MiB limit (sampler)")
        let touch = Floors.touchRate()
        // A spawned runner's ru_maxrss starts at this process's high-water RSS (Linux copies ru_maxrss across fork and exec; BENCHMARKS.md),
        // and the record's peak_rss_bytes includes it: it must be below the limit to mean anything.
        let benchPeak = Double(ProcStat.peakRSS(getpid()) ?? 0)
        let sampler = try bench.jetsamOvershoot(n.jetsam, cgroup: nil)
        var cgroup: (samples: Samples, mechanism: String)?
        var cgroupSkipped: String?
        if let directory = ProcessInfo.processInfo.environment["BGTASK_BENCH_CGROUP"], !directory.isEmpty {
            let url = URL(fileURLWithPath: directory)
            do {
                try LaunchSupervisor.validateCgroupRoot(url)
                progress("limits: \(n.jetsam) launches touching memory under a 64 MiB limit (cgroup \(directory))")
                let measured = try bench.jetsamOvershoot(n.jetsam, cgroup: url)
                if measured.mechanism == "cgroup" { cgroup = measured } else { cgroupSkipped = "the supervisor fell back to the sampler under \(directory)" }
            } catch {
                cgroupSkipped = "BGTASK_BENCH_CGROUP=\(directory) is not usable: \(error)"
            }
        } else {
            cgroupSkipped = "BGTASK_BENCH_CGROUP is not set (name a delegated cgroup v2 directory with +memory to measure it)"
        }

        report.set("timer_floor_late_p50_ms", timer.p50)
        report.set("timer_floor_late_p99_ms", timer.p99)
        report.set("kill_floor_late_p99_ms", killFloor.p99)
        report.set("expiry_late_p50_ms", expiry.p50)
        report.set("expiry_late_p99_ms", expiry.p99)
        report.set("expiry_late_max_ms", expiry.max)
        report.set("expiry_late_p99_over_floor", expiry.p99 / timer.p99, 2)
        report.set("expiry_samples", .int(expiry.count))
        report.set("watchdog_late_p50_ms", watchdog.p50)
        report.set("watchdog_late_p99_ms", watchdog.p99)
        report.set("watchdog_late_max_ms", watchdog.max)
        report.set("watchdog_late_p99_over_floor", watchdog.p99 / killFloor.p99, 2)
        report.set("watchdog_samples", .int(watchdog.count))
        report.set("touch_rate_gib_per_s", touch, 2)
        report.set("jetsam_bench_peak_rss_mib", benchPeak / 1_048_576, 1)
        if benchPeak >= Double(64 << 20) {
            report.note("this process's peak RSS (\(mib(benchPeak))) is over the 64 MiB limit: the jetsam peaks are inflated by it (ru_maxrss after posix_spawn)")
        }
        func overshoot(_ samples: Samples) -> JSON {
            .object([("max", .num(samples.max, 2)), ("p50", .num(samples.p50, 2)), ("runs", .int(samples.count))])
        }
        report.set("jetsam_peak_over_limit_pct", .object([
            ("sampler", overshoot(sampler.samples)),
            ("cgroup", cgroup.map { overshoot($0.samples) } ?? .object([("skipped", .string(cgroupSkipped ?? ""))])),
        ]))
        report.set("jetsam_peak_over_limit_pct_sampler", sampler.samples.max, 2)
        report.set("jetsam_peak_over_limit_pct_cgroup", cgroup.map { JSON.num($0.samples.max, 2) } ?? .null)

        report.row("timer floor lateness p50 / p99 (poll 50 ms)", "\(ms(timer.p50)) / \(ms(timer.p99))", target: "floor")
        report.row("expiry lateness p50 (1 s budget)", ms(expiry.p50), floor: "timer p50 \(ms(timer.p50))", ratio: times(expiry.p50 / timer.p50))
        report.row("expiry lateness p99 (1 s budget)", ms(expiry.p99), floor: "timer p99 \(ms(timer.p99))", ratio: times(expiry.p99 / timer.p99),
                   target: "p99 ≤ 5 ms", verdict: verdict(expiry.p99 <= 5, missedBy: ms(expiry.p99 - 5) + " over"))
        report.row("kill floor p99 (deadline → SIGKILL → reaped)", ms(killFloor.p99), target: "floor")
        report.row("watchdog lateness p99 (grace end → reaped)", ms(watchdog.p99), floor: "kill p99 \(ms(killFloor.p99))",
                   ratio: times(watchdog.p99 / killFloor.p99), target: "p99 ≤ 5 ms", verdict: verdict(watchdog.p99 <= 5, missedBy: ms(watchdog.p99 - 5) + " over"))
        report.row("memory touch rate (mmap+memset, 1 thread)", String(format: "%.2f GiB/s", touch), target: "context")
        report.row("jetsam peak over 64 MiB, sampler: max / p50", "\(pct(sampler.samples.max)) / \(pct(sampler.samples.p50))", floor: "0 %",
                   target: "≤ 10 %", verdict: verdict(sampler.samples.max <= 10, missedBy: pct(sampler.samples.max - 10) + " over"))
        if let cgroup {
            report.row("jetsam peak over 64 MiB, cgroup: max / p50", "\(pct(cgroup.samples.max)) / \(pct(cgroup.samples.p50))", floor: "0 %",
                       target: "≤ 10 %", verdict: verdict(cgroup.samples.max <= 10, missedBy: pct(cgroup.samples.max - 10) + " over"))
        } else {
            report.row("jetsam peak over 64 MiB, cgroup", "skipped", target: "≤ 10 %", verdict: "n/a")
            report.note("cgroup jetsam skipped: \(cgroupSkipped ?? "")")
        }
    }

    // MARK: Submissions

    func submit() throws {
        report.section("submit: acknowledged durable submissions over the control socket vs raw SQLite inserts on the same disk")
        let n = iterations
        let directory = root.appendingPathComponent("submit")
        progress("submit: SQLite floors (\(count(n.sqliteBatchedRows)) rows in 1,000-row transactions; one-row transactions for \(n.sqliteSingleSeconds) s)")
        let batched = try SQLiteFloor.batched(in: directory.appendingPathComponent("floor-batched"), rows: n.sqliteBatchedRows)
        let single = try SQLiteFloor.singleRow(in: directory.appendingPathComponent("floor-single"), duration: n.sqliteSingleSeconds)
        progress("submit: PendingRequestStore.submit in-process from \(n.submitThreads) threads for \(n.resubmitSeconds) s")
        let storeOnly = try storeSubmitRate(in: directory.appendingPathComponent("store-only"), threads: n.submitThreads, duration: n.resubmitSeconds)

        let workload = SubmitWorkload(apps: n.submitApps)
        let plugins = directory.appendingPathComponent("plugins")
        try workload.makeBundles(in: plugins)
        let host = HostProcess(plugins: plugins, state: directory.appendingPathComponent("state"),
                               log: directory.appendingPathComponent("host.log"), arguments: ["--clock", "real"])
        progress("submit: starting a host with \(count(n.submitApps)) apps")
        try host.start()
        defer { host.stop() }

        let window = 64
        progress("submit: \(n.submitThreads) threads, pipelined (ControlClient.send(_:window: \(window))), for \(n.submitSeconds) s")
        let pipelined = workload.submit(threads: n.submitThreads, duration: n.submitSeconds, mode: .pipelined(window: window), state: host.state, hostPID: host.pid)
        progress("submit: \(n.submitThreads) threads, one connection per request, then one request at a time on a kept connection, for \(n.resubmitSeconds) s each")
        let perRequest = workload.submit(threads: n.submitThreads, duration: n.resubmitSeconds, mode: .connectionPerRequest, state: host.state, hostPID: host.pid)
        let persistent = workload.submit(threads: n.submitThreads, duration: n.resubmitSeconds, mode: .persistent, state: host.state, hostPID: host.pid)
        progress("submit: \(n.submitClients) clients, one connection per request, for \(n.resubmitSeconds) s")
        let many = workload.submit(threads: n.submitClients, duration: n.resubmitSeconds, mode: .connectionPerRequest, state: host.state, hostPID: host.pid)
        let modes = [("pipelined", pipelined), ("connection per request", perRequest), ("kept connection", persistent), ("\(n.submitClients) clients", many)]
        for (name, result) in modes where result.refused > 0 {
            report.note("submit (\(name)): \(result.refused) refused, first: \(result.firstRefusal ?? "?")")
        }
        let pending = try countPending(state: host.state)

        usleep(2_000_000) // connection threads and idle dispatch workers end
        progress("submit: idle host CPU for \(n.idleSeconds) s (\(count(pending)) requests pending, real clock, nothing due)")
        let idle = host.idle(for: n.idleSeconds)

        report.set("submit_per_s", pipelined.perSecond, 1)
        report.set("submit_threads", .int(n.submitThreads))
        report.set("submit_window", .int(window))
        report.set("submit_acknowledged", .int(pipelined.acknowledged))
        report.set("sqlite_floor_per_s", batched, 1)
        report.set("sqlite_floor_1tx_per_s", single, 1)
        report.set("submit_over_floor", pipelined.perSecond / batched, 4)
        report.set("submit_host_cpu_us", pipelined.hostCPUPerSubmitUs, 1)
        report.set("submit_connection_per_request_per_s", perRequest.perSecond, 1)
        report.set("submit_connection_per_request_host_cpu_us", perRequest.hostCPUPerSubmitUs, 1)
        report.set("submit_kept_connection_per_s", persistent.perSecond, 1)
        report.set("submit_many_clients_per_s", many.perSecond, 1)
        report.set("submit_many_clients", .int(n.submitClients))
        report.set("store_submit_per_s", storeOnly, 1)
        report.set("idle_cpu_pct", idle.cpuPercent, 3)
        report.set("idle_wakeups_per_s", idle.wakeupsPerSecond, 2)
        report.set("idle_seconds", n.idleSeconds, 1)

        report.row("SQLite floor, 1,000 rows per transaction", perSecond(batched), target: "floor")
        report.row("SQLite floor, 1 row per transaction", perSecond(single), target: "floor")
        report.row("submissions/s (\(n.submitThreads) threads, pipelined \(window) at a time)", perSecond(pipelined.perSecond),
                   floor: "batched \(perSecond(batched))", ratio: pct(pipelined.perSecond / batched * 100),
                   target: "≥ 20,000/s and ≥ 50 %",
                   verdict: verdict(pipelined.perSecond >= 20_000 && pipelined.perSecond >= batched / 2,
                                    missedBy: pipelined.perSecond >= 20_000
                                        ? String(format: "%.0f %% of the floor", pipelined.perSecond / batched * 100)
                                        : String(format: "%.1f× short of 20,000/s", 20_000 / pipelined.perSecond)))
        report.row("  host CPU per acknowledged submission", us(pipelined.hostCPUPerSubmitUs), target: "context")
        report.row("submissions/s (\(n.submitThreads) threads, a connection per request)", perSecond(perRequest.perSecond),
                   floor: "1 row/tx \(perSecond(single))", ratio: pct(perRequest.perSecond / single * 100), target: "context")
        report.row("  host CPU per acknowledged submission", us(perRequest.hostCPUPerSubmitUs), target: "context")
        report.row("submissions/s (\(n.submitThreads) threads, one at a time on a kept connection)", perSecond(persistent.perSecond),
                   floor: "1 row/tx \(perSecond(single))", ratio: pct(persistent.perSecond / single * 100), target: "context")
        report.row("submissions/s (\(n.submitClients) clients, a connection per request)", perSecond(many.perSecond),
                   floor: "1 row/tx \(perSecond(single))", ratio: pct(many.perSecond / single * 100), target: "context")
        report.row("  PendingRequestStore.submit in-process (no host), \(n.submitThreads) threads", perSecond(storeOnly), floor: "1 row/tx \(perSecond(single))",
                   ratio: pct(storeOnly / single * 100), target: "context")
        report.row("idle host CPU (\(Int(n.idleSeconds)) s, real clock, \(count(pending)) pending)", String(format: "%.3f %%", idle.cpuPercent),
                   floor: "0 %", ratio: String(format: "%.1f wakeups/s", idle.wakeupsPerSecond), target: "≈ 0",
                   verdict: verdict(idle.cpuPercent < 0.1))
    }

    // MARK: Pending requests at scale

    func pending() throws {
        let n = iterations
        let workload = PendingWorkload(count: n.pending, apps: n.pendingApps)
        report.section("pending: a host with \(count(n.pending)) pending requests across \(count(n.pendingApps)) apps vs an empty host")
        let directory = root.appendingPathComponent("pending")

        // The floor: an empty host (no bundles, an empty store).
        progress("pending: empty host")
        let emptyPlugins = directory.appendingPathComponent("empty-plugins")
        try FileManager.default.createDirectory(at: emptyPlugins, withIntermediateDirectories: true)
        let empty = HostProcess(plugins: emptyPlugins, state: directory.appendingPathComponent("empty-state"),
                                log: directory.appendingPathComponent("empty-host.log"), arguments: ["--clock", "virtual"])
        try empty.start()
        usleep(1_000_000)
        let emptyRSS = ProcStat.rss(empty.pid).map { Double($0) } ?? .nan
        let emptyStore = try PendingRequestStore(directory: empty.state)
        let emptyNextDue = try timeCalls(n.lookups) { _ = try emptyStore.nextDueDate(after: Date()) }
        let emptyStatus = try timeCalls(n.lookups / 4) { _ = try empty.client.send(.status) }
        let emptyClock = try timeCalls(n.lookups / 4) { _ = try empty.client.send(.clock()) }
        empty.stop()

        progress("pending: writing \(count(workload.count)) requests and \(count(workload.apps)) bundles (setup, not measured)")
        let plugins = directory.appendingPathComponent("plugins")
        let state = directory.appendingPathComponent("state")
        try workload.makeBundles(in: plugins)
        // The same catalog over an empty store: what the bundles cost, apart from the requests.
        let catalogOnly = HostProcess(plugins: plugins, state: directory.appendingPathComponent("catalog-state"),
                                      log: directory.appendingPathComponent("catalog-host.log"), arguments: ["--clock", "virtual"])
        try catalogOnly.start()
        usleep(1_000_000)
        let catalogRSS = ProcStat.rss(catalogOnly.pid).map { Double($0) } ?? .nan
        catalogOnly.stop()
        let load = try workload.load(state: state)
        let databaseBytes = (try? FileManager.default.attributesOfItem(atPath: state.appendingPathComponent("bgtask.sqlite").path)[.size] as? NSNumber)?.doubleValue ?? .nan

        progress("pending: starting the host on them")
        let host = HostProcess(plugins: plugins, state: state, log: directory.appendingPathComponent("host.log"), arguments: ["--clock", "virtual"])
        try host.start()
        defer { host.stop() }
        usleep(1_000_000)
        let startRSS = ProcStat.rss(host.pid).map { Double($0) } ?? .nan

        progress("pending: lookups (\(n.lookups) each)")
        let store = try PendingRequestStore(directory: state)
        let now = Date()
        let nextDue = try timeCalls(n.lookups) { _ = try store.nextDueDate(after: now) }
        let dueNone = try timeCalls(n.lookups) { _ = try store.dueApps(at: now) }
        let thousandth = Date(timeIntervalSince1970: load.thousandthDue)
        let dueAppsFound = try store.dueApps(at: thousandth).count
        let due1000 = try timeCalls(n.lookups / 4) { _ = try store.dueApps(at: thousandth) }
        let status = try timeCalls(n.lookups / 4) { _ = try host.client.send(.status) }
        let clock = try timeCalls(n.lookups / 4) { _ = try host.client.send(.clock()) }

        let databasePath = state.appendingPathComponent("bgtask.sqlite").path
        let nextDuePlan = try queryPlan(databasePath, nextDueDateSQL, [now.timeIntervalSince1970])
        let dueAppsPlan = try queryPlan(databasePath, dueAppsSQL, [now.timeIntervalSince1970])
        let scans = (nextDuePlan + dueAppsPlan).filter { $0.hasPrefix("SCAN") }

        progress("pending: idle host CPU for \(n.idleSeconds) s")
        let idle = host.idle(for: n.idleSeconds)
        let rss = ProcStat.rss(host.pid).map { Double($0) } ?? .nan
        let hwm = ProcStat.peakRSS(host.pid).map { Double($0) } ?? .nan
        let threads = ProcStat.threadCount(host.pid)

        // `bgtask apps` on this host: every app, page after page of 500, as the CLI asks.
        progress("pending: the apps verb, every page (500 apps each)")
        let appsStart = monotonicNs()
        var appsOutcome: String
        do {
            var listed = 0, pages = 0
            var after: String?
            repeat {
                let response = try host.client.send(.apps(limit: 500, after: after))
                guard response.ok else { throw BenchError(response.error?.message ?? "?") }
                listed += response.apps?.count ?? 0
                pages += 1
                after = response.next
            } while after != nil
            appsOutcome = "ok, \(listed) apps in \(pages) pages"
        } catch {
            appsOutcome = "failed: \(error)"
        }
        let appsMs = Double(monotonicNs() - appsStart) / 1e6
        let appsRSS = ProcStat.rss(host.pid).map { Double($0) } ?? .nan

        report.set("pending_count", .int(workload.count))
        report.set("pending_apps", .int(workload.apps))
        report.set("pending_load_s", load.seconds, 2)
        report.set("pending_db_mib", databaseBytes / 1_048_576, 1)
        report.set("pending_1m_host_start_s", host.startSeconds, 3)
        report.set("pending_1m_rss_mib", rss / 1_048_576, 1)
        report.set("pending_1m_rss_at_start_mib", startRSS / 1_048_576, 1)
        report.set("pending_1m_rss_hwm_mib", hwm / 1_048_576, 1)
        report.set("pending_1m_host_threads", .int(threads))
        report.set("empty_host_rss_mib", emptyRSS / 1_048_576, 1)
        report.set("pending_1m_rss_over_empty", rss / emptyRSS, 2)
        report.set("catalog_only_host_rss_mib", catalogRSS / 1_048_576, 1)
        report.set("pending_1m_next_due_us", nextDue.p50, 1)
        report.set("pending_1m_next_due_p99_us", nextDue.p99, 1)
        report.set("empty_store_next_due_us", emptyNextDue.p50, 1)
        report.set("pending_1m_next_due_over_empty", nextDue.p50 / emptyNextDue.p50, 2)
        report.set("pending_1m_due_apps_us", dueNone.p50, 1)
        report.set("pending_1m_due_apps_1000_us", due1000.p50, 1)
        report.set("pending_1m_due_apps_1000_found", .int(dueAppsFound))
        report.set("pending_1m_clock_verb_us", clock.p50, 1)
        report.set("pending_1m_status_verb_us", status.p50, 1)
        report.set("empty_host_clock_verb_us", emptyClock.p50, 1)
        report.set("empty_host_status_verb_us", emptyStatus.p50, 1)
        report.set("pending_1m_linear_scan", .bool(!scans.isEmpty))
        report.set("pending_1m_plans", .object([
            ("next_due", .string(nextDuePlan.joined(separator: "; "))), ("due_apps", .string(dueAppsPlan.joined(separator: "; "))),
        ]))
        report.set("idle_cpu_pct_1m", idle.cpuPercent, 3)
        report.set("idle_wakeups_per_s_1m", idle.wakeupsPerSecond, 2)
        report.set("pending_1m_apps_verb_ms", appsMs, 1)
        report.set("pending_1m_apps_verb", .string(appsOutcome))
        report.set("pending_1m_rss_after_apps_mib", appsRSS / 1_048_576, 1)

        let label = n.pending == 1_000_000 ? "1M" : count(n.pending)
        report.row("host RSS, \(label) pending / \(count(workload.apps)) apps", mib(rss), floor: "empty host \(mib(emptyRSS))",
                   ratio: times(rss / emptyRSS), target: "documented")
        report.row("  same \(count(workload.apps)) bundles, empty store", mib(catalogRSS), floor: "empty host \(mib(emptyRSS))",
                   ratio: times(catalogRSS / emptyRSS), target: "context")
        report.row("nextDueDate (in-process) p50, \(label) pending", us(nextDue.p50), floor: "empty store \(us(emptyNextDue.p50))",
                   ratio: times(nextDue.p50 / emptyNextDue.p50), target: "no linear scans",
                   verdict: scans.isEmpty ? "yes (index search)" : "no: \(scans.joined(separator: "; "))")
        report.row("dueApps (none due / 1,000 due) p50", "\(us(dueNone.p50)) / \(us(due1000.p50))", target: "no linear scans",
                   verdict: scans.isEmpty ? "yes (index search)" : "no")
        report.row("`clock` verb round trip p50 (host-side nextDueDate)", us(clock.p50), floor: "`status` verb \(us(status.p50))",
                   ratio: times(clock.p50 / status.p50))
        report.row("host start (catalog scan + store open), \(label) pending", String(format: "%.2f s", host.startSeconds))
        report.row("idle host CPU (\(Int(n.idleSeconds)) s, virtual clock, \(label) pending)", String(format: "%.3f %%", idle.cpuPercent), floor: "0 %",
                   ratio: String(format: "%.1f wakeups/s", idle.wakeupsPerSecond), target: "≈ 0", verdict: verdict(idle.cpuPercent < 0.1))
        report.row("`apps` verb with \(label) pending, every page", String(format: "%.0f ms", appsMs), floor: "",
                   ratio: "RSS after \(mib(appsRSS))", target: appsOutcome.count > 40 ? String(appsOutcome.prefix(40)) + "…" : appsOutcome)
        if n.pending != 1_000_000 {
            report.note("--quick: the pending_1m_* keys hold \(count(n.pending)) pending requests (pending_count), not 1,000,000")
        }
        report.note("pending rows are written straight into a store the product created (\(String(format: "%.1f", load.seconds)) s, \(mib(databaseBytes)) database): \(count(workload.apps)) apps × \(workload.perApp) requests is past Apple's 11-per-app limit, so submit could never build it")
    }
}

import BGTaskHost
import BGTaskModel
import BGTaskSystem
import Foundation
import GRDB
import Glibc
import _BGTaskSystemShims

extension SectionRunner {
    // MARK: Scale

    /// `--only scale`: N launches supervised at once, each sleeping in its handler until its
    /// budget ends (half of them, `bench.sleep`: expiration lateness) or beyond its grace (the
    /// other half, `bench.hang`: watchdog lateness).
    func scale() throws {
        report.section("scale: N launches supervised at once by one host (each sleeping in its handler), for N = \(iterations.scaleSizes.map(String.init).joined(separator: ", "))")
        raiseDescriptorLimit()
        let budget = iterations.scaleBudget
        var figures: [(n: Int, cpuUsPerLaunchSecond: Double, hostRSS: Double, rssPerLaunch: Double, pssPerLaunch: Double, threads: Int,
                       ramp: Double, expiry: Samples, watchdog: Samples, entered: Int, endCPUMs: Double)] = []
        for size in iterations.scaleSizes {
            progress("scale: \(size) launches (budget \(Int(budget)) s, grace 1 s)")
            let e2e = try EndToEndHost(root: root.appendingPathComponent("scale-\(size)"), apps: size,
                                       arguments: ["--max-launches", "\(size + 10)", "--budget", "\(Int(budget))s", "--grace", "1s"])
            defer { e2e.stop() }
            usleep(500_000)
            let idleRSS = Double(ProcStat.rss(e2e.host.pid) ?? 0)
            // The host's whole tree at rest (the host, the zygote, its spare): what N launches
            // add to it is theirs.
            let idlePSS = ProcStat.treePSS(e2e.host.pid).bytes
            let batch = e2e.apps.enumerated().map { EndToEndHost.submission($0.element, $0.offset % 2 == 0 ? "bench.sleep" : "bench.hang") }
            let t0 = monotonicNs()
            let responses = try e2e.client.send(batch, window: 256)
            guard responses.allSatisfy(\.ok) else { throw BenchError("scale submit refused: \(responses.first { !$0.ok }?.error?.message ?? "?")") }
            let entered = collectStamps(Array(e2e.fifos.values), what: .handler, count: size, timeout: budget * 0.8)
            let ramp = seconds(since: t0)
            // All of them supervised at once: the host's CPU over a window, its memory, and the
            // launches' proportional memory.
            let window = min(2.0, max(0.5, budget - ramp - 1))
            let cpu0 = ProcStat.cpuNanoseconds(e2e.host.pid)
            let w0 = monotonicNs()
            usleep(UInt32(window * 1e6))
            let cpuNs = Double(ProcStat.growth(from: cpu0, to: ProcStat.cpuNanoseconds(e2e.host.pid)))
            let elapsed = seconds(since: w0)
            let hostRSS = Double(ProcStat.rss(e2e.host.pid) ?? 0)
            let threads = ProcStat.threadCount(e2e.host.pid)
            let tree = ProcStat.treePSS(e2e.host.pid)
            let launches = max(entered.count, 1)
            let pss = tree.bytes - idlePSS
            // Both halves end by the budget + grace + the watchdog's kill; then the records. The
            // host's CPU from just before the first budget ends to then is what ending them cost.
            usleep(UInt32(max(0, Double(budget) - 0.5 - seconds(since: t0)) * 1e6))
            let endCPU0 = ProcStat.cpuNanoseconds(e2e.host.pid)
            let end = Double(budget) + 1 + 3
            usleep(UInt32(max(0, end - seconds(since: t0)) * 1e6))
            let endCPUNs = Double(ProcStat.growth(from: endCPU0, to: ProcStat.cpuNanoseconds(e2e.host.pid)))
            var expiry = Samples(), watchdog = Samples()
            var recorded = 0
            for _ in 0..<30 {
                let records = (try? e2e.records(limit: size + 10)) ?? []
                recorded = records.count
                if recorded >= entered.count {
                    for record in records {
                        if record.termination == .watchdog {
                            watchdog.append(record.wallMs - (record.budgetMs + record.graceMs))
                        } else if let task = record.tasks.first, let expired = task.expiredMs {
                            expiry.append(expired - record.budgetMs)
                        }
                    }
                    break
                }
                usleep(500_000)
            }
            figures.append((size, cpuNs / 1000 / elapsed / Double(launches), hostRSS, (hostRSS - idleRSS) / Double(launches),
                            pss / Double(launches), threads, ramp, expiry, watchdog, entered.count,
                            endCPUNs / 1e6 / Double(max(1, expiry.count + watchdog.count))))
            if entered.count < size { report.note("scale \(size): only \(entered.count) of \(size) handlers entered within \(Int(budget * 0.8)) s; the per-launch figures are over those") }
            report.note("scale \(size): \(tree.processes) processes under the host while supervised (3 per launch with PID namespaces: outer, init, app)")
        }
        for f in figures {
            let key = "scale_\(f.n)"
            report.set("\(key)_host_cpu_us_per_launch_s", f.cpuUsPerLaunchSecond, 2)
            report.set("\(key)_host_cpu_pct", f.cpuUsPerLaunchSecond * Double(f.n) / 1e4, 2)
            report.set("\(key)_host_rss_mib", f.hostRSS / 1_048_576, 1)
            report.set("\(key)_host_rss_per_launch_kib", f.rssPerLaunch / 1024, 1)
            report.set("\(key)_launch_pss_kib", f.pssPerLaunch / 1024, 1)
            report.set("\(key)_host_threads", .int(f.threads))
            report.set("\(key)_ramp_s", f.ramp, 2)
            report.set("\(key)_expiry_late_p99_ms", f.expiry.p99)
            report.set("\(key)_expiry_late_p50_ms", f.expiry.p50)
            report.set("\(key)_watchdog_late_p99_ms", f.watchdog.p99)
            report.set("\(key)_watchdog_late_p50_ms", f.watchdog.p50)
            report.set("\(key)_entered", .int(f.entered))
            report.set("\(key)_host_cpu_ms_per_launch_end", f.endCPUMs, 3)
            report.row("\(f.n) at once: host CPU per supervised launch", String(format: "%.1f µs/s", f.cpuUsPerLaunchSecond),
                       ratio: String(format: "host %.2f %% of a core", f.cpuUsPerLaunchSecond * Double(f.n) / 1e4), target: "linear, small")
            report.row("\(f.n) at once: host RSS (+ per launch) / PSS per launch", "\(mib(f.hostRSS)) (+\(String(format: "%.0f KiB", f.rssPerLaunch / 1024))) / \(String(format: "%.0f KiB", f.pssPerLaunch / 1024))",
                       ratio: "\(f.threads) host threads", target: "documented")
            report.row("\(f.n) at once: expiry lateness p50 / p99", "\(ms(f.expiry.p50)) / \(ms(f.expiry.p99))", ratio: "\(f.expiry.count) launches",
                       target: "p99 ≤ 5 ms", verdict: verdict(f.expiry.p99 <= 5, missedBy: ms(f.expiry.p99 - 5) + " over"))
            report.row("\(f.n) at once: watchdog lateness p50 / p99", "\(ms(f.watchdog.p50)) / \(ms(f.watchdog.p99))", ratio: "\(f.watchdog.count) launches",
                       target: "p99 ≤ 5 ms", verdict: verdict(f.watchdog.p99 <= 5, missedBy: ms(f.watchdog.p99 - 5) + " over"))
            report.row("\(f.n) at once: host CPU per launch ended (expired and suspended, or killed)", String(format: "%.2f ms", f.endCPUMs),
                       ratio: "budget − 0.5 s → grace + 3 s", target: "≤ 0.3 ms", verdict: verdict(f.endCPUMs <= 0.3, missedBy: String(format: "%.2f ms over", f.endCPUMs - 0.3)))
            report.row("\(f.n) at once: submitted → all handlers entered", String(format: "%.2f s", f.ramp), ratio: perSecond(Double(f.entered) / f.ramp), target: "context")
        }
    }

    // MARK: Confinement priced

    /// `--only confinement`: in-process zygote launches with every layer, with each layer off
    /// in turn, and with none.
    func confinement() throws {
        report.section("confinement: in-process zygote launches with each isolation layer on and off (the main run loop is always on since issue 12)")
        let n = iterations
        progress("confinement: fork floor (\(n.forkLatency) × fork + _exit + waitpid)")
        let fork = try Floors.forkLatency(n.forkLatency)
        let floor = fork.p50
        struct Variant { var name: String; var key: String; var confined: Bool; var uid: Bool; var environment: [String: String] }
        let variants = [
            Variant(name: "all layers (as `bgtask host` as root)", key: "all", confined: true, uid: true, environment: [:]),
            Variant(name: "without the PID namespace", key: "no_pid_namespace", confined: true, uid: true, environment: [AppContainer.pidNamespaceSwitch: "off"]),
            Variant(name: "without Landlock", key: "no_landlock", confined: true, uid: true, environment: [AppContainer.sandboxLayersSwitch: "landlock"]),
            Variant(name: "without seccomp", key: "no_seccomp", confined: true, uid: true, environment: [AppContainer.sandboxLayersSwitch: "seccomp"]),
            Variant(name: "without the uid switch", key: "no_uid", confined: true, uid: false, environment: [:]),
            Variant(name: "none (--no-sandbox)", key: "none", confined: false, uid: false, environment: [:]),
        ]
        // Every variant's zygote started (with its environment) first, then launches in rounds
        // over the variants, so that a machine that slows down or speeds up during the run moves
        // every variant alike (sequential blocks of each gave negative layer costs on a loaded
        // machine).
        var benches: [LaunchBench] = []
        defer { benches.forEach { $0.stop() } }
        for variant in variants {
            for (key, value) in variant.environment { setenv(key, value, 1) }
            defer { for key in variant.environment.keys { unsetenv(key) } }
            let bench = try LaunchBench(root: root.appendingPathComponent("confinement-\(variant.key)"), launcher: .zygote,
                                        confined: variant.confined, switchUID: variant.uid)
            benches.append(bench)
            for _ in 0..<3 { _ = try bench.noop() } // starts its zygote with this environment
        }
        let rounds = 10
        progress("confinement: \(variants.count) variants, \(rounds) rounds of \(n.confinementLatency / rounds) launches each (latency), then of \(n.launchThroughput / rounds) back to back (rate)")
        var latencies = Array(repeating: Samples(), count: variants.count)
        var elapsed = Array(repeating: 0.0, count: variants.count)
        var counted = Array(repeating: 0, count: variants.count)
        for _ in 0..<rounds {
            for (index, bench) in benches.enumerated() {
                for _ in 0..<(n.confinementLatency / rounds) { latencies[index].append(try bench.noop().record.tasks[0].startedMs! * 1000) }
                let t0 = monotonicNs()
                for _ in 0..<(n.launchThroughput / rounds) { _ = try bench.noop() }
                elapsed[index] += seconds(since: t0)
                counted[index] += n.launchThroughput / rounds
            }
        }
        let results: [(Variant, Samples, Double)] = variants.indices.map { (variants[$0], latencies[$0], Double(counted[$0]) / elapsed[$0]) }
        let all = results[0].1.p50
        report.row("fork floor p50 (this run)", us(floor), target: "floor")
        for (variant, latency, rate) in results {
            report.set("confinement_\(variant.key)_p50_us", latency.p50, 1)
            report.set("confinement_\(variant.key)_p99_us", latency.p99, 1)
            report.set("confinement_\(variant.key)_per_s", rate, 1)
            let delta = variant.key == "all" ? "" : ", the layer costs \(us(all - latency.p50))"
            report.row("launch p50 / p99, \(variant.name)", "\(us(latency.p50)) / \(us(latency.p99))", floor: "fork p50 \(us(floor))",
                       ratio: times(latency.p50 / floor) + delta, target: variant.key == "all" ? "≤ 1× floor" : "context",
                       verdict: variant.key == "all" ? verdict(latency.p50 <= floor, missedBy: times(latency.p50 / floor)) : "")
            report.row("  sequential launches/s, \(variant.name)", perSecond(rate), target: "context")
        }
        if let none = results.last {
            let adds = all - none.1.p50
            report.set("confinement_adds_p50_us", adds, 1)
            report.set("confinement_fork_floor_p50_us", floor, 1)
            report.row("the whole confinement adds (p50, all − none)", us(adds), target: "≤ 100 µs", verdict: verdict(adds <= 100, missedBy: us(adds - 100) + " over"))
        }
    }
}

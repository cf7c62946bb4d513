import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskModel
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

// MARK: Floors measured in this process

/// fork + `_exit(0)` in the child + waitpid: the floor of starting any process. The child runs
/// no Swift code beyond the call to `_exit` (this process has threads by now; a forked child
/// may only make async-signal-safe calls).
@inline(never)
func forkAndReap() -> Bool {
    let pid = fork()
    if pid == 0 { _exit(0) }
    guard pid > 0 else { return false }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
    return true
}

enum Floors {
    /// fork floor latencies in µs.
    static func forkLatency(_ n: Int) throws -> Samples {
        var samples = Samples()
        for _ in 0..<n {
            let t0 = monotonicNs()
            guard forkAndReap() else { throw BenchError("fork failed: \(String(cString: strerror(errno)))") }
            samples.append(Double(monotonicNs() - t0) / 1000)
        }
        return samples
    }

    /// forks per second, `total` of them over `threads` threads.
    static func forkThroughput(_ total: Int, threads: Int) -> Double {
        let t0 = monotonicNs()
        onThreads(threads) { _ in
            for _ in 0..<(total / threads) { _ = forkAndReap() }
        }
        return Double(total / threads * threads) / seconds(since: t0)
    }

    /// fork + exit + wait from a small C program: dash running `(exit)` subshells (a fork, an
    /// exit and a wait each, no exec) minus the same loop without them, µs per fork (a mean:
    /// the loop cannot time single iterations). NaN without /bin/dash.
    static func smallParentFork(_ n: Int) -> Double {
        guard access("/bin/dash", X_OK) == 0 else { return .nan }
        func time(_ script: String) -> Double {
            let t0 = monotonicNs()
            guard let pid = try? spawn(["/bin/dash", "-c", script], stdout: nil, stderr: nil), waitFor(pid) == 0 else { return .nan }
            return Double(monotonicNs() - t0) / 1000
        }
        let withForks = time("i=0; while [ $i -lt \(n) ]; do (exit); i=$((i+1)); done")
        let without = time("i=0; while [ $i -lt \(n) ]; do i=$((i+1)); done")
        return (withForks - without) / Double(n)
    }

    /// How late a 50 ms poll(2) timeout wakes this process, in ms: the timer floor under
    /// expiration (the supervisor's deadlines are poll timeouts too).
    static func timerLateness(_ n: Int) -> Samples {
        var samples = Samples()
        for _ in 0..<n {
            let t0 = monotonicNs()
            poll(nil, 0, 50)
            samples.append(Double(monotonicNs() - t0) / 1e6 - 50)
        }
        return samples
    }

    /// Deadline (a 50 ms poll timeout) → SIGKILL → waitpid returned, for a forked child
    /// blocked in pause(), in ms: the floor under the watchdog.
    static func killLateness(_ n: Int) -> Samples {
        var samples = Samples()
        for _ in 0..<n {
            let pid = fork()
            if pid == 0 { while true { pause() } }
            guard pid > 0 else { continue }
            let deadline = monotonicNs() + 50_000_000
            poll(nil, 0, 50)
            kill(pid, SIGKILL)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
            samples.append(Double(monotonicNs() - deadline) / 1e6)
        }
        return samples
    }

    /// How fast one thread of this machine touches fresh memory (mmap + memset of 64 MiB), in
    /// GiB/s: what the jetsam mechanisms race against. Best of three, each in a forked child:
    /// this process's own high-water RSS must stay low, because a spawned runner's ru_maxrss
    /// starts at it (see the jetsam note in BENCHMARKS.md).
    static func touchRate() -> Double {
        var best = 0.0
        for _ in 0..<3 {
            var fds: [Int32] = [0, 0]
            guard pipe(&fds) == 0 else { return .nan }
            let pid = fork()
            if pid == 0 {
                // Only system calls and arithmetic here (a forked child of a threaded process).
                let size = 64 << 20
                let t0 = bgtask_monotonic_ns()
                guard let p = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), p != MAP_FAILED else { _exit(1) }
                memset(p, 0xa5, size)
                var rate = Double(size) / 1_073_741_824 / (Double(bgtask_monotonic_ns() - t0) / 1e9)
                _ = write(fds[1], &rate, MemoryLayout<Double>.size)
                _exit(0)
            }
            close(fds[1])
            var rate = 0.0
            let got = read(fds[0], &rate, MemoryLayout<Double>.size)
            close(fds[0])
            if pid > 0 { var status: Int32 = 0; while waitpid(pid, &status, 0) == -1 && errno == EINTR {} }
            if got == MemoryLayout<Double>.size { best = max(best, rate) }
        }
        return best
    }
}

// MARK: Launches through the real supervisor and runner

/// Launches of the BenchPlugin bundle with `LaunchSupervisor.run`, supervised as `bgtask run`
/// and the host do, through either launcher: `zygote` (forked from the pre-warmed
/// `bgtask-runner --zygote`, the host's default) or `spawn` (posix_spawn of `bgtask-runner`).
final class LaunchBench: @unchecked Sendable {
    enum Launcher: String { case zygote, spawn }

    static let appIdentifier = "com.example.bench"
    static let identifiers = ["bench.noop", "bench.expire", "bench.block", "bench.alloc"]

    let root: URL
    let bundle: PluginBundle
    let supervisor: LaunchSupervisor
    let launcher: Launcher

    /// `confined`: as `bgtask host` runs launches (Landlock, seccomp, no_new_privs, and the
    /// app's own uid when this process is root); false: as `--no-sandbox` does. `switchUID`
    /// false: confined but as this process's uid (the `uid` layer alone off).
    init(root: URL, launcher: Launcher, confined: Bool = true, switchUID: Bool = true) throws {
        self.root = root
        self.launcher = launcher
        let url = root.appendingPathComponent("Bench.app")
        try makeBenchBundle(at: url, identifier: Self.appIdentifier, permitted: Self.identifiers)
        bundle = try BundleReader.read(url)
        var logger = Logger(label: "bgtask-bench")
        logger.logLevel = .error
        var supervisor = LaunchSupervisor(runnerPath: Products.runner, logger: logger)
        if launcher == .zygote { supervisor.zygote = Zygote(runnerPath: Products.runner, logger: logger, confine: confined) }
        supervisor.confine = confined
        if confined && switchUID && geteuid() == 0 { supervisor.identities = AppIdentities(stateDirectory: root) }
        self.supervisor = supervisor
    }

    /// Ends the zygote, if any.
    func stop() { supervisor.zygote?.stop() }

    struct Launch {
        var record: RunRecord
        /// From the call to `run` (before the supervisor's own setup) to the handler entered, µs.
        var fromCallUs: Double?
    }

    func launch(_ identifier: String, kind: TaskKind, limits: LaunchLimits, cgroup: URL? = nil) throws -> Launch {
        let launchID = LaunchPlan.newLaunchID()
        let plan = LaunchPlan(
            bundle: bundle, tasks: [TaskAssignment(task: 1, identifier: identifier, kind: kind)], reason: .benchmark,
            limits: limits, launchID: launchID,
            dataDirectory: root.appendingPathComponent("containers").appendingPathComponent(Self.appIdentifier),
            logFile: root.appendingPathComponent("logs").appendingPathComponent("\(launchID).log"))
        var supervisor = supervisor
        supervisor.cgroupRoot = cgroup
        let called = Date()
        let record = try supervisor.run(plan, broker: InMemoryRequestBroker())
        guard record.launcher == nil || record.launcher == launcher.rawValue else {
            throw BenchError("a launch meant for the \(launcher.rawValue) launcher went through \(record.launcher ?? "?") (see \(record.log ?? "its record: it wrote no log"))")
        }
        let fromCall = record.tasks.first?.startedMs.map { record.startedAt.timeIntervalSince(called) * 1e6 + $0 * 1000 }
        return Launch(record: record, fromCallUs: fromCall)
    }

    static let noopLimits = LaunchLimits.defaults(for: [.refresh])

    /// One no-op launch that must succeed.
    func noop() throws -> Launch {
        let launch = try launch("bench.noop", kind: .refresh, limits: Self.noopLimits)
        guard launch.record.succeeded, launch.record.tasks.first?.startedMs != nil else {
            throw BenchError("a no-op launch did not succeed:\n\(launch.record)")
        }
        return launch
    }

    /// Launch latencies (launch start → handler entered, and call → handler entered), µs.
    func latency(_ n: Int) throws -> (start: Samples, call: Samples) {
        for _ in 0..<3 { _ = try noop() } // warm the page cache (and start the zygote)
        var start = Samples(), call = Samples()
        for _ in 0..<n {
            let launch = try noop()
            start.append(launch.record.tasks[0].startedMs! * 1000)
            if let fromCall = launch.fromCallUs { call.append(fromCall) }
        }
        return (start, call)
    }

    struct Throughput {
        var perSecond: Double
        var failures: Int
        var firstFailure: String?
    }

    /// No-op launches per second end to end, `total` over `threads` threads. A launch that does
    /// not succeed is counted (and not in the rate) rather than ending the run.
    func throughput(_ total: Int, threads: Int) throws -> Throughput {
        let outcome = Locked<(ok: Int, failed: Int, first: String?)>((0, 0, nil))
        let t0 = monotonicNs()
        onThreads(threads) { [self] _ in
            for _ in 0..<(total / threads) {
                do {
                    _ = try noop()
                    outcome.withLock { $0.ok += 1 }
                } catch {
                    outcome.withLock { $0 = ($0.ok, $0.failed + 1, $0.first ?? "\(error)") }
                }
            }
        }
        let elapsed = seconds(since: t0)
        let result = outcome.current
        if result.ok == 0 { throw BenchError(result.first ?? "no launch succeeded") }
        return Throughput(perSecond: Double(result.ok) / elapsed, failures: result.failed, firstFailure: result.first)
    }

    /// 1 s budgets: expiration delivered (handler about to be entered) minus the budget, ms.
    func expiryLateness(_ n: Int) throws -> Samples {
        var samples = Samples()
        let limits = LaunchLimits(budget: .seconds(1), grace: .seconds(5), memoryLimitBytes: Self.noopLimits.memoryLimitBytes)
        for _ in 0..<n {
            let record = try launch("bench.expire", kind: .refresh, limits: limits).record
            guard record.termination == .exited, let task = record.tasks.first, task.outcome == .expired, let expired = task.expiredMs else {
                throw BenchError("an expiry launch did not end with its task expired:\n\(record)")
            }
            samples.append(expired - record.budgetMs)
        }
        return samples
    }

    /// 200 ms budget + 200 ms grace, the task blocked in pause(): reaped minus the grace's end, ms.
    func watchdogLateness(_ n: Int) throws -> Samples {
        var samples = Samples()
        let limits = LaunchLimits(budget: .milliseconds(200), grace: .milliseconds(200), memoryLimitBytes: Self.noopLimits.memoryLimitBytes)
        for _ in 0..<n {
            let record = try launch("bench.block", kind: .refresh, limits: limits).record
            guard record.termination == .watchdog else {
                throw BenchError("a blocked launch was not killed by the watchdog:\n\(record)")
            }
            samples.append(record.wallMs - (record.budgetMs + record.graceMs))
        }
        return samples
    }

    /// A task touching memory as fast as it can under a 64 MiB limit: peak over limit, %.
    func jetsamOvershoot(_ n: Int, cgroup: URL?) throws -> (samples: Samples, mechanism: String) {
        var samples = Samples()
        var mechanism = "sampler"
        let limits = LaunchLimits(budget: .seconds(5), grace: .seconds(1), memoryLimitBytes: 64 << 20)
        for _ in 0..<n {
            let record = try launch("bench.alloc", kind: .processing, limits: limits, cgroup: cgroup).record
            guard record.termination == .jetsam else {
                throw BenchError("an allocating launch was not killed by jetsam:\n\(record)")
            }
            mechanism = record.memoryMechanism
            samples.append((Double(record.peakRSSBytes) / Double(record.memoryLimitBytes) - 1) * 100)
        }
        return (samples, mechanism)
    }
}

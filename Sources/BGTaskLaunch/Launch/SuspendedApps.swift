import BGTaskControl
import BGTaskModel
import BGTaskSystem
import BGTaskWire
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// An app's process kept after its launch's work was over (`AppLifecycle.ios`): stopped (the
/// whole process group, `SIGSTOP`; frozen with its cgroup's `cgroup.freeze` where one is
/// delegated), its memory kept, its channel and log pipe held by the host. The app's next launch
/// takes it out of `SuspendedApps` and resumes it (`LaunchSupervisor`).
package struct SuspendedApp {
    package let app: String
    /// The host's child: the launch's outer process (the runner itself without a PID namespace).
    package let pid: pid_t
    /// The app's own process (below the namespace's init), for its memory.
    package let appPID: pid_t
    package let channel: LaunchChannel
    /// The read end of the pipe that is the process's stdout and stderr.
    /// -1 once closed (the log that adopted it found every writer gone: the process died).
    package var logReadEnd: Int32
    package let cgroup: CgroupV2.LaunchGroup?
    /// The confinement the runner reported at its first launch (a resumed launch has the same).
    package let sandbox: [String: SandboxLayer]?
    package let launcher: String
    package let key: Key
    /// Launches this process has run, this one included.
    package var launches: Int
    package var suspendedAtNs: UInt64
    package var suspendedAt: Date
    /// The memory the process is counted for: its private memory (`smaps_rollup`: what ending it
    /// gives back) once measured (`residentMeasured`), until then its resident memory, which
    /// holds every private page and the ones it shares. It does not grow while stopped.
    package var residentBytes: UInt64
    /// Whether `residentBytes` is the measured private memory (else the resident upper bound).
    /// A suspension does not measure it: `smaps_rollup` walks every page table of the process
    /// (about 240 µs for an app forked from the zygote, 7 % of the host's CPU for resumed
    /// launches under perf), and most suspensions never need it. `SuspendedApps` measures it when
    /// it matters: when the bound is over the budget, before an eviction, when asked for it.
    package var residentMeasured: Bool
    /// The private memory of the process, read now unless it was read already; its bound when
    /// it cannot be read (it died).
    func privateBytes() -> UInt64 {
        guard !residentMeasured else { return residentBytes }
        let read = ProcessTree.uniqueBytes(ofProcess: appPID)
        return read > 0 ? read : residentBytes
    }
    package var lastLaunchID: String
    /// The process's CPU time when it was suspended: the app's word (its `getrusage`, at least
    /// what /proc said), from which the next launch's CPU is counted.
    package var cpuNs: UInt64
    /// Its energy counters when it was suspended (`EnergyCounters.of`): a resumed launch counts
    /// from there.
    package var energy = EnergyCounters()
    /// Its open connections' bytes at its suspension (`SocketTraffic.continued`): the next
    /// launch counts from them.
    package var traffic = SocketTraffic()
    /// The plugin hears resumed launches (a resume handler): without it, only launches that
    /// bring tasks alone may resume the process.
    package var hearsResumes: Bool

    /// What a process must have in common with a launch to run it: the same bundle, executable
    /// file (a replaced library means a fresh process), granted app groups and confinement.
    package struct Key: Equatable {
        package var bundlePath: String
        package var executable: [Int]
        package var appGroups: [String]
        package var confine: Bool
        package var uid: UInt32?

        package init(bundlePath: String, executable: [Int], appGroups: [String], confine: Bool, uid: UInt32?) {
            (self.bundlePath, self.executable, self.appGroups, self.confine, self.uid) = (bundlePath, executable, appGroups, confine, uid)
        }

        package init(plan: LaunchPlan, groups: [String], confine: Bool, uid: UInt32?) {
            bundlePath = plan.bundle.url.path
            var info = stat()
            executable = stat(plan.bundle.executableURL.path, &info) == 0
                ? [Int(info.st_dev), Int(info.st_ino), Int(info.st_size), info.st_mtim.tv_sec, info.st_mtim.tv_nsec] : []
            appGroups = groups.sorted()
            self.confine = confine
            self.uid = uid
        }
    }

    /// The memberwise initializer, for the modules above this one.
    package init(app: String, pid: pid_t, appPID: pid_t, channel: LaunchChannel, logReadEnd: Int32, cgroup: CgroupV2.LaunchGroup?, sandbox: [String: SandboxLayer]?, launcher: String, key: Key, launches: Int, suspendedAtNs: UInt64, suspendedAt: Date, residentBytes: UInt64, residentMeasured: Bool = true, lastLaunchID: String, cpuNs: UInt64, hearsResumes: Bool) {
        self.app = app
        self.pid = pid
        self.appPID = appPID
        self.channel = channel
        self.logReadEnd = logReadEnd
        self.cgroup = cgroup
        self.sandbox = sandbox
        self.launcher = launcher
        self.key = key
        self.launches = launches
        self.suspendedAtNs = suspendedAtNs
        self.suspendedAt = suspendedAt
        self.residentBytes = residentBytes
        self.residentMeasured = residentMeasured
        self.lastLaunchID = lastLaunchID
        self.cpuNs = cpuNs
        self.hearsResumes = hearsResumes
    }
}

/// Why and when an app's kept process ended while it was suspended: the app's next launch is
/// fresh, and its record says why (`previous_process`).
public struct AppProcessEviction: Sendable, Equatable {
    public var reason: String
    public var at: Date
    public var residentBytes: UInt64

    /// The memberwise initializer, for the modules above this one.
    package init(reason: String, at: Date, residentBytes: UInt64) {
        self.reason = reason
        self.at = at
        self.residentBytes = residentBytes
    }
}

/// What `bgtask doctor` says of the app lifecycle on this machine.
public enum AppLifecycleProbe {
    public static func summary() -> String { SuspendedApps.machineSummary() }
}

/// What `bgtask apps` shows of an app's process.
public struct AppProcessState: Sendable, Equatable {
    public enum State: String, Sendable { case running, suspended, notRunning = "not-running" }
    public var app: String
    public var state: State
    public var pid: Int32?
    public var residentBytes: UInt64?
    public var suspendedSince: Date?
    public var launches: Int?
    public var lastEviction: AppProcessEviction?

    /// The memberwise initializer, for the modules above this one.
    package init(app: String, state: State, pid: Int32? = nil, residentBytes: UInt64? = nil, suspendedSince: Date? = nil, launches: Int? = nil, lastEviction: AppProcessEviction? = nil) {
        self.app = app
        self.state = state
        self.pid = pid
        self.residentBytes = residentBytes
        self.suspendedSince = suspendedSince
        self.launches = launches
        self.lastEviction = lastEviction
    }
}

/// The suspended apps of a host (`AppLifecycle.ios`) and their jetsam.
///
/// A process is in the table only while suspended: a launch takes it out (`take`) and puts it
/// back when its work is over (`suspend`). Memory is bounded by `budgetBytes` (the resident
/// memory of all suspended apps together) and `maximumCount`; over either, and when the kernel
/// reports memory pressure (PSI, `/proc/pressure/memory`), suspended apps are evicted in iOS's
/// order: the least recently used first (the lowest priority band), the largest first among
/// those suspended within the same `bandSeconds`. The supervision loops watch them
/// (`SuspendedWatch`: each app's pidfds, a source of a loop; the pressure trigger, another): a
/// suspended app that dies (killed from outside, the kernel's OOM killer) is reaped and its
/// eviction recorded at once, on a launch worker. No thread of its own, and no list of every
/// suspended app's descriptors rebuilt at each suspension (a thousand suspended apps made each
/// launch's suspension a poll over two thousand descriptors).
///
/// Thread-safe: launch workers take and put; watches evict (on a worker).
package final class SuspendedApps: @unchecked Sendable {
    package let budgetBytes: UInt64
    package let maximumCount: Int
    /// Apps suspended within this many seconds of each other are one priority band: among
    /// them, the largest goes first.
    package static let bandSeconds: UInt64 = 10
    private let logger: Logger
    private let lock = NSLock()
    /// Called with the app after a suspended app was evicted for memory pressure (the budget,
    /// the kernel's pressure): MetricKit counts those exits (`cumulativeMemoryPressureExitCount`).
    package var onMemoryPressureEviction: (@Sendable (String) -> Void)?
    private var suspended: [String: SuspendedApp] = [:]
    /// The counted bytes of all of `suspended` (`SuspendedApp.residentBytes`: measured, or the
    /// bound), kept as it changes (`put`, `takeOut`; under `lock`).
    private var heldBytes: UInt64 = 0
    /// How many of `suspended` are counted by their bound (not measured yet).
    private var unmeasuredCount = 0
    /// Apps whose private memory a thread reads now (`measureUnmeasured`).
    private var measuring: Set<String> = []
    /// Per suspended app: the watch over the pidfds of the host's child and of the app's own
    /// process (below a namespace's init, which is stopped too and would not notice the app's
    /// death).
    private var watches: [String: SuspendedWatch] = [:]
    private var evictions: [String: AppProcessEviction] = [:]
    /// Apps whose process runs a launch now (taken out), with its pid.
    private var running: [String: pid_t] = [:]
    private var pressure: Int32 = -1
    private var pressureWatched = false
    private var stopped = false

    /// What runs a launch's cleanup once its process is gone (the supervisor's orphan reaping).
    package var afterReap: (pid_t) -> Void = { _ in }

    package init(budgetBytes: UInt64, maximumCount: Int, logger: Logger) {
        self.budgetBytes = budgetBytes
        self.maximumCount = maximumCount
        self.logger = logger
        pressure = Self.pressureTrigger()
    }

    /// A PSI trigger on memory: readable (POLLPRI) when tasks stalled on memory for 100 ms
    /// within one second (`some`). -1 where the kernel has no PSI or refuses the trigger.
    package static func pressureTrigger() -> Int32 {
        let fd = open("/proc/pressure/memory", O_RDWR | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return -1 }
        let trigger = "some 100000 1000000"
        let written = trigger.withCString { write(fd, $0, strlen($0) + 1) }
        if written < 0 {
            close(fd)
            return -1
        }
        return fd
    }

    /// What a host on this machine has for its suspended apps, for `bgtask doctor`: how they
    /// are held, and whether the kernel's memory pressure evicts them.
    package static func machineSummary() -> String {
        let trigger = pressureTrigger()
        if trigger >= 0 { close(trigger) }
        let pressure = trigger >= 0
            ? "the kernel's memory pressure evicts them (PSI, /proc/pressure/memory)"
            : "no memory-pressure signal (no PSI trigger on /proc/pressure/memory: \(String(cString: strerror(errno)))); only the budget and the count evict them"
        return "suspended apps are stopped (SIGSTOP; with a delegated cgroup also frozen), within --suspended-memory (default \(RunRecord.mib(ProcessInfo.processInfo.physicalMemory / 4)), a quarter of this machine's) and --max-suspended-apps; \(pressure)"
    }

    /// Whether the kernel's memory pressure is watched.
    package var watchesPressure: Bool { pressure >= 0 }

    // MARK: Launches

    /// The app's suspended process, taken out of the table to run a launch, if it has one that
    /// can run it (`key`); one that cannot (its bundle changed) is evicted, and the launch is
    /// fresh. The app's last eviction is returned (and forgotten) when there is no process.
    package func take(_ app: String, key: SuspendedApp.Key, bringsEvents: Bool) -> (process: SuspendedApp?, eviction: AppProcessEviction?) {
        let found: SuspendedApp? = lock.withLock { suspended[app] }
        if let found, found.key != key {
            evict(app, reason: "its bundle changed (a new executable, app groups or confinement); the next launch starts a new process")
        } else if let found, bringsEvents, !found.hearsResumes {
            evict(app, reason: "the launch brought what only a launch entry hears (the foreground, a push, an event) and the app set no resume handler (BGTaskPlugin.entry's didResume, UIApplication.entry)")
        }
        return lock.withLock {
            if let process = takeOut(app), process.key == key, process.hearsResumes || !bringsEvents {
                watches.removeValue(forKey: app)?.cancel()
                running[app] = process.pid
                return (process, nil)
            }
            return (nil, evictions.removeValue(forKey: app))
        }
    }

    /// A fresh process of `app` runs a launch now (for `bgtask apps`).
    package func started(_ app: String, pid: pid_t) {
        lock.withLock { running[app] = pid }
    }

    /// The app's launch ended and its process did not stay.
    package func ended(_ app: String) {
        _ = lock.withLock { running.removeValue(forKey: app) }
    }

    /// Puts a process whose launch's work is over, already stopped, in the table; then evicts
    /// what is over the budget. False when the host is stopping (the caller ends it instead).
    package func suspend(_ process: SuspendedApp) -> Bool {
        let fds = Set([process.pid, process.appPID]).map { bgtask_pidfd_open($0) }.filter { $0 >= 0 }
        let watch = SuspendedWatch(app: process.app, pidfds: fds, apps: self)
        // Its loop is known before anyone can cancel it (a resume on another worker).
        let loop = SupervisionLoops.next()
        watch.home = loop
        let (accepted, watchPressure): (Bool, Bool) = lock.withLock {
            running.removeValue(forKey: process.app)
            guard !stopped else { return (false, false) }
            put(process)
            watches[process.app] = watch
            defer { pressureWatched = true }
            return (true, !pressureWatched && pressure >= 0)
        }
        guard accepted else {
            fds.forEach { close($0) }
            return false
        }
        if let loop {
            loop.add(watch)
            if watchPressure { loop.add(PressureWatch(fd: pressure, apps: self)) }
        }
        enforceBudget(sparing: process.app)
        return true
    }

    /// Puts `process` in the table as it is (no pidfd, no watcher, no budget): for tests of
    /// the eviction order.
    package func insertForTesting(_ process: SuspendedApp) {
        lock.withLock { put(process) }
    }

    // MARK: Jetsam

    /// The order suspended apps are evicted in: least recently used band first, then largest.
    package func evictionOrder() -> [String] {
        lock.withLock {
            suspended.values.sorted { a, b in
                let bandA = a.suspendedAtNs / (Self.bandSeconds * 1_000_000_000), bandB = b.suspendedAtNs / (Self.bandSeconds * 1_000_000_000)
                if bandA != bandB { return bandA < bandB }
                if a.residentBytes != b.residentBytes { return a.residentBytes > b.residentBytes }
                return a.suspendedAtNs < b.suspendedAtNs
            }.map(\.app)
        }
    }

    /// Descriptors each suspended app holds in the host: its channel, its log pipe, two pidfds.
    package static let descriptorsPerApp = 4

    /// The most apps suspended at once: `maximumCount`, and no more than a quarter of the host's
    /// descriptors (RLIMIT_NOFILE, asked each time, as the transfers' bound is) can hold: a
    /// host under systemd's default 1,024 keeps 64, and its other work its descriptors.
    package var effectiveMaximumCount: Int {
        min(maximumCount, Descriptors.limit() / 4 / Self.descriptorsPerApp)
    }

    /// Evicts in `evictionOrder` until the suspended apps fit the budget and the count. The app
    /// just suspended (`sparing`) goes last: evicting what was used a moment ago would only
    /// make its next launch start over.
    package func enforceBudget(sparing: String? = nil) {
        var measured = false
        while true {
            let (total, count, unmeasured) = lock.withLock { (heldBytes, suspended.count, unmeasuredCount) }
            let maximumCount = effectiveMaximumCount
            guard total > budgetBytes || count > maximumCount else { return }
            // Over on the bound: the private memory of each app not yet measured, then again.
            // Every eviction is decided on measured figures (its order: the largest first).
            if unmeasured > 0 && !measured {
                // Another thread still reads some: it decides what goes once it has (an app
                // whose bound is large may hold little of its own; a reader of `states` or
                // `suspendedBytes` enforces the budget after its reads).
                if measureUnmeasured(untilFits: count <= maximumCount) { return }
                measured = true
                continue
            }
            // Sorted only when one must go: each suspension sorting a thousand suspended apps
            // was a tenth of the host's CPU while a thousand launches ended at once.
            let order = evictionOrder()
            guard let first = order.first(where: { $0 != sparing }) ?? order.first else { return }
            let reason = count > maximumCount
                ? "more than \(maximumCount) apps were suspended (--max-suspended-apps \(self.maximumCount); a quarter of the host's RLIMIT_NOFILE \(Descriptors.limit()) holds \(Descriptors.limit() / 4 / Self.descriptorsPerApp))"
                : "the suspended apps held \(RunRecord.mib(total)), over the budget of \(RunRecord.mib(budgetBytes)) (--suspended-memory)"
            if evict(first, reason: "jetsam: \(reason); it was the least recently used") { onMemoryPressureEviction?(first) }
        }
    }

    /// Ends `app`'s suspended process (SIGKILL to its group, its cgroup), reaps it and records
    /// why. False (and nothing done) when it has none.
    @discardableResult
    package func evict(_ app: String, reason: String, watchedBy watch: SuspendedWatch? = nil) -> Bool {
        let taken: SuspendedApp? = lock.withLock {
            // A watch's word is about its own process only: the app may have been resumed and
            // suspended again since (another process, another watch).
            if let watch, watches[app] !== watch { return nil }
            guard let process = takeOut(app) else { return nil }
            watches.removeValue(forKey: app)?.cancel()
            return process
        }
        guard let process = taken else { return false }
        // What the eviction gave back, read while the process is still there (stopped); a
        // process that died on its own is known by its bound only, and so is every process
        // when the host stops (nobody will ask).
        let bytes = lock.withLock { stopped } ? process.residentBytes : process.privateBytes()
        end(process)
        lock.withLock {
            evictions[app] = AppProcessEviction(reason: reason, at: Date(), residentBytes: bytes)
        }
        logger.info("evicted a suspended app", metadata: [
            "bundle.id": "\(app)", "pid": "\(process.pid)", "rss": "\(bytes)", "reason": "\(reason)"])
        return true
    }

    /// Every suspended app ends (the host stops); none is taken in after.
    package func stop(reason: String) {
        let apps: [String] = lock.withLock {
            stopped = true
            return Array(suspended.keys)
        }
        for app in apps { evict(app, reason: reason) }
    }

    /// Ends a kept process that is not in the table (the host stopped before it could be put
    /// there): killed, reaped, its descriptors and cgroup released.
    package func endUnkept(_ process: SuspendedApp) {
        ended(process.app)
        end(process)
    }

    private func end(_ process: SuspendedApp) {
        LaunchSupervisor.terminate(process.pid, cgroup: process.cgroup)
        var status: Int32 = 0
        _ = bgtask_wait4(process.pid, &status, 0, nil)
        process.channel.close()
        if process.logReadEnd >= 0 { close(process.logReadEnd) }
        process.cgroup?.remove()
        LaunchSupervisor.activeRunners.withLock { _ = $0.remove(process.pid) }
        afterReap(process.pid)
    }

    // MARK: What apps see

    package func states() -> [AppProcessState] {
        measureAllAndEnforce()
        return lock.withLock {
            var states: [AppProcessState] = suspended.values.map {
                AppProcessState(app: $0.app, state: .suspended, pid: $0.pid, residentBytes: $0.residentBytes,
                                suspendedSince: $0.suspendedAt, launches: $0.launches, lastEviction: nil)
            }
            for (app, pid) in running where suspended[app] == nil {
                states.append(AppProcessState(app: app, state: .running, pid: pid))
            }
            for (app, eviction) in evictions where suspended[app] == nil && running[app] == nil {
                states.append(AppProcessState(app: app, state: .notRunning, lastEviction: eviction))
            }
            return states.sorted { $0.app < $1.app }
        }
    }

    package var suspendedCount: Int { lock.withLock { suspended.count } }
    /// What the suspended apps are counted for now, measured or not (for tests).
    package var countedBytes: UInt64 { lock.withLock { heldBytes } }
    /// The measured private memory of all suspended apps.
    package var suspendedBytes: UInt64 {
        measureAllAndEnforce()
        return lock.withLock { heldBytes }
    }

    /// Every suspended app's private memory read, for a reader that shows it; then the budget,
    /// since a suspension over it while this read left the eviction to it.
    private func measureAllAndEnforce() {
        measureUnmeasured()
        enforceBudget()
    }

    /// Under `lock`: `process` in the table, its bytes counted.
    private func put(_ process: SuspendedApp) {
        if let old = suspended.updateValue(process, forKey: process.app) {
            heldBytes -= old.residentBytes
            if !old.residentMeasured { unmeasuredCount -= 1 }
        }
        heldBytes += process.residentBytes
        if !process.residentMeasured { unmeasuredCount += 1 }
    }

    /// Under `lock`: `app`'s process out of the table, its bytes no longer counted.
    private func takeOut(_ app: String) -> SuspendedApp? {
        guard let process = suspended.removeValue(forKey: app) else { return nil }
        heldBytes -= process.residentBytes
        if !process.residentMeasured { unmeasuredCount -= 1 }
        return process
    }

    /// Reads the private memory of suspended apps counted by their bound so far, the largest
    /// bound first: until the counts fit the budget (`untilFits`), or all of them. Each read is
    /// outside the lock (a launch worker may take or put meanwhile) and kept for a process still
    /// suspended as it was read (the same pid, suspended at the same moment). An app is claimed
    /// before it is read (`measuring`): launch workers suspending apps at once each read
    /// different apps, never the same one again (at a thousand launches ending together, four
    /// workers each reading every app was a CPU spike in the middle of the expirations). Each
    /// suspension is read at most once; one that cannot be read (it died while stopped: its
    /// watch evicts it) keeps its bound. Returns whether another thread still reads some.
    @discardableResult
    private func measureUnmeasured(untilFits: Bool = false) -> Bool {
        let candidates: [SuspendedApp] = lock.withLock {
            guard unmeasuredCount > 0 else { return [] }
            return suspended.values.filter { !$0.residentMeasured }.sorted { $0.residentBytes > $1.residentBytes }
        }
        /// Under `lock`: the same suspension as `candidate`, still counted by its bound.
        func unmeasured(_ candidate: SuspendedApp) -> SuspendedApp? {
            guard let process = suspended[candidate.app], process.pid == candidate.pid,
                  process.suspendedAtNs == candidate.suspendedAtNs, !process.residentMeasured else { return nil }
            return process
        }
        for candidate in candidates {
            // nil: the counts fit, no more is needed.
            let claimed: Bool? = lock.withLock {
                if untilFits && heldBytes <= budgetBytes { return nil }
                guard unmeasured(candidate) != nil, !measuring.contains(candidate.app) else { return false }
                measuring.insert(candidate.app)
                return true
            }
            guard let claimed else { break }
            guard claimed else { continue }
            let bytes = candidate.privateBytes()
            lock.withLock {
                measuring.remove(candidate.app)
                guard var process = unmeasured(candidate) else { return }
                process.residentBytes = bytes
                process.residentMeasured = true
                put(process)
            }
        }
        return lock.withLock { !measuring.isEmpty }
    }

    // MARK: The watches

    /// The kernel asked for memory back (the pressure trigger fired): the first in eviction
    /// order goes.
    package func pressureReported() {
        measureUnmeasured()
        guard let first = evictionOrder().first else { return }
        if evict(first, reason: "jetsam: the kernel reported memory pressure (tasks stalled on memory for 100 ms within a second, /proc/pressure/memory); it was the least recently used") {
            onMemoryPressureEviction?(first)
        }
    }
}

/// One suspended app's pidfds on a supervision loop: readable is a process that died while
/// stopped. Its eviction runs on a launch worker. `cancel` (the app was resumed or evicted)
/// takes it off its loop, which closes the pidfds once they are out of its set.
package final class SuspendedWatch: SupervisionLoop.Source, @unchecked Sendable {
    package let app: String
    private let pidfds: [Int32]
    private weak var apps: SuspendedApps?
    package weak var home: SupervisionLoop?
    private let lock = NSLock()
    private var cancelled = false

    package init(app: String, pidfds: [Int32], apps: SuspendedApps) {
        self.app = app
        self.pidfds = pidfds
        self.apps = apps
    }

    package var descriptors: [(fd: Int32, events: UInt32)] { pidfds.map { ($0, BGTASK_EPOLL_IN) } }
    package var deadline: UInt64 { .max }

    package func fire(ready: UInt32, now: UInt64) -> Bool {
        if lock.withLock({ cancelled }) { return false }
        guard ready != 0 else { return true }
        LaunchSupervisor.workers.run { [self, apps] in
            apps?.evict(app, reason: "its process died while it was suspended", watchedBy: self)
        }
        return false
    }

    package func retire() {
        pidfds.forEach { close($0) }
    }

    /// Any thread: off its loop at the loop's next turn (its pidfds closed then).
    package func cancel() {
        lock.withLock { cancelled = true }
        guard let home else {
            retire()
            return
        }
        home.execute { [self] in home.refire(self) }
    }
}

/// The kernel's memory-pressure trigger (PSI) on a supervision loop: readable (EPOLLPRI) when
/// tasks stalled on memory; the first suspended app in eviction order goes, on a launch worker.
package final class PressureWatch: SupervisionLoop.Source, @unchecked Sendable {
    private let fd: Int32
    private weak var apps: SuspendedApps?

    package init(fd: Int32, apps: SuspendedApps) {
        self.fd = fd
        self.apps = apps
    }

    package var descriptors: [(fd: Int32, events: UInt32)] { [(fd, BGTASK_EPOLL_PRI)] }
    package var deadline: UInt64 { .max }

    package func fire(ready: UInt32, now: UInt64) -> Bool {
        guard let apps else { return false }
        if ready != 0 { LaunchSupervisor.workers.run { apps.pressureReported() } }
        return true
    }

    package func retire() {}
}

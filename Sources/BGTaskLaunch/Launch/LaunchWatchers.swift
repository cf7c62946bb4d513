import BGTaskControl
import BGTaskSystem
import Foundation
import _BGTaskSystemShims

/// The disk reserve, watched for one launch (`LaunchLimits.diskReserveBytes`): the containers'
/// filesystem looked at every `checkInterval`, every 5 ms once it is within four reserves of
/// it; under it, what the launch's containers hold is measured, and a launch whose containers
/// grew by more than a MiB since is to be killed.
package struct DiskReserveWatch {
    package let reserve: UInt64
    package let containers: [String]
    package let checkInterval: UInt64
    package private(set) var nextCheckNs: UInt64
    /// What the containers held at the first look under the reserve.
    private var heldWhenUnder: UInt64?

    package static let closeInterval: UInt64 = 5_000_000
    package static let growthAllowed: UInt64 = 1 << 20

    package init(reserve: UInt64, containers: [String], startNs: UInt64, checkInterval: UInt64) {
        self.reserve = reserve
        self.containers = containers
        self.checkInterval = checkInterval
        nextCheckNs = startNs + checkInterval
    }

    package var isOn: Bool { reserve > 0 && !containers.isEmpty }

    /// Looks when due. Returns why the launch must be killed, or nil.
    package mutating func check(at now: UInt64) -> String? {
        guard isOn, now >= nextCheckNs else { return nil }
        var free = Self.availableBytesShared(containers[0], now: now)
        if free / 4 < reserve { free = Self.availableBytes(containers[0]) }
        guard free < reserve else {
            heldWhenUnder = nil
            nextCheckNs = now + (free / 4 < reserve ? Self.closeInterval : checkInterval)
            return nil
        }
        nextCheckNs = now + Self.closeInterval
        if deferWalks {
            // On a supervision loop: measured on a worker (`walked`), one walk at a time.
            walkWanted = (free: free, at: now)
            return nil
        }
        return walked(held: Self.bytesHeld(containers), free: free)
    }

    /// As `DiskQuotaWatch.deferWalks`: the containers are measured on a worker, never on the
    /// loop (`walkWanted`: the filesystem's free bytes when the walk was asked for).
    package var deferWalks = false
    package var walkWanted: (free: UInt64, at: UInt64)?

    /// What the containers hold now was measured (`bytesHeld`): why the launch must be killed,
    /// or nil.
    package mutating func walked(held: UInt64, free: UInt64) -> String? {
        walkWanted = nil
        guard let before = heldWhenUnder else {
            heldWhenUnder = held
            return nil
        }
        guard held > before + Self.growthAllowed else { return nil }
        return "wrote \(RunRecord.mib(held - before)) more into its containers while their filesystem had \(RunRecord.mib(free)) free, under the host's reserve of \(RunRecord.mib(reserve)) (--disk-reserve)"
    }

    /// Bytes the unprivileged may still write on the filesystem holding `path` (UInt64.max
    /// when it cannot be asked: no reserve is enforced on what cannot be measured).
    package static func availableBytes(_ path: String) -> UInt64 {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return .max }
        return UInt64(info.f_bavail) * UInt64(info.f_frsize)
    }

    /// `availableBytes` of the filesystem holding the directory `path` is in, shared by every
    /// launch whose container is in that directory, asked again after `closeInterval`: a
    /// thousand launches far from the reserve ask the filesystem 200 times a second instead of
    /// 10,000. Only for a look that finds the filesystem far from the reserve (`check` asks
    /// its own container once it is within four reserves).
    package static func availableBytesShared(_ path: String, now: UInt64) -> UInt64 {
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? path
        if let cached = sharedLooks.withLock({ $0[directory] }), now < cached.at + closeInterval { return cached.free }
        let free = availableBytes(path)
        sharedLooks.withLock { $0[directory] = (now, free) }
        return free
    }

    private static let sharedLooks = LockedValue([String: (at: UInt64, free: UInt64)]())

    /// What the directories hold on disk (allocated blocks), links not followed, other
    /// filesystems not entered, at most a million entries each.
    package static func bytesHeld(_ directories: [String]) -> UInt64 {
        directories.reduce(0) { $0 + UInt64(max(0, bgtask_directory_usage($1, 1_000_000))) }
    }
}

/// The CPU monitor of one launch (`LaunchLimits.cpuLimit`): the CPU time of the launch's
/// processes (its cgroup's `cpu.stat` when it has one, else the app's process with the children
/// it has reaped), read every twelfth of the window, and the CPU it used over the trailing
/// window: from the reading that is a window old (the first reading while the launch is younger
/// than that). Past the limit, the launch is to be killed. A reading is late by at most a
/// twelfth of the window, so is the kill; a resumed process's CPU before the launch is not its.
package struct CPUMonitor {
    package let limit: CPULimit
    package private(set) var nextCheckNs: UInt64
    private let interval: UInt64
    private let windowNs: UInt64
    /// Readings within the last window and the newest older one, oldest first.
    private var readings: [(at: UInt64, cpuNs: UInt64)] = []

    /// The launch's CPU time so far: its cgroup's, else its app process's with the children it
    /// reaped (nil while the app's process is not known yet).
    package static func cpuNs(pid: pid_t, app: pid_t?, cgroup: CgroupV2.LaunchGroup?) -> UInt64? {
        if let cgroup { return cgroup.cpuUsageNs }
        guard let app = app ?? ProcessTree.appProcess(of: pid) else { return nil }
        return ProcessTree.cpuNanoseconds(of: app, reapedChildren: true)
    }

    package static let firstReadingNs: UInt64 = 100_000_000

    package init(limit: CPULimit, startNs: UInt64) {
        self.limit = limit
        windowNs = UInt64(max(limit.window.nanoseconds, 1))
        interval = max(windowNs / 12, 10_000_000)
        // The first reading (the window's base) 100 ms in, off the launch's start: most launches
        // are over by then and are never read; what a launch uses in its first 100 ms is not
        // counted against its window.
        nextCheckNs = startNs + min(Self.firstReadingNs, interval)
    }

    /// Reads when due (`cpuNs` reads the launch's CPU time; nil: not readable yet, such as a
    /// namespace still being made). Returns why the launch must be killed, or nil.
    package mutating func check(at now: UInt64, cpuNs: () -> UInt64?) -> String? {
        guard now >= nextCheckNs else { return nil }
        nextCheckNs = now + interval
        guard let cpu = cpuNs() else { return nil }
        readings.append((now, cpu))
        // Keep one reading at or before the window's start, and those after it.
        while readings.count > 2, readings[1].at + windowNs <= now { readings.removeFirst() }
        let base = readings[0]
        let used = cpu > base.cpuNs ? cpu - base.cpuNs : 0
        // Over the window (the base reading can be up to a check older than it: the allowance
        // grows with it, so a steady use under the limit is never taken for one over it).
        let allowed = UInt64(Double(limit.allowedNs) * max(1, Double(now - base.at) / Double(windowNs)))
        guard used > allowed else { return nil }
        let span = Double(now - base.at) / 1e9
        let share = span > 0 ? Double(used) / 1e9 / span * 100 : 0
        return String(format: "used %.1f s of CPU in %.1f s (%.0f%% of a core), ", Double(used) / 1e9, span, share)
            + "over the background limit of \(limit) (iOS's CPU monitor)"
    }
}

/// The memory sampler of one launch (without a cgroup): the resident memory of the app's process
/// and its descendants, plus shared memory only open files show, sampled adaptively (the next
/// sample comes before the launch, growing as fast as it last did, could cross half of its
/// remaining headroom; never sooner than 0.5 ms). Descendants are looked for every
/// `descendantInterval` when the runner says it has a child (or did not answer), and every
/// `checkInterval` whatever it says.
package struct MemorySampler {
    package let limit: UInt64
    package let sampleInterval: UInt64
    /// While resident memory does not grow (see `LaunchSupervisor.memorySampleInterval`).
    package let maximumInterval: UInt64
    package let burstBytesPerNs: Double
    /// The launch's first `maximumInterval` is sampled every `sampleInterval` whatever it does:
    /// a process that is loading grows in steps the steady rule would miss (and most launches
    /// are over by then).
    package let relaxAfterNs: UInt64
    package let descendantInterval: UInt64
    package let checkInterval: UInt64
    package private(set) var nextSampleNs: UInt64 = 0
    private var lastSample: (at: UInt64, rss: UInt64)?
    private var nextDescendantWalkNs: UInt64
    private var nextUnconditionalWalkNs: UInt64
    private var knownDescendants: [pid_t] = []
    private var probeSent = false
    private var heldSharedBytes: UInt64 = 0
    /// The app's own process: the runner, or pid 2 of the launch's PID namespace (see
    /// ProcessTree.appProcess). Found at the first sample; until the runner has reported its
    /// confinement (after its namespace is made), "no namespace" is not taken as final.
    package private(set) var app: pid_t?
    /// The app's /proc/PID/statm, kept open (see `ProcessTree.ResidentMemory`).
    private var appMemory: ProcessTree.ResidentMemory?
    private var gate = MachineGate()

    package init(limit: UInt64, startNs: UInt64, sampleInterval: UInt64, maximumInterval: UInt64 = 0, burstBytesPerNs: Double = .infinity,
         descendantInterval: UInt64, checkInterval: UInt64) {
        self.limit = limit
        self.sampleInterval = sampleInterval
        self.maximumInterval = max(sampleInterval, maximumInterval)
        self.burstBytesPerNs = burstBytesPerNs
        relaxAfterNs = startNs + max(sampleInterval, maximumInterval)
        self.descendantInterval = descendantInterval
        self.checkInterval = checkInterval
        nextDescendantWalkNs = startNs + descendantInterval
        nextUnconditionalWalkNs = startNs + checkInterval
    }

    /// Samples when due: the launch's resident bytes (its peak is kept in `state`), or nil when
    /// no sample was due. `probe` asks the runner whether it has a child (true when sent).
    package mutating func sample(at now: UInt64, runner pid: pid_t, state: inout LaunchState, probe: () -> Bool) -> UInt64? {
        guard now >= nextSampleNs else { return nil }
        let counted: pid_t
        if let app {
            counted = app
        } else if let found = ProcessTree.appProcess(of: pid) {
            counted = found
            if found != pid || state.sandbox != nil { app = found }
        } else {
            // A namespace is being made and its app is not there yet: the outer process shares
            // the zygote's memory, which is not the app's to count. Look again shortly.
            nextSampleNs = now + sampleInterval
            return nil
        }
        if now >= nextDescendantWalkNs {
            // Walk when the runner said it has a child, or when it did not answer, and every
            // `checkInterval` whatever it said: its answer saves a short launch the walk, it
            // cannot hide a child for longer than that.
            if (probeSent && state.childrenAnswer != false) || now >= nextUnconditionalWalkNs {
                let periodic = now >= nextUnconditionalWalkNs
                if periodic { nextUnconditionalWalkNs = now + checkInterval }
                // A periodic walk of a launch that had no child finds none while no process has
                // been made on the machine since its last walk (see `MachineGate`).
                if !(periodic && knownDescendants.isEmpty && !gate.processesMayHaveStarted(at: now)) {
                    knownDescendants = ProcessTree.descendants(of: counted)
                    gate.walked(at: now)
                }
                if !knownDescendants.isEmpty { state.hadDescendants = true }
                // Memory no process's resident set shows (a memfd written but not mapped, POSIX
                // shared memory): looked for at the periodic walk only, and only when it may
                // have grown enough to matter (see `MachineGate`).
                let last = lastSample?.rss ?? 0
                if periodic, gate.sharedMemoryMayMatter(at: now, holding: heldSharedBytes, headroom: limit > last ? limit - last : 0) {
                    heldSharedBytes = ProcessTree.sharedMemoryBytes(of: [counted] + knownDescendants)
                }
            } else {
                knownDescendants = []
            }
            state.childrenAnswer = nil
            // A launch past its first moments that has no child is looked at by the periodic
            // walk only: the probe (a message each way, two wake-ups of this thread) would ask
            // what the walk is about to see anyway. At a thousand sleeping launches, the probes
            // were a third of the host's supervision.
            let steady = now >= relaxAfterNs && knownDescendants.isEmpty
            nextDescendantWalkNs = steady ? nextUnconditionalWalkNs : now + descendantInterval
            probeSent = nextDescendantWalkNs < nextUnconditionalWalkNs ? probe() : false
        }
        if appMemory?.pid != counted { appMemory = ProcessTree.ResidentMemory(pid: counted) }
        let own = appMemory?.bytes ?? ProcessTree.residentBytes(ofProcess: counted)
        let rss = knownDescendants.reduce(own) { $0 + ProcessTree.residentBytes(ofProcess: $1) } + heldSharedBytes
        state.peakRSS = max(state.peakRSS, rss)
        var interval = sampleInterval
        if let last = lastSample, rss > last.rss, now > last.at, rss < limit {
            let bytesPerNs = Double(rss - last.rss) / Double(now - last.at)
            let untilHalfHeadroom = Double(limit - rss) / 2 / bytesPerNs
            interval = UInt64(min(Double(sampleInterval), max(500_000, untilHalfHeadroom)))
        } else if rss < limit, now >= relaxAfterNs, burstBytesPerNs.isFinite, burstBytesPerNs > 0 {
            // Not growing: as long as a burst at the fastest rate needs to reach 10 % over the limit.
            let untilOvershoot = (Double(limit) * 1.1 - Double(rss)) / burstBytesPerNs
            interval = UInt64(min(Double(maximumInterval), max(Double(sampleInterval), untilOvershoot)))
        }
        lastSample = (now, rss)
        nextSampleNs = now + interval
        return rss
    }
}

extension LaunchLoop {
    /// What the launch's app process has used, read just before it is killed (see
    /// `LaunchState.lookBeforeKill`).
    package func lookBeforeKill(_ state: inout LaunchState) {
        guard state.lookBeforeKill == nil else { return }
        let app = memory.app ?? ProcessTree.appProcess(of: pid)
        state.lookBeforeKill = (CPUMonitor.cpuNs(pid: pid, app: app, cgroup: state.cgroup), app.flatMap { EnergyCounters.of($0) })
        if let app { state.traffic.sample(app, now: bgtask_monotonic_ns()) }
    }

    /// How often a running launch's sockets are sampled at most (`SocketTraffic`), `elapsed`
    /// into it: every 250 ms at first, then an eighth of the time it has run, at most every 5 s;
    /// an app that had no TCP socket open at the last sample, every second at first, then a
    /// quarter of its time. Each sample lists the app's descriptors (/proc/PID/fd): every 250 ms
    /// for 1,000 sleeping launches that was 9-10 % of the host's CPU (perf, `bgtask-bench --only
    /// dashboard`, `--only scale`). The work-over and pre-kill samples are taken whatever the
    /// interval.
    static func trafficInterval(after elapsed: UInt64, sockets: Bool) -> UInt64 {
        sockets ? min(max(250_000_000, elapsed / 8), 5_000_000_000) : min(max(1_000_000_000, elapsed / 4), 5_000_000_000)
    }

    /// The app's sockets' bytes so far (`SocketTraffic`).
    package func sampleTraffic(_ state: inout LaunchState, now: UInt64) {
        guard let app = memory.app ?? ProcessTree.appProcess(of: pid) else { return }
        state.traffic.sample(app, now: now)
    }

    mutating func checkCPU(at now: UInt64, _ state: LaunchState) -> String? {
        guard var monitor = cpu else { return nil }
        defer { cpu = monitor }
        let (pid, app, cgroup) = (pid, memory.app, state.cgroup)
        return monitor.check(at: now) { CPUMonitor.cpuNs(pid: pid, app: app, cgroup: cgroup) }
    }
}

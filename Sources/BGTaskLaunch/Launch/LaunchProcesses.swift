import BGTaskControl
import BGTaskSystem
import Foundation
import Glibc
import _BGTaskSystemShims

/// The processes of launches as this process sees them: which runners it supervises, which
/// children are a launch's leftovers, and how they are killed and reaped.
extension LaunchSupervisor {
    /// Runner pids of launches this process is supervising, so that orphan reaping never
    /// touches another launch's runner.
    package static let activeRunners = LockedValue(Set<pid_t>())

    /// The process this host started that `pid` is, or descends from (a launch's runner, the
    /// zygote or a spare), or nil. Every launch is the host's child (spawned, or forked by the
    /// zygote with CLONE_PARENT), and a launch's processes cannot leave its runner's tree (the
    /// system-call filter refuses CLONE_PARENT and giving up the subreaper; orphans come back
    /// to the runner, or to the host, a subreaper too), so the parent chain finds it, even for a
    /// launch the host has not finished recording yet: how the control socket recognises a
    /// launch whatever its uid.
    ///
    /// The walk stops at the first process that started before this one: nothing this process
    /// started can be its ancestor (a parent is older than its child, and an orphan goes up to
    /// an older subreaper or init). A client started before the host (a shell, a test, a
    /// service manager's tool) costs one read of /proc instead of one per ancestor up to init.
    public static func launchRunner(containing pid: pid_t) -> pid_t? {
        let host = getpid()
        guard pid != host else { return nil }
        // Unknown (no /proc of its own to read): the whole chain is walked.
        let hostStart = hostStartTicks ?? 0
        var current = pid
        for _ in 0..<256 {
            guard current > 1, let (parent, start) = ProcessTree.parentAndStart(of: current), parent != current,
                  start >= hostStart else { return nil }
            if parent == host { return current }
            current = parent
        }
        return nil
    }

    /// When this process started (clock ticks since boot), read once.
    private static let hostStartTicks: UInt64? = ProcessTree.parentAndStart(of: getpid())?.start

    /// Whether every child of this process that is not a running launch's runner, the zygote or
    /// a spare is a launch's leftover, as in the host daemon and `bgtask run`, which start
    /// nothing else: then every zombie child is reaped, whatever it was. An embedding process
    /// (the tests) leaves it false: its own children are not this code's to reap, so a zombie
    /// is reaped only when its process group was the launch's.
    public static var adoptsEveryChild: Bool {
        get { adoptsEveryChildValue.withLock { $0 } }
        set { adoptsEveryChildValue.withLock { $0 = newValue } }
    }
    private static let adoptsEveryChildValue = LockedValue(false)

    /// Kills and reaps processes re-parented to this process (it is a child subreaper) that
    /// are descendants of launches whose runner died: children that are not the runner of a
    /// running launch and carry a launch's `BGTASK_LAUNCH_ID` in their environment or are in
    /// the process group of the launch that ended (`launchGroup`: its runner's pid), with
    /// everything below them; and zombies: a killed launch's processes die as zombies of their
    /// parents, which die too, and come here already dead, with no environment left to
    /// recognise (hundreds of them after a fork-happy launch was killed, until no pid was left).
    /// A zombie is reaped when its group was the launch's (or an orphan's killed here), or
    /// whatever it was with `adoptsEveryChild`. Other children of an embedding process are left
    /// alone.
    ///
    /// `sparing`: the zygote and its spares, which are this process's children too. They are
    /// not even looked at: reading a spare's /proc entries would make its reaping slower once
    /// it has become a launch.
    package static func reapOrphans(sparing: Set<pid_t> = [], launchGroup: pid_t? = nil) {
        let everyChild = adoptsEveryChild
        // Under the lock that spawning holds, so a runner spawned a moment ago (not yet in
        // activeRunners) is never taken for an orphan.
        spawnLock.withLock {
            var groups = Set(launchGroup.map { [$0] } ?? [])
            var zombies: [(pid: pid_t, group: pid_t)] = []
            for child in ProcessTree.adoptedChildren(of: getpid())
            where !sparing.contains(child) && !activeRunners.withLock({ $0.contains(child) }) {
                guard let (state, group) = ProcessTree.status(of: child) else { continue }
                if state == UInt8(ascii: "Z") {
                    zombies.append((child, group))
                    continue
                }
                // Still alive, or dying: a process of the launch's group may be past the point
                // where its environment can be read, and is the launch's all the same.
                guard groups.contains(group) || ProcessTree.isLaunchProcess(child) else { continue }
                groups.insert(group)
                reapKilled(child, ProcessTree.killTree(child))
            }
            var status: Int32 = 0
            for (zombie, group) in zombies where everyChild || groups.contains(group) {
                _ = bgtask_wait4(zombie, &status, WNOHANG, nil)
            }
        }
    }

    /// Reaps `orphan`, killed, then its `descendants` (killed with it): each comes to this
    /// process (the nearest subreaper) when its parent dies, so they are waited for in passes,
    /// each pass reaping those that are this process's children by then, until a pass finds
    /// none (the rest were reaped by parents of their own before those died).
    private static func reapKilled(_ orphan: pid_t, _ descendants: Set<pid_t>) {
        var status: Int32 = 0
        _ = bgtask_wait4(orphan, &status, 0, nil)
        // Never a running launch's runner, should a pid have been reused since.
        var left = descendants.subtracting(activeRunners.withLock { $0 })
        while !left.isEmpty {
            let reaped = left.filter { bgtask_wait4($0, &status, 0, nil) == $0 }
            if reaped.isEmpty { break }
            left.subtract(reaped)
        }
    }

    /// Held from starting a runner until it is in `activeRunners`, and while reaping orphans.
    package static let spawnLock = NSLock()
}

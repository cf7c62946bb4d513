#if os(Linux)
import BGTaskControl
import BGTaskSystem
import Foundation
import Glibc

/// Kernel-enforced limits through a delegated cgroup v2 directory (`--cgroup DIR`, or the one
/// `--cgroup auto` claims: see `CgroupV2.Delegation`).
///
/// bgtask never writes to the machine's own cgroup hierarchy: it only creates, uses and removes
/// one child cgroup per launch inside the directory it was handed, which must be a cgroup v2
/// directory the user may write, with the memory controller enabled for its children
/// (`+memory` in its `cgroup.subtree_control`; `+pids` too for a process limit).
package enum CgroupV2 {
    /// One launch's cgroup. Created before the runner receives its launch, so every process of
    /// the plugin starts inside it. Its limits: `memory.max` (with `memory.swap.max` 0 and
    /// `memory.oom.group` 1) and `pids.max`; it ends with `cgroup.kill`.
    package struct LaunchGroup {
        package let url: URL
        /// The `pids.max` written (the pids controller counts threads as well as processes),
        /// or nil when the launch has no process limit.
        package private(set) var processLimit: Int?
        /// What the kernel lacks for this group, each with what is done instead (for the host
        /// to report once).
        package private(set) var fallbacks: [String] = []

        package init(url: URL) { self.url = url }

        /// Checks that `root` is a usable delegated cgroup v2 directory. Returns what launches
        /// under it will go without (no pids controller: no process limit; no `cgroup.kill`).
        @discardableResult
        package static func validate(root: URL) throws(BGTaskError) -> [String] {
            let controllers = root.appendingPathComponent("cgroup.controllers")
            guard FileManager.default.fileExists(atPath: controllers.path) else {
                throw BGTaskError(.invalidRequest, file: root.path, "not a cgroup v2 directory (no cgroup.controllers)")
            }
            let subtreePath = root.appendingPathComponent("cgroup.subtree_control").path
            let subtree = CgroupV2.words(subtreePath)
            guard subtree.contains("memory") else {
                throw BGTaskError(.invalidRequest, file: subtreePath,
                                  "the memory controller is not enabled for children (write +memory here first)")
            }
            guard access(root.path, W_OK) == 0 else {
                throw BGTaskError(.invalidRequest, file: root.path, errno: errno, "the cgroup directory is not writable (it must be delegated to this user)")
            }
            var notes: [String] = []
            if !subtree.contains("pids") {
                notes.append("\(subtreePath): the pids controller is not enabled for children (write +pids here): launches get no process limit (pids.max)")
            }
            // Every non-root cgroup has cgroup.kill from Linux 5.14 on; its absence here says
            // the launches' groups will lack it too.
            if !CgroupV2.exists(root.appendingPathComponent("cgroup.kill").path) {
                notes.append(Self.noKill)
            }
            return notes
        }

        package static func create(under root: URL, launchID: String, memoryMax: UInt64?, processMax: Int?) throws(BGTaskError) -> LaunchGroup {
            let url = root.appendingPathComponent("bgtask-\(launchID)")
            try syscall("mkdir \(url.path)") { mkdir(url.path, 0o755) }
            var group = LaunchGroup(url: url)
            do {
                try group.configure(memoryMax: memoryMax, processMax: processMax)
            } catch {
                group.remove()
                throw error
            }
            return group
        }

        /// Writes the launch's limits into its (new, empty) group. A file the kernel lacks is a
        /// fallback, noted in `fallbacks`; any other failure throws.
        package mutating func configure(memoryMax: UInt64?, processMax: Int?) throws(BGTaskError) {
            if let memoryMax {
                try write("memory.max", "\(memoryMax)")
                // Swap would let a launch hold more than its limit without being killed. (No
                // such file: the kernel does not account swap, so there is nothing to close.)
                if has("memory.swap.max") { try write("memory.swap.max", "0") }
                // An OOM kill takes the whole launch, as jetsam does, not one process of it.
                if has("memory.oom.group") {
                    try write("memory.oom.group", "1")
                } else {
                    fallbacks.append("memory.oom.group is missing (Linux before 4.19): an OOM kill takes one process of the launch, the supervisor then kills the rest")
                }
                if !has("memory.peak") {
                    fallbacks.append("memory.peak is missing (Linux before 5.19): peak_rss_bytes does not cover the whole launch (at most the runner's own peak)")
                }
            }
            if let processMax {
                if has("pids.max") {
                    try write("pids.max", "\(processMax)")
                    processLimit = processMax
                } else {
                    fallbacks.append("pids.max is missing (the pids controller is not enabled for \(url.deletingLastPathComponent().path)'s children: add +pids to its cgroup.subtree_control): launches have no process limit")
                }
            }
            if !has("cgroup.kill") { fallbacks.append(Self.noKill) }
        }

        package static let noKill = "cgroup.kill is missing (Linux before 5.14): a launch is ended by freezing its cgroup (cgroup.freeze) and killing its processes one by one"

        /// Moves `pid` into the group, then the processes already below it (a zygote spare made
        /// its PID namespace's init and app before the launch came): what they fork from now on
        /// is born in the group. Twice, for one that forked while the first pass moved its parent.
        package func add(_ pid: pid_t) throws(BGTaskError) {
            try write("cgroup.procs", "\(pid)")
            for _ in 0..<2 {
                for descendant in ProcessTree.descendants(of: pid) { try? write("cgroup.procs", "\(descendant)") }
            }
        }

        /// Number of OOM kills in this cgroup so far.
        package var oomKills: Int {
            let events = (try? String(contentsOf: url.appendingPathComponent("memory.events"), encoding: .utf8)) ?? ""
            for line in events.split(separator: "\n") where line.hasPrefix("oom_kill ") {
                return Int(line.dropFirst("oom_kill ".count)) ?? 0
            }
            return 0
        }

        /// Peak memory charged to the cgroup (memory.peak, kernel 5.19+), or nil.
        package var peakBytes: UInt64? {
            (try? String(contentsOf: url.appendingPathComponent("memory.peak"), encoding: .utf8))
                .flatMap { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }

        package var currentBytes: UInt64 {
            (try? String(contentsOf: url.appendingPathComponent("memory.current"), encoding: .utf8))
                .flatMap { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 0
        }

        /// Kills every process in the cgroup at once, even those that left the launch's process
        /// group or tree (cgroup.kill, Linux 5.14+). Without it: freeze the cgroup so nothing in
        /// it can fork while its list is read (cgroup.freeze, 5.2+; a frozen process still dies
        /// of SIGKILL), then kill what the list holds.
        package func killAll() {
            if (try? write("cgroup.kill", "1")) != nil { return }
            _ = try? write("cgroup.freeze", "1")
            for pid in processes { kill(pid, SIGKILL) }
        }

        /// Freezes (or thaws) every process in the cgroup (`cgroup.freeze`, Linux 5.2+): how a
        /// suspended app is held where a cgroup is delegated, beside the `SIGSTOP` of its group
        /// (which a process that left the group would miss). Nothing where the file is missing.
        package func freeze(_ frozen: Bool) {
            _ = try? write("cgroup.freeze", frozen ? "1" : "0")
        }

        /// CPU time of everything in the cgroup, alive or gone (`cpu.stat`'s `usage_usec`, kept
        /// by every cgroup v2 whatever its controllers), in nanoseconds.
        package var cpuUsageNs: UInt64? {
            let text = (try? String(contentsOf: url.appendingPathComponent("cpu.stat"), encoding: .utf8)) ?? ""
            for line in text.split(separator: "\n") where line.hasPrefix("usage_usec ") {
                return UInt64(line.dropFirst("usage_usec ".count)).map { $0 * 1000 }
            }
            return nil
        }

        package var processes: [pid_t] {
            ((try? String(contentsOf: url.appendingPathComponent("cgroup.procs"), encoding: .utf8)) ?? "")
                .split(separator: "\n").compactMap { pid_t($0) }
        }

        /// Kills what is left and removes the cgroup (waiting briefly for the kernel to empty it).
        package func remove() {
            for _ in 0..<200 {
                killAll()
                if rmdir(url.path) == 0 || errno == ENOENT { return }
                usleep(5_000)
            }
        }

        private func has(_ file: String) -> Bool {
            CgroupV2.exists(url.appendingPathComponent(file).path)
        }

        private func write(_ file: String, _ value: String) throws(BGTaskError) {
            try CgroupV2.write(url.appendingPathComponent(file).path, value)
        }
    }

    /// Writes `value` into a cgroup interface file (which must exist: the kernel makes them;
    /// nothing is created here).
    package static func write(_ path: String, _ value: String) throws(BGTaskError) {
        let fd = try syscall("open \(path)") { open(path, O_WRONLY | O_TRUNC | O_CLOEXEC) }
        defer { close(fd) }
        let bytes = Array(value.utf8)
        try syscall("write \(path)") { Glibc.write(fd, bytes, bytes.count) }
    }

    package static func exists(_ path: String) -> Bool {
        access(path, F_OK) == 0
    }

    /// The whitespace-separated words of a cgroup file (`cgroup.controllers`,
    /// `cgroup.subtree_control`); none when it cannot be read.
    package static func words(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(whereSeparator: \.isWhitespace).map(String.init)
    }
}
#endif

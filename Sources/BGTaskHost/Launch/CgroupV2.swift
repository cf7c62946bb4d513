#if os(Linux)
import Foundation
import Glibc

/// Kernel-enforced memory limits through a delegated cgroup v2 directory (`--cgroup DIR`).
///
/// bgtask never writes to the machine's own cgroup hierarchy: it only creates, uses and removes
/// one child cgroup per launch inside the directory it was handed, which must be a cgroup v2
/// directory the user may write, with the memory controller enabled for its children
/// (`+memory` in its `cgroup.subtree_control`).
enum CgroupV2 {
    /// One launch's cgroup. Created before the runner receives its launch, so every process of
    /// the plugin starts inside it.
    struct LaunchGroup {
        let url: URL

        /// Checks that `root` is a usable delegated cgroup v2 directory.
        static func validate(root: URL) throws(BGTaskError) {
            let controllers = root.appendingPathComponent("cgroup.controllers")
            guard FileManager.default.fileExists(atPath: controllers.path) else {
                throw BGTaskError(.invalidRequest, file: root.path, "not a cgroup v2 directory (no cgroup.controllers)")
            }
            let subtree = (try? String(contentsOf: root.appendingPathComponent("cgroup.subtree_control"), encoding: .utf8)) ?? ""
            guard subtree.split(whereSeparator: \.isWhitespace).contains("memory") else {
                throw BGTaskError(.invalidRequest, file: root.appendingPathComponent("cgroup.subtree_control").path,
                                  "the memory controller is not enabled for children (write +memory here first)")
            }
            guard access(root.path, W_OK) == 0 else {
                throw BGTaskError(.invalidRequest, file: root.path, errno: errno, "the cgroup directory is not writable (it must be delegated to this user)")
            }
        }

        static func create(under root: URL, launchID: String, memoryMax: UInt64) throws(BGTaskError) -> LaunchGroup {
            let url = root.appendingPathComponent("bgtask-\(launchID)")
            try syscall("mkdir \(url.path)") { mkdir(url.path, 0o755) }
            let group = LaunchGroup(url: url)
            do {
                try group.write("memory.max", "\(memoryMax)")
                // Swap would let a launch hold more than its limit without being killed.
                if FileManager.default.fileExists(atPath: url.appendingPathComponent("memory.swap.max").path) {
                    try group.write("memory.swap.max", "0")
                }
                // An OOM kill takes the whole launch, as jetsam does, not one process of it.
                try group.write("memory.oom.group", "1")
            } catch {
                group.remove()
                throw error
            }
            return group
        }

        func add(_ pid: pid_t) throws(BGTaskError) {
            try write("cgroup.procs", "\(pid)")
        }

        /// Number of OOM kills in this cgroup so far.
        var oomKills: Int {
            let events = (try? String(contentsOf: url.appendingPathComponent("memory.events"), encoding: .utf8)) ?? ""
            for line in events.split(separator: "\n") where line.hasPrefix("oom_kill ") {
                return Int(line.dropFirst("oom_kill ".count)) ?? 0
            }
            return 0
        }

        /// Peak memory charged to the cgroup (memory.peak, kernel 5.19+), or nil.
        var peakBytes: UInt64? {
            (try? String(contentsOf: url.appendingPathComponent("memory.peak"), encoding: .utf8))
                .flatMap { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }

        var currentBytes: UInt64 {
            (try? String(contentsOf: url.appendingPathComponent("memory.current"), encoding: .utf8))
                .flatMap { UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 0
        }

        /// Kills every process in the cgroup (cgroup.kill, kernel 5.14+; else one by one).
        func killAll() {
            if (try? write("cgroup.kill", "1")) != nil { return }
            for pid in processes { kill(pid, SIGKILL) }
        }

        var processes: [pid_t] {
            ((try? String(contentsOf: url.appendingPathComponent("cgroup.procs"), encoding: .utf8)) ?? "")
                .split(separator: "\n").compactMap { pid_t($0) }
        }

        /// Kills what is left and removes the cgroup (waiting briefly for the kernel to empty it).
        func remove() {
            for _ in 0..<200 {
                killAll()
                if rmdir(url.path) == 0 || errno == ENOENT { return }
                usleep(5_000)
            }
        }

        private func write(_ file: String, _ value: String) throws(BGTaskError) {
            let path = url.appendingPathComponent(file).path
            let fd = try syscall("open \(path)") { open(path, O_WRONLY | O_CLOEXEC) }
            defer { close(fd) }
            let bytes = Array(value.utf8)
            try syscall("write \(path)") { Glibc.write(fd, bytes, bytes.count) }
        }
    }
}
#endif

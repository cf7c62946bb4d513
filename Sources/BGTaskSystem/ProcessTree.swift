import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A launch's processes: the runner and every descendant, found through
/// `/proc/PID/task/TID/children`. The runner is a child subreaper, so a grandchild whose
/// parent died (or that called `setsid`) is re-parented to the runner and stays in this tree;
/// process groups and sessions cannot hide it.
///
/// Shared by the host (a launch's tree, orphans after a crash) and the runner (its own
/// descendants when a launch ends). Linux only; not async-signal-safe.
public enum ProcessTree {
    /// Every descendant of `root` (not `root` itself), parents before children.
    public static func descendants(of root: pid_t) -> [pid_t] {
        var result: [pid_t] = []
        var queue = children(of: root)
        var seen = Set<pid_t>()
        while let pid = queue.first {
            queue.removeFirst()
            guard seen.insert(pid).inserted else { continue }
            result.append(pid)
            queue.append(contentsOf: children(of: pid))
        }
        return result
    }

    /// The orphans `pid` (a child subreaper, or init) has adopted: the children of its main
    /// thread. The kernel gives an orphan to the first live thread of the reaper's thread group
    /// (`find_new_reaper`, `find_alive_thread` in kernel/exit.c), which is its main thread while
    /// that lives; a child of another thread whose thread ended goes there too. When the main
    /// thread has ended (or is ending) every thread is looked at, as `children(of:)` does.
    ///
    /// One read instead of one per thread: a host supervising a thousand launches has a
    /// thousand threads, and its every killed launch looked for orphans (`reapOrphans`), a
    /// thousand /proc reads each.
    public static func adoptedChildren(of pid: pid_t) -> [pid_t] {
        // /proc/PID/stat's state is the main thread's.
        if let main = status(of: pid), main.state != UInt8(ascii: "Z"), main.state != UInt8(ascii: "X") {
            return readPIDs("/proc/\(pid)/task/\(pid)/children")
        }
        return children(of: pid)
    }

    /// Direct children of `pid`, over all of its threads.
    public static func children(of pid: pid_t) -> [pid_t] {
        guard let tasks = opendir("/proc/\(pid)/task") else { return [] }
        defer { closedir(tasks) }
        var result: [pid_t] = []
        while let entry = readdir(tasks) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
            guard let tid = Int32(name) else { continue }
            result.append(contentsOf: readPIDs("/proc/\(pid)/task/\(tid)/children"))
        }
        return result
    }

    /// The app's process of a launch whose runner is `root`: `root` itself, or, when `root`
    /// made a PID namespace for what it starts (the runner's namespace.c: its only child is the
    /// namespace's init, whose first child is the app), pid 2 of that namespace, as this process
    /// sees it. Nil while the namespace is made and its app is not there yet. The outer process
    /// and the init are the launch's machinery: not the app's memory, not its descendants.
    public static func appProcess(of root: pid_t) -> pid_t? {
        let own = link("/proc/\(root)/ns/pid"), forChildren = link("/proc/\(root)/ns/pid_for_children")
        guard !own.isEmpty, !forChildren.isEmpty, own != forChildren else { return root }
        // Each is single-threaded: its main thread's children, not a readdir of its tasks (the
        // entries that makes would make the launch's reap spin; see `children(of:)`'s callers).
        guard let namespaceInit = readPIDs("/proc/\(root)/task/\(root)/children").first else { return nil }
        return readPIDs("/proc/\(namespaceInit)/task/\(namespaceInit)/children").first
    }

    private static func link(_ path: String) -> [CChar] {
        var target = [CChar](repeating: 0, count: 64)
        let length = readlink(path, &target, target.count)
        return length > 0 ? Array(target[..<length]) : []
    }

    /// Resident bytes of `root` and all its descendants (pages shared after fork count once
    /// per process: an upper bound, which is the safe side for a memory limit).
    public static func residentBytes(of root: pid_t) -> UInt64 {
        ([root] + descendants(of: root)).reduce(0) { $0 + residentBytes(ofProcess: $1) }
    }

    public static func residentBytes(ofProcess pid: pid_t) -> UInt64 {
        residentBytes(statm: readFile("/proc/\(pid)/statm"))
    }

    /// The memory only `pid` holds (its private pages, clean and dirty: what ending it gives
    /// back), from `/proc/PID/smaps_rollup`; 0 when it cannot be read. A process forked from the
    /// zygote shares most of its resident pages with it, which its RSS counts and this does not.
    public static func uniqueBytes(ofProcess pid: pid_t) -> UInt64 {
        let text = String(decoding: readFile("/proc/\(pid)/smaps_rollup", limit: 8192), as: UTF8.self)
        var kilobytes: UInt64 = 0
        for line in text.split(separator: "\n") where line.hasPrefix("Private_Clean:") || line.hasPrefix("Private_Dirty:") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            if fields.count >= 2, let value = UInt64(fields[1]) { kilobytes += value }
        }
        return kilobytes * 1024
    }

    /// The CPU time of `pid`'s threads so far, to the nanosecond, from its process CPU clock
    /// (`clock_getcpuclockid`'s clock, made here as glibc makes it, without glibc's check):
    /// one system call, no /proc path to open and parse. Nil once the process is gone.
    public static func cpuClockNanoseconds(of pid: pid_t) -> UInt64? {
        // MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), as <linux/posix-timers.h> defines it.
        let clock = clockid_t((~Int32(pid)) << 3 | 2)
        var now = timespec()
        guard clock_gettime(clock, &now) == 0 else { return nil }
        return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
    }

    /// CPU time `pid` has used, all its threads, user and system (`/proc/PID/stat` fields 14
    /// and 15, in clock ticks: 10 ms steps), in nanoseconds; nil when it cannot be read.
    /// With `reapedChildren`, the CPU of the children it has waited for too (fields 16 and 17).
    public static func cpuNanoseconds(of pid: pid_t, reapedChildren: Bool = false) -> UInt64? {
        let bytes = readFile("/proc/\(pid)/stat")
        // The command (field 2) may hold spaces and parentheses: fields count from its last ')'.
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = bytes[(close + 1)...].split(separator: UInt8(ascii: " "))
        // fields[0] is the state (field 3): utime is field 14, stime field 15, cutime 16, cstime 17.
        let used = reapedChildren ? 11...14 : 11...12
        guard fields.count > used.upperBound else { return nil }
        var ticks: UInt64 = 0
        for index in used {
            guard let value = UInt64(String(decoding: fields[index], as: UTF8.self)) else { return nil }
            ticks += value
        }
        return ticks * (1_000_000_000 / UInt64(max(sysconf(Int32(_SC_CLK_TCK)), 1)))
    }

    /// The resident bytes /proc/PID/statm says (its second field, in pages).
    static func residentBytes(statm: some Collection<UInt8>) -> UInt64 {
        let fields = statm.split(separator: UInt8(ascii: " "), maxSplits: 2)
        guard fields.count > 1, let pages = UInt64(String(decoding: fields[1], as: UTF8.self)) else { return 0 }
        return pages * pageSize
    }

    static let pageSize = UInt64(sysconf(Int32(_SC_PAGESIZE)))

    /// One process's resident memory, read again and again through the same open
    /// /proc/PID/statm (a read at offset 0 makes the kernel write it anew): a sampler that
    /// reads it a dozen times a second saves the path's lookup (three /proc components, the
    /// pid's revalidation) each time. The descriptor is bound to the process, not its number: once
    /// the process is gone it reads 0, never a later process's memory.
    public final class ResidentMemory {
        private let fd: Int32
        public let pid: pid_t

        public init?(pid: pid_t) {
            fd = open("/proc/\(pid)/statm", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return nil }
            self.pid = pid
        }

        deinit { close(fd) }

        public var bytes: UInt64 {
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 128) { buffer in
                let n = pread(fd, buffer.baseAddress, buffer.count, 0)
                return n > 0 ? ProcessTree.residentBytes(statm: buffer[0..<n]) : 0
            }
        }
    }

    /// Bytes held in memory-backed files that `pids` have open and that resident memory does
    /// not show: memfds (`/memfd:NAME`) and POSIX shared memory (`/dev/shm/...`), each file
    /// counted once however many of them hold it (its allocated blocks). A memfd that is also
    /// mapped counts in resident memory too: an upper bound, the safe side for a limit.
    /// Reads /proc/PID/fd: for the sampler's periodic look, not for every sample.
    public static func sharedMemoryBytes(of pids: [pid_t]) -> UInt64 {
        var seen = Set<UInt64>()
        var total: UInt64 = 0
        var target = [CChar](repeating: 0, count: 256)
        let memfd = Array("/memfd:".utf8), shm = Array("/dev/shm/".utf8)
        for pid in pids {
            guard let entries = opendir("/proc/\(pid)/fd") else { continue }
            defer { closedir(entries) }
            // Each link read from the directory's descriptor: no path lookup per descriptor.
            let directory = dirfd(entries)
            while let entry = readdir(entries) {
                let isNumber = withUnsafeBytes(of: entry.pointee.d_name) { name in
                    name.first.map { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") } ?? false
                }
                guard isNumber else { continue }
                let length = withUnsafeBytes(of: entry.pointee.d_name) { name in
                    name.withMemoryRebound(to: CChar.self) { readlinkat(directory, $0.baseAddress!, &target, target.count - 1) }
                }
                guard length > 0 else { continue }
                let linked = target[..<length].map { UInt8(bitPattern: $0) }
                guard linked.starts(with: memfd) || linked.starts(with: shm) else { continue }
                var info = stat()
                let found = withUnsafeBytes(of: entry.pointee.d_name) { name in
                    name.withMemoryRebound(to: CChar.self) { fstatat(directory, $0.baseAddress!, &info, 0) }
                }
                guard found == 0 else { continue }
                if seen.insert(UInt64(info.st_dev) << 40 ^ UInt64(info.st_ino)).inserted {
                    total += UInt64(max(info.st_blocks, 0)) * 512
                }
            }
        }
        return total
    }

    /// SIGKILLs every descendant of `root`, repeating until none is left (a process being
    /// killed may have forked a moment before), then `root` itself. Does not reap. Returns
    /// every descendant it saw, zombies included: once their parents die they are re-parented
    /// to the nearest subreaper, which must reap them.
    @discardableResult
    public static func killTree(_ root: pid_t) -> Set<pid_t> {
        var seen = Set<pid_t>()
        for _ in 0..<64 {
            let all = descendants(of: root)
            seen.formUnion(all)
            // Zombies are dead already; only their parent (or, later, this process) can reap them.
            let pids = all.filter { !isZombie($0) }
            if pids.isEmpty { break }
            for pid in pids { kill(pid, SIGKILL) }
        }
        kill(root, SIGKILL)
        return seen
    }

    public static func isZombie(_ pid: pid_t) -> Bool {
        status(of: pid)?.state == UInt8(ascii: "Z")
    }

    /// The state letter (`R`, `S`, `Z`, ...) and process group of `pid`, from /proc/PID/stat,
    /// which a zombie still has (its cmdline and environ are gone). Nil when it is gone.
    public static func status(of pid: pid_t) -> (state: UInt8, processGroup: pid_t)? {
        let stat = readFile("/proc/\(pid)/stat")
        // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so fields are
        // counted from its last ")".
        guard let close = stat.lastIndex(of: UInt8(ascii: ")")), close + 2 < stat.count else { return nil }
        let fields = stat[(close + 2)...].split(separator: UInt8(ascii: " "), maxSplits: 3)
        guard fields.count >= 3, let group = pid_t(String(decoding: fields[2], as: UTF8.self)) else { return nil }
        return (stat[close + 2], group)
    }

    /// The parent of `pid` (from /proc/PID/stat), or nil when it is gone.
    public static func parent(of pid: pid_t) -> pid_t? {
        parentAndStart(of: pid)?.parent
    }

    /// The parent of `pid` and when `pid` started (clock ticks since boot, `/proc/PID/stat`'s
    /// field 22), from one read; nil once it is gone.
    public static func parentAndStart(of pid: pid_t) -> (parent: pid_t, start: UInt64)? {
        let stat = readFile("/proc/\(pid)/stat")
        // After the command's closing parenthesis: state (field 3), ppid (4), ..., starttime (22).
        guard let close = stat.lastIndex(of: UInt8(ascii: ")")), close + 2 < stat.count else { return nil }
        let fields = stat[(close + 2)...].split(separator: UInt8(ascii: " "), maxSplits: 20)
        guard fields.count >= 20, let parent = pid_t(String(decoding: fields[1], as: UTF8.self)),
              let start = UInt64(String(decoding: fields[19], as: UTF8.self)) else { return nil }
        return (parent, start)
    }

    /// True when `pid` runs with a launch's environment (`BGTASK_LAUNCH_ID`), i.e. it is a
    /// runner or something a plugin started. A plugin that clears its environment before
    /// forking and then kills its own runner can hide an orphan from this test; the runner
    /// kills its descendants itself on every normal exit.
    public static func isLaunchProcess(_ pid: pid_t) -> Bool {
        let cmdline = readFile("/proc/\(pid)/cmdline")
        if cmdline.starts(with: Array("bgtask-launch ".utf8)) { return true }
        // A zygote, or a spare it forked that has not become a launch yet: `bgtask-runner
        // --zygote`, with the host's environment. Not read further (every launch's end asks).
        if cmdline.split(separator: 0).dropFirst().first.map({ $0.elementsEqual("--zygote".utf8) }) == true { return false }
        let environment = readFile("/proc/\(pid)/environ", limit: 1 << 20)
        return environment.split(separator: 0).contains { $0.starts(with: Array("BGTASK_LAUNCH_ID=".utf8)) }
    }

    private static func readPIDs(_ path: String) -> [pid_t] {
        readFile(path).split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") })
            .compactMap { pid_t(String(decoding: $0, as: UTF8.self)) }
    }

    /// The file's first `limit` bytes, read into a buffer that grows as needed (an environment
    /// is usually a few KiB; the limit is not allocated up front). Empty when it cannot be read.
    public static func readFile(_ path: String, limit: Int = 4096) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: min(limit, 4096))
        var total = 0
        while true {
            if total == buffer.count {
                guard buffer.count < limit else { break }
                buffer += [UInt8](repeating: 0, count: min(buffer.count, limit - buffer.count))
            }
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + total, $0.count - total) }
            if n <= 0 { break }
            total += n
        }
        return Array(buffer[0..<total])
    }
}

extension ProcessTree {
    /// The `BGTASK_LAUNCH_ID` in `pid`'s environment, or nil (not a launch process, or gone).
    public static func launchID(of pid: pid_t) -> String? {
        // A runner (and what it forked) carries its launch in its title: "bgtask-launch ID APP".
        if let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline"),
           cmdline.starts(with: Array("bgtask-launch ".utf8)) {
            let words = cmdline.prefix { $0 != 0 }.split(separator: UInt8(ascii: " "))
            if words.count >= 2 { return String(decoding: words[1], as: UTF8.self) }
        }
        let path = "/proc/\(pid)/environ"
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        for entry in data.split(separator: 0) where entry.starts(with: Array("BGTASK_LAUNCH_ID=".utf8)) {
            return String(decoding: entry.dropFirst("BGTASK_LAUNCH_ID=".count), as: UTF8.self)
        }
        return nil
    }
}

/// What a process cost the device beside its CPU time, as the kernel counts it: storage bytes
/// written and read (pages dirtied in files, reads that reached the device) and wake-ups
/// (voluntary context switches: each a sleep its thread was woken from).
public struct EnergyCounters: Sendable, Equatable {
    public var diskWrittenBytes: UInt64
    public var diskReadBytes: UInt64
    public var wakeups: UInt64

    public init(diskWrittenBytes: UInt64 = 0, diskReadBytes: UInt64 = 0, wakeups: UInt64 = 0) {
        self.diskWrittenBytes = diskWrittenBytes
        self.diskReadBytes = diskReadBytes
        self.wakeups = wakeups
    }

    /// From a reaped process's rusage: its whole life and that of the children it reaped
    /// (`ru_oublock` and `ru_inblock` are the kernel's `write_bytes` and `read_bytes` in 512-byte
    /// blocks).
    public init(usage: rusage) {
        self.init(diskWrittenBytes: UInt64(max(usage.ru_oublock, 0)) * 512, diskReadBytes: UInt64(max(usage.ru_inblock, 0)) * 512,
                  wakeups: UInt64(max(usage.ru_nvcsw, 0)))
    }

    /// Each counter the larger of the two.
    public func atLeast(_ other: EnergyCounters) -> EnergyCounters {
        EnergyCounters(diskWrittenBytes: max(diskWrittenBytes, other.diskWrittenBytes), diskReadBytes: max(diskReadBytes, other.diskReadBytes),
                       wakeups: max(wakeups, other.wakeups))
    }

    /// What was counted since `earlier` (a counter that went back counts as 0).
    public func since(_ earlier: EnergyCounters) -> EnergyCounters {
        EnergyCounters(diskWrittenBytes: diskWrittenBytes > earlier.diskWrittenBytes ? diskWrittenBytes - earlier.diskWrittenBytes : 0,
                       diskReadBytes: diskReadBytes > earlier.diskReadBytes ? diskReadBytes - earlier.diskReadBytes : 0,
                       wakeups: wakeups > earlier.wakeups ? wakeups - earlier.wakeups : 0)
    }

    /// A living process's counters: /proc/PID/io (all its threads, and the children it reaped)
    /// and the voluntary switches of each of its threads (/proc/PID/task/*/status). Nil when
    /// its io cannot be read (gone, or not ours to read).
    /// `allThreads` false: the main thread's switches only (one file, for a look on a hot path
    /// where the app's own count, which no /proc file sums, refines it).
    public static func of(_ pid: pid_t, allThreads: Bool = true) -> EnergyCounters? {
        let io = ProcessTree.readFile("/proc/\(pid)/io")
        guard !io.isEmpty else { return nil }
        var counters = EnergyCounters()
        for line in io.split(separator: UInt8(ascii: "\n")) {
            let text = String(decoding: line, as: UTF8.self)
            if text.hasPrefix("write_bytes: ") { counters.diskWrittenBytes = UInt64(text.dropFirst(13)) ?? 0 }
            if text.hasPrefix("read_bytes: ") { counters.diskReadBytes = UInt64(text.dropFirst(12)) ?? 0 }
        }
        let threads = allThreads ? ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []) : [String(pid)]
        // At most 256 threads' (a look made on a supervision loop before a kill must stay
        // short); an app with more has the rest's wake-ups left out.
        for thread in threads.prefix(256) {
            let status = ProcessTree.readFile("/proc/\(pid)/task/\(thread)/status", limit: 8192)
            for line in status.split(separator: UInt8(ascii: "\n")) where line.starts(with: "voluntary_ctxt_switches:".utf8) {
                let value = String(decoding: line.dropFirst(24), as: UTF8.self).trimmingCharacters(in: .whitespaces)
                counters.wakeups += UInt64(value) ?? 0
            }
        }
        return counters
    }
}

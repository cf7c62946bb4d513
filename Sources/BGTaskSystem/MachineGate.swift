import Glibc
import Synchronization

/// Whether the two expensive looks of a sleeping launch's supervision can be skipped, from two
/// counters the machine keeps for everyone (read at most every 5 ms for all launches together):
///
/// - **The walk for descendants** (a readdir of the app's threads and a read of each one's
///   children): a launch that had no child cannot have one while no process or thread has been
///   made on the machine since its last walk (the last pid in /proc/loadavg has not moved: a pid
///   made in a launch's namespace is made in the host's too).
/// - **The memfd and POSIX shared memory scan** (a readlink per open descriptor of each of the
///   launch's processes, each making a /proc inode: the most expensive part of supervising a
///   sleeping launch). Whatever a process writes into a memfd or /dev/shm is shared memory,
///   which the machine counts (`Shmem` in /proc/meminfo). While that count has not grown over
///   its lowest since the launch's last scan by more than the launch's headroom (its limit
///   less what its last sample counted), the launch cannot be over its limit, whatever it
///   wrote: the scan is skipped. It is done when the count grew by more, while the last scan
///   found some, and at least every `forcedInterval` (others freeing shared memory while the
///   launch fills some could mask the growth).
package struct MachineGate {
    package static let forcedInterval: UInt64 = 1_000_000_000
    private var lowestShared: UInt64?
    private var lastScanNs: UInt64?
    private var lastPIDAtWalk: Int64?
    private var lastWalkNs: UInt64?

    package func processesMayHaveStarted(at now: UInt64, _ counters: Counters? = nil) -> Bool {
        guard let walked = lastWalkNs, now < walked + Self.forcedInterval,
              let before = lastPIDAtWalk, let current = (counters ?? Self.counters(now: now)).lastPID else { return true }
        return current != before
    }

    /// The walk was done now (the last pid read before it: a process made during it counts).
    package mutating func walked(at now: UInt64, _ counters: Counters? = nil) {
        lastWalkNs = now
        lastPIDAtWalk = (counters ?? Self.counters(now: now)).lastPID
    }

    /// True when the scan is due now (and it is taken as done).
    package mutating func sharedMemoryMayMatter(at now: UInt64, holding: UInt64, headroom: UInt64, _ counters: Counters? = nil) -> Bool {
        let machine = (counters ?? Self.counters(now: now)).sharedBytes
        defer { if let machine { lowestShared = min(lowestShared ?? machine, machine) } }
        var due = holding > 0 || machine == nil || lowestShared == nil
        if let last = lastScanNs, now >= last + Self.forcedInterval { due = true }
        if let machine, let lowest = lowestShared, machine > lowest, machine - lowest >= headroom { due = true }
        if due {
            lastScanNs = now
            lowestShared = machine
        }
        return due
    }

    package struct Counters {
        package var sharedBytes: UInt64?
        package var lastPID: Int64?

        /// The memberwise initializer, for the modules above this one.
        package init(sharedBytes: UInt64? = nil, lastPID: Int64? = nil) {
            self.sharedBytes = sharedBytes
            self.lastPID = lastPID
        }
    }

    /// The machine's counters, shared by all launches for 5 ms.
    package static func counters(now: UInt64) -> Counters {
        if let cached = cache.withLock({ $0 }), now < cached.at + 5_000_000 { return cached.counters }
        let counters = Counters(sharedBytes: field(of: "/proc/meminfo", after: "\nShmem:").map { $0 * 1024 },
                                lastPID: lastField(of: "/proc/loadavg"))
        cache.withLock { $0 = (now, counters) }
        return counters
    }

    private static let cache = Mutex<(at: UInt64, counters: Counters)?>(nil)

    /// The number after `key` in the file (spaces skipped).
    private static func field(of path: String, after key: String) -> UInt64? {
        read(path) { text in
            let needle = Array(key.utf8)
            var at = 0
            search: while at + needle.count <= text.count {
                for (offset, byte) in needle.enumerated() where text[at + offset] != byte {
                    at += 1
                    continue search
                }
                break
            }
            guard at + needle.count <= text.count else { return nil }
            at += needle.count
            while at < text.count, text[at] == UInt8(ascii: " ") { at += 1 }
            var value: UInt64 = 0
            let start = at
            while at < text.count, text[at] >= UInt8(ascii: "0"), text[at] <= UInt8(ascii: "9") {
                value = value &* 10 &+ UInt64(text[at] - UInt8(ascii: "0"))
                at += 1
            }
            return at > start ? value : nil
        }
    }

    /// The file's last space-separated number (/proc/loadavg: the last pid made).
    private static func lastField(of path: String) -> Int64? {
        read(path) { text in
            var end = text.count
            while end > 0, text[end - 1] < UInt8(ascii: "0") || text[end - 1] > UInt8(ascii: "9") { end -= 1 }
            var start = end
            while start > 0, text[start - 1] >= UInt8(ascii: "0"), text[start - 1] <= UInt8(ascii: "9") { start -= 1 }
            guard start < end else { return nil }
            return text[start..<end].reduce(Int64(0)) { $0 &* 10 &+ Int64($1 - UInt8(ascii: "0")) }
        }
    }

    private static func read<T>(_ path: String, _ body: (UnsafeBufferPointer<UInt8>) -> T?) -> T? {
        let bytes = ProcessTree.readFile(path, limit: 16_384)
        return bytes.isEmpty ? nil : bytes.withUnsafeBufferPointer(body)
    }

    /// The memberwise initializer, for the modules above this one.
    package init(lowestShared: UInt64? = nil, lastScanNs: UInt64? = nil, lastPIDAtWalk: Int64? = nil, lastWalkNs: UInt64? = nil) {
        self.lowestShared = lowestShared
        self.lastScanNs = lastScanNs
        self.lastPIDAtWalk = lastPIDAtWalk
        self.lastWalkNs = lastWalkNs
    }
}

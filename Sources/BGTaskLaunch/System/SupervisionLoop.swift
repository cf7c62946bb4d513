import Foundation
import Glibc
import HeapModule
import _BGTaskSystemShims

/// A reactor, as systemd's sd-event or launchd's kqueue loop: one thread, one epoll set whose
/// wait times out at the earliest deadline of all its sources (epoll_pwait2, to the
/// nanosecond), one eventfd for work handed in from other threads. It supervises any number of launches without a thread or a poll loop
/// each: at a thousand launches the host had a thousand threads, each waking for its own
/// deadlines, and its expirations came tens of milliseconds late on two cores.
///
/// A `Source` (a launch's supervision: `SupervisedLaunch`) names its descriptors and its next
/// deadline after each turn; the loop keeps the epoll set and the deadline heap in step with
/// what it named (a descriptor it no longer names is taken out of the set; one it closed
/// itself is gone from the set already). `fire` runs on the loop's thread only, so a source's
/// state needs no lock; it must not block (no wait4 on a live process, no blocking send).
///
/// The deadline is the wait's timeout, not a timerfd: one system call per wake-up where a
/// timerfd re-armed at each wake-up made two (`timerfd_settime` was a tenth of a loop's CPU at
/// a hundred launches).
package final class SupervisionLoop: @unchecked Sendable {
    /// What a loop drives.
    package protocol Source: AnyObject, Sendable {
        /// On the loop's thread: `ready` has bit `n` set when descriptor `n` of those last named
        /// is ready (readable, writable as asked, or hung up); `now` is monotonic nanoseconds.
        /// Returns false when the source is done: its descriptors are then taken out of the set
        /// and the loop forgets it.
        func fire(ready: UInt32, now: UInt64) -> Bool
        /// Its descriptors (at most 16; -1 for none) and the events each waits for
        /// (`BGTASK_EPOLL_IN`, `BGTASK_EPOLL_OUT`), as of the end of its last turn.
        var descriptors: [(fd: Int32, events: UInt32)] { get }
        /// When it must fire next whatever its descriptors do (monotonic ns; `.max`: never).
        var deadline: UInt64 { get }
        /// On the loop's thread, once the source is done and its descriptors are out of the
        /// set: from here on the loop never touches it (it may close them, or hand itself on).
        func retire()
    }

    private struct Entry {
        let source: any Source
        var registered: [(fd: Int32, events: UInt32)]
        var deadline: UInt64
    }

    private struct Due: Comparable {
        var at: UInt64
        var id: UInt32
        static func < (a: Due, b: Due) -> Bool { a.at != b.at ? a.at < b.at : a.id < b.id }
    }

    package let name: String
    private let epoll: Int32
    private let wake: Int32
    private let lock = NSLock()
    private var handedIn: [@Sendable () -> Void] = []
    private var wakePending = false
    // The loop thread's own.
    private var entries: [UInt32: Entry] = [:]
    private var ids: [ObjectIdentifier: UInt32] = [:]
    private var nextID: UInt32 = 1
    private var heap = Heap<Due>()
    /// Sources now supervised (any thread; for tests and `bgtask doctor`).
    private let countLock = NSLock()
    private var sourceCount = 0

    package static let maximumDescriptors = 16
    private static let wakeToken: UInt64 = 1

    /// Starts the loop's thread. Fails (returns nil) only when the kernel refuses an epoll set
    /// or an eventfd (out of descriptors).
    package init?(name: String) {
        self.name = name
        epoll = bgtask_epoll_create()
        wake = bgtask_eventfd_create()
        guard epoll >= 0, wake >= 0, bgtask_epoll_add(epoll, wake, BGTASK_EPOLL_IN, Self.wakeToken) == 0 else {
            for fd in [epoll, wake] where fd >= 0 { close(fd) }
            return nil
        }
        let thread = Thread { [self] in run() }
        thread.name = name
        // The default 8 MiB stack is address space only; the loop needs little.
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Runs `job` on the loop's thread, at its next turn (any thread).
    package func execute(_ job: @escaping @Sendable () -> Void) {
        let signal = lock.withLock { () -> Bool in
            handedIn.append(job)
            defer { wakePending = true }
            return !wakePending
        }
        if signal { bgtask_eventfd_signal(wake) }
    }

    /// Supervises `source` from the loop's next turn: it fires once at once (`ready` 0), then
    /// as its descriptors and deadline say.
    package func add(_ source: any Source) {
        countLock.withLock { sourceCount += 1 }
        execute { [self] in adopt(source) }
    }

    /// On the loop's thread: supervises `source` now, firing it at once (`ready` 0): what a
    /// source made on the loop (an accepted connection) starts without waiting for a turn.
    package func addHere(_ source: any Source) {
        countLock.withLock { sourceCount += 1 }
        adopt(source)
    }

    private func adopt(_ source: any Source) {
        let id = nextID
        nextID = nextID == UInt32.max >> 8 ? 1 : nextID + 1
        entries[id] = Entry(source: source, registered: [], deadline: .max)
        ids[ObjectIdentifier(source)] = id
        fire(id, ready: 0, now: bgtask_monotonic_ns())
    }

    /// On the loop's thread: fires `source` now (`ready` 0), when the loop still has it.
    package func refire(_ source: any Source) {
        guard let id = ids[ObjectIdentifier(source)] else { return }
        fire(id, ready: 0, now: bgtask_monotonic_ns())
    }

    /// Sources supervised now.
    package var count: Int { countLock.withLock { sourceCount } }

    // MARK: The loop

    private func run() {
        // The kernel's name for the thread (`ps -L`, /proc/PID/task/TID/comm): Foundation's
        // `Thread.name` does not set it on Linux.
        bgtask_name_thread(name)
        let capacity = 256
        var tokens = [UInt64](repeating: 0, count: capacity)
        var events = [UInt32](repeating: 0, count: capacity)
        var ready: [UInt32: UInt32] = [:]
        var due: [UInt32] = []
        while true {
            runHandedIn()
            let next = earliestDeadline()
            let before = bgtask_monotonic_ns()
            let timeout: Int64 = next == .max ? -1 : Int64(clamping: next > before ? next - before : 0)
            let n = bgtask_epoll_wait(epoll, &tokens, &events, Int32(capacity), timeout)
            if n < 0 {
                if errno == EINTR { continue }
                // Not expected with a valid set; a loop that cannot wait must not spin.
                usleep(1000)
                continue
            }
            let now = bgtask_monotonic_ns()
            ready.removeAll(keepingCapacity: true)
            for i in 0..<Int(n) {
                let token = tokens[i]
                if token == Self.wakeToken {
                    // Cleared here, before the jobs are taken: a writer whose job an earlier
                    // turn already took may still add to the counter, and a counter left set
                    // would make every wait return at once.
                    bgtask_eventfd_clear(wake)
                    continue
                } else {
                    ready[UInt32(truncatingIfNeeded: token >> 8), default: 0] |= 1 << UInt32(token & 0xff)
                }
            }
            // Deadlines first, earliest first: a kill that is due does not wait behind the
            // channel traffic of a thousand other launches.
            due.removeAll(keepingCapacity: true)
            while let top = heap.min, top.at <= now {
                heap.removeMin()
                if entries[top.id]?.deadline == top.at { due.append(top.id) }
            }
            for id in due where entries[id] != nil { fire(id, ready: ready.removeValue(forKey: id) ?? 0, now: now) }
            for (id, bits) in ready where entries[id] != nil { fire(id, ready: bits, now: now) }
        }
    }

    private func runHandedIn() {
        let jobs = lock.withLock { () -> [@Sendable () -> Void] in
            guard wakePending else { return [] }
            wakePending = false
            defer { handedIn.removeAll(keepingCapacity: true) }
            return handedIn
        }
        for job in jobs { job() }
    }

    /// The earliest live deadline (stale heap entries dropped on the way).
    private func earliestDeadline() -> UInt64 {
        while let top = heap.min, entries[top.id]?.deadline != top.at { heap.removeMin() }
        return heap.min?.at ?? .max
    }

    private func fire(_ id: UInt32, ready: UInt32, now: UInt64) {
        guard var entry = entries[id] else { return }
        let going = entry.source.fire(ready: ready, now: now)
        let wanted = going ? entry.source.descriptors : []
        // Keep the set in step with what the source names now.
        for (slot, old) in entry.registered.enumerated() where old.fd >= 0 {
            let new: (fd: Int32, events: UInt32) = slot < wanted.count ? wanted[slot] : (-1, 0)
            if new.fd != old.fd || new.events == 0 { _ = bgtask_epoll_remove(epoll, old.fd) }
        }
        var registered: [(fd: Int32, events: UInt32)] = []
        for (slot, new) in wanted.prefix(Self.maximumDescriptors).enumerated() {
            let old: (fd: Int32, events: UInt32) = slot < entry.registered.count ? entry.registered[slot] : (-1, 0)
            let token = UInt64(id) << 8 | UInt64(slot)
            var kept = new
            if new.fd >= 0 && new.events != 0 {
                if new.fd == old.fd && old.events != 0 {
                    if new.events != old.events { _ = bgtask_epoll_modify(epoll, new.fd, new.events, token) }
                } else if bgtask_epoll_add(epoll, new.fd, new.events, token) != 0 {
                    kept = (-1, 0)
                }
            } else {
                kept = (-1, 0)
            }
            registered.append(kept)
        }
        guard going else {
            entries[id] = nil
            ids[ObjectIdentifier(entry.source)] = nil
            countLock.withLock { sourceCount -= 1 }
            entry.source.retire()
            return
        }
        entry.registered = registered
        let deadline = entry.source.deadline
        if deadline != entry.deadline {
            entry.deadline = deadline
            if deadline != .max { heap.insert(Due(at: deadline, id: id)) }
        } else if deadline != .max && deadline <= now {
            // Still due (it did not move its deadline): fired again at the next turn.
            heap.insert(Due(at: deadline, id: id))
        }
        entries[id] = entry
    }
}

/// The host's supervision loops: launches are spread over them (fewest sources first). One per
/// core, at most four: a loop's turn is short (a few system calls per launch), and more loops
/// than cores only contend with the launches' own processes.
package enum SupervisionLoops {
    package static let all: [SupervisionLoop] = {
        let cores = max(1, min(4, sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        return (0..<cores).compactMap { SupervisionLoop(name: "bgtask.loop.\($0)") }
    }()

    /// The loop with the fewest sources (nil: none could be made).
    package static func next() -> SupervisionLoop? { all.min { $0.count < $1.count } }
}

import DequeModule
import Foundation
import Glibc
import _BGTaskSystemShims

/// A fixed number of threads for the blocking steps around a launch (its containers made and
/// its disk use measured before it starts; its reap, clean-up and record after it ends), so
/// that the supervision loops never block and a burst of a thousand launches costs a queue,
/// not a thousand threads. Jobs run in the order they came.
package final class WorkerPool: @unchecked Sendable {
    package let name: String
    package let size: Int
    private let condition = NSCondition()
    private var jobs = Deque<@Sendable () -> Void>()
    private var started = 0
    private var idle = 0

    /// Threads are started as jobs need them, up to `size`.
    package init(name: String, size: Int) {
        self.name = name
        self.size = max(1, size)
    }

    package func run(_ job: @escaping @Sendable () -> Void) {
        // A new thread when more jobs wait than idle threads could take (a slow job, a walk of
        // a large container, does not hold up the next while the pool has room).
        let number = condition.withLock { () -> Int? in
            jobs.append(job)
            if idle > 0 { condition.signal() }
            guard jobs.count > idle, started < size else { return nil }
            started += 1
            return started
        }
        guard let number else { return }
        let threadName = "\(name).\(number)"
        let thread = Thread { [self] in
            // The kernel's name for the thread: Foundation's `Thread.name` does not set it on Linux.
            bgtask_name_thread(threadName)
            serve()
        }
        thread.name = threadName
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Threads started, and jobs waiting (for tests and the doctor).
    package var counts: (threads: Int, queued: Int) { condition.withLock { (started, jobs.count) } }

    private func serve() {
        while true {
            let job = condition.withLock { () -> @Sendable () -> Void in
                while jobs.isEmpty {
                    idle += 1
                    condition.wait()
                    idle -= 1
                }
                return jobs.removeFirst()
            }
            job()
        }
    }
}

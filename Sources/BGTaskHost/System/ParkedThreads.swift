import Foundation

/// Threads that run one long job each (a launch's supervision, a control connection) and then
/// wait, parked, for the next one instead of exiting: handing a job to a parked thread is a
/// semaphore's signal, where starting a thread is a clone, a stack's mapping and the new
/// thread's first scheduling, on the path from a submission to its handler twice (the
/// connection, then the launch). At most `maximumIdle` wait; the rest exit when their job ends,
/// so a burst of a thousand launches leaves a few threads behind, not a thousand.
final class ParkedThreads: @unchecked Sendable {
    private final class Worker: @unchecked Sendable {
        let wake = DispatchSemaphore(value: 0)
        /// Set before `wake` is signalled (or the thread started), taken by the thread.
        var job: (@Sendable () -> Void)?
    }

    let name: String
    let maximumIdle: Int
    private let lock = NSLock()
    private var idle: [Worker] = []
    private var started = 0

    /// `BGTASK_PARKED_THREADS_OFF=1` in the host's environment: none parks (every job gets a
    /// new thread), for bgtask-bench to compare.
    init(name: String, maximumIdle: Int) {
        self.name = name
        self.maximumIdle = getenv("BGTASK_PARKED_THREADS_OFF") == nil ? maximumIdle : 0
    }

    /// Runs `job` on a parked thread, or on a new one when none waits.
    func run(_ job: @escaping @Sendable () -> Void) {
        if let worker = lock.withLock({ idle.popLast() }) {
            worker.job = job
            worker.wake.signal()
            return
        }
        let worker = Worker()
        worker.job = job
        let thread = Thread { [self] in serve(worker) }
        thread.name = name
        lock.withLock { started += 1 }
        thread.start()
    }

    /// Threads started so far, and how many wait now (for tests).
    var counts: (started: Int, idle: Int) { lock.withLock { (started, idle.count) } }

    private func serve(_ worker: Worker) {
        while true {
            if let job = worker.job {
                worker.job = nil
                job()
            }
            let parked = lock.withLock { () -> Bool in
                guard idle.count < maximumIdle else { return false }
                idle.append(worker)
                return true
            }
            guard parked else { return }
            worker.wake.wait()
        }
    }
}

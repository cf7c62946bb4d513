import BGTaskModel
import BGTaskWire
import Glibc
import _BGTaskSystemShims

/// Starts a detached POSIX thread running `body`.
///
/// Not Foundation's `Thread`: its start names the new thread from `Thread.name` (a String
/// built and validated in every launch) and registers it with Foundation; a launch's parent
/// reader needs none of that, and its start is on the launch's path.
func startThread(_ body: @escaping () -> Void) {
    let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    var thread = pthread_t()
    let started = pthread_create(&thread, &attributes, { raw in
        let body = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
        body.run()
        return nil
    }, box)
    guard started == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(box).release()
        var text = "bgtask-runner: cannot start a thread: \(String(cString: strerror(started)))\n"
        text.withUTF8 { _ = write(STDERR_FILENO, $0.baseAddress, $0.count) }
        _exit(RunnerExitStatus.launchFailed)
    }
}

private final class ThreadBody {
    let run: () -> Void
    init(_ run: @escaping () -> Void) { self.run = run }
}

/// A serial queue on a POSIX thread of its own, started with the launch (`start`): where
/// expiration is delivered and a launch's end is timed, and whose alarm is the launch's
/// deadline (`Runner.armDeadline`): at the deadline this one thread wakes and expires the launch.
///
/// Not a `DispatchQueue`: Dispatch lets an idle worker thread go after a few seconds, so the
/// expiration of a launch that slept through its budget made a new thread at its deadline, on
/// its critical path. A thousand launches expiring together made a thousand threads, and each
/// new pid on the machine also made every other launch's supervision walk its process tree
/// again (`MachineGate`). This thread is made once, when the launch starts, and waits on a
/// condition variable (CLOCK_MONOTONIC) for its next job.
final class SerialThread: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    /// Guarded by `mutex`: jobs by when they are due (monotonic ns), then in the order given.
    private var jobs: [(dueNs: UInt64, order: UInt64, job: () -> Void)] = []
    private var given: UInt64 = 0
    private var started = false
    private var thread: Int32?
    private var busy = false
    /// When `onAlarm` runs next (monotonic ns; 0: never), before any job due later.
    private var alarmNs: UInt64 = 0
    /// Runs on the thread at the alarm (set before `start`).
    var onAlarm: () -> Void = {}

    init() {
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    /// Starts the thread (once; a job given before starts it then).
    func start() {
        pthread_mutex_lock(mutex)
        let first = !started
        started = true
        pthread_mutex_unlock(mutex)
        if first { startThread { [self] in run() } }
    }

    /// Runs `job` on the thread, after the jobs given before it.
    func async(_ job: @escaping () -> Void) { async(afterNs: 0, job) }

    /// Runs `job` on the thread once `afterNs` nanoseconds have passed.
    func async(afterNs: UInt64, _ job: @escaping () -> Void) {
        let due = afterNs == 0 ? 0 : bgtask_monotonic_ns() + afterNs
        pthread_mutex_lock(mutex)
        given += 1
        jobs.append((due, given, job))
        let start = !started
        started = true
        pthread_cond_signal(condition)
        pthread_mutex_unlock(mutex)
        if start { startThread { [self] in run() } }
    }

    /// Sets the alarm (0: none), replacing the one set before.
    func setAlarm(atNs: UInt64) {
        pthread_mutex_lock(mutex)
        alarmNs = atNs
        pthread_cond_signal(condition)
        pthread_mutex_unlock(mutex)
    }

    /// The thread's id while it runs no job (nil while it does, or before it started).
    var idleThreadID: Int32? {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return busy ? nil : thread
    }

    private func run() {
        pthread_mutex_lock(mutex)
        thread = bgtask_thread_id()
        while true {
            let now = bgtask_monotonic_ns()
            if alarmNs != 0 && alarmNs <= now {
                alarmNs = 0
                busy = true
                pthread_mutex_unlock(mutex)
                onAlarm()
                pthread_mutex_lock(mutex)
                busy = false
                continue
            }
            let next = jobs.indices.min { (jobs[$0].dueNs, jobs[$0].order) < (jobs[$1].dueNs, jobs[$1].order) }
            let due = min(next.map { jobs[$0].dueNs } ?? .max, alarmNs == 0 ? .max : alarmNs)
            if due == .max {
                pthread_cond_wait(condition, mutex)
                continue
            }
            if due > now {
                var until = timespec(tv_sec: Int(due / 1_000_000_000), tv_nsec: Int(due % 1_000_000_000))
                pthread_cond_timedwait(condition, mutex, &until)
                continue
            }
            guard let next else { continue }
            let job = jobs.remove(at: next).job
            busy = true
            pthread_mutex_unlock(mutex)
            job()
            pthread_mutex_lock(mutex)
            busy = false
        }
    }
}

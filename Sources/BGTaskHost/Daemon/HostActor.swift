import Dispatch

/// The host's serial queue as a global actor. The parts whose state lives on the queue (the
/// catalog, the launch coordinator, the scheduling loop, the push delivery, the host's own
/// shutdown state) are `@HostActor`: the compiler refuses any touch of that state from a thread
/// that is not on the queue, and code elsewhere (control workers, launch workers, timers,
/// watchers) gets there only through `HostCore.sync`/`async`, which run on the queue as the
/// actor. The queue stays a `DispatchQueue` (`HostCore.queue`): the parts are synchronous by
/// design, and the actor's executor is the queue itself, so `queue.sync` and the actor are one
/// serial order.
///
/// One host per process (`bgtask host`): the queue is the process's.
@globalActor
actor HostActor {
    static let shared = HostActor()

    /// The host's queue (`HostCore.queue`).
    nonisolated static let queue = DispatchQueue(label: "bgtask.host")
    private nonisolated static let executor = HostQueueExecutor()

    nonisolated var unownedExecutor: UnownedSerialExecutor { Self.executor.asUnownedSerialExecutor() }

    /// Runs `body` as the actor, synchronously: the caller must be on the host's queue. Off the
    /// queue the process stops (as `MainActor.assumeIsolated` does), so a hop that was forgotten
    /// is found at once, never a race.
    static func assumeIsolated<T, E: Error>(_ body: @HostActor () throws(E) -> T) throws(E) -> T {
        dispatchPrecondition(condition: .onQueue(queue))
        return try withoutActuallyEscaping(body) { (escapable) throws(E) -> T in
            try unsafeBitCast(escapable, to: (() throws(E) -> T).self)()
        }
    }
}

/// The actor's executor: its jobs run on the host's queue, in its serial order.
final class HostQueueExecutor: SerialExecutor, @unchecked Sendable {
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        HostActor.queue.async { job.runSynchronously(on: self.asUnownedSerialExecutor()) }
    }

    func checkIsolated() {
        dispatchPrecondition(condition: .onQueue(HostActor.queue))
    }
}

extension HostCore {
    /// Runs `body` on the host's queue as `HostActor` and waits for it. Never from the queue
    /// itself (a serial queue waiting on itself never returns).
    func sync<T, E: Error>(_ body: @HostActor () throws(E) -> T) throws(E) -> T {
        let outcome: Result<T, E> = queue.sync {
            HostActor.assumeIsolated { () -> Result<T, E> in
                do throws(E) { return .success(try body()) } catch { return .failure(error) }
            }
        }
        return try outcome.get()
    }

    /// Runs `body` on the host's queue as `HostActor`, later.
    func async(_ body: @escaping @Sendable @HostActor () -> Void) {
        queue.async { HostActor.assumeIsolated(body) }
    }

    /// Runs `body` on the host's queue as `HostActor` at `deadline`.
    func async(after deadline: DispatchTime, _ body: @escaping @Sendable @HostActor () -> Void) {
        queue.asyncAfter(deadline: deadline) { HostActor.assumeIsolated(body) }
    }
}

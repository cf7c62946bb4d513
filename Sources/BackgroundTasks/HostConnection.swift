import BGTaskABI
import CBGTaskPluginABI
import Foundation

/// The SDK's side of the ABI: the host function table and handle this plugin was launched with.
///
/// All scheduling state lives behind the table, in the runner; the SDK keeps only what maps C
/// callbacks back to Swift objects (registrations and the task objects of running tasks). Each
/// plugin links its own copy of the SDK, so this is per plugin, and one plugin runs per process.
package final class HostConnection: @unchecked Sendable {
    package static let current = HostConnection()

    private let lock = NSLock()
    /// The SDK's own copy of the runner's table (`ABIStruct.read`): as large as the SDK's
    /// struct whatever the runner's size, functions the runner does not provide NULL, and `size`
    /// the runner's, which `has` checks.
    private var api: UnsafeMutablePointer<bgtask_host_api>?
    private var host: OpaquePointer?
    private var role: bgtask_launch_role = BGTASK_ROLE_BACKGROUND.rawValue
    private var tasks: [UInt64: BGTask] = [:]

    /// Called by the entry trampoline on the runner's main thread, before any app code, with the
    /// table it has checked and read; and by BackgroundTasksTestKit, which plays the runner
    /// inside a test process (`package`: for that kit only, never for plugins).
    package func attach(api: bgtask_host_api, host: OpaquePointer?, role: bgtask_launch_role) {
        lock.withLock {
            // One launch per process: the table lives as long as the process.
            let table = self.api ?? UnsafeMutablePointer<bgtask_host_api>.allocate(capacity: 1)
            table.initialize(to: api)
            self.api = table
            self.host = host
            self.role = role
        }
        DeviceNotifications.follow(api: api, host: host)
    }

    /// The table and handle, or nil when this code is not running inside a bgtask launch.
    package var connection: (api: bgtask_host_api, host: OpaquePointer?)? {
        lock.withLock { api.map { ($0.pointee, host) } }
    }

    var isExtension: Bool { lock.withLock { role == BGTASK_ROLE_EXTENSION.rawValue } }

    func track(_ task: BGTask) { lock.withLock { tasks[task.taskID] = task } }
    func untrack(_ taskID: UInt64) { _ = lock.withLock { tasks.removeValue(forKey: taskID) } }
    func task(_ taskID: UInt64) -> BGTask? { lock.withLock { tasks[taskID] } }

    // MARK: Resumes, for the SDK's other modules

    private var resumeObservers: [@Sendable () -> Void] = []

    /// Calls `body` (on the main thread) each time the suspended process is resumed for a new
    /// launch, after the launch's table is attached: how MetricKit asks the host again for
    /// what the new launch brings.
    package func whenResumed(_ body: @escaping @Sendable () -> Void) {
        lock.withLock { resumeObservers.append(body) }
    }

    package func resumed() {
        for observer in lock.withLock({ resumeObservers }) { observer() }
    }

    // MARK: A launch's event, for the SDK's other modules

    private var launchEvent: (reason: String, json: String?)?
    private var launchEventObservers: [@Sendable (String, String?) -> Bool] = []

    /// The app module (UIKit's entry) says what the launch brought, once the app has finished
    /// launching (or resumed): each observer is called with it (on the main thread); one that
    /// returns true has taken it, and it is not kept. Kept otherwise for an observer added later.
    package func launched(reason: String, eventJSON: String?) {
        let observers = lock.withLock { () -> [@Sendable (String, String?) -> Bool] in
            launchEvent = (reason, eventJSON)
            return launchEventObservers
        }
        for observer in observers where observer(reason, eventJSON) {
            lock.withLock { launchEvent = nil }
            return
        }
    }

    /// Calls `body` with each launch's event from now on, and at once with the current one when
    /// it has not been taken (an app that sets its delegate after launching still hears it).
    package func whenLaunched(_ body: @escaping @Sendable (String, String?) -> Bool) {
        let pending = lock.withLock { () -> (reason: String, json: String?)? in
            launchEventObservers.append(body)
            return launchEvent
        }
        if let pending, body(pending.reason, pending.json) { lock.withLock { launchEvent = nil } }
    }

    // MARK: BackgroundTasksTestKit's seam (never used in a launch)

    private var repeatedCompletionObserver: (@Sendable (UInt64, Bool) -> Void)?

    /// Forgets the attached table and the tasks tracked for it, so that code running after a
    /// test behaves as code outside a launch does. BackgroundTasksTestKit calls it when a test
    /// scheduler is uninstalled; nothing calls it in a launch, whose table lives as long as the
    /// process.
    package func detach() {
        lock.withLock {
            // Every reader copies the table under this lock (`connection`), so it can go.
            api?.deallocate()
            api = nil
            host = nil
            role = BGTASK_ROLE_BACKGROUND.rawValue
            tasks.removeAll()
            repeatedCompletionObserver = nil
        }
    }

    /// Sets the observer told of every `setTaskCompleted` after a task's first (which the SDK
    /// otherwise ignores, as the ABI's idempotent `set_task_completed` would): how a test kit
    /// finds a handler that completes twice. Nil (the default, and always in a launch): none.
    package func observeRepeatedCompletions(_ observer: (@Sendable (UInt64, Bool) -> Void)?) {
        lock.withLock { repeatedCompletionObserver = observer }
    }

    func noteRepeatedCompletion(_ taskID: UInt64, success: Bool) {
        lock.withLock { repeatedCompletionObserver }?(taskID, success)
    }

    // MARK: Work handed over before a launch may end

    private var handOvers: [@Sendable (@escaping @Sendable () -> Void) -> Void] = []

    /// Adds work to finish before the app tells the runner something that may end the launch (a
    /// task completed, background time ended); the work calls its argument when done, on any
    /// thread. How UIKit makes sure the background-session tasks the app just resumed have
    /// reached the host before its process goes.
    package func beforeEnding(_ work: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void) {
        lock.withLock { handOvers.append(work) }
    }

    /// Runs `then` once every hand-over has finished: at once, on this thread, when there are
    /// none (every app that makes no background session).
    package func handOver(then: @escaping @Sendable () -> Void) {
        let works = lock.withLock { handOvers }
        guard !works.isEmpty else { return then() }
        let group = DispatchGroup()
        for work in works {
            group.enter()
            work { group.leave() }
        }
        group.notify(queue: .global(), execute: then)
    }
}

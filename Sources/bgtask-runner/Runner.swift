import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc
import _BGTaskSystemShims

/// The child side of one launch: serves the plugin ABI to the bundle it loads and reports every
/// step to the parent over the launch channel (fd 3).
///
/// Threads: the main thread is the app's main thread, as on iOS: it loads the plugin, calls its
/// launch function (`application(_:didFinishLaunchingWithOptions:)`), then runs the main run
/// loop, which drains the main dispatch queue (`AppProcess.runMainThread`); launch handlers are
/// queued on the main queue, one at a time in order. Expiration is delivered on
/// `expirationQueue`; the launch is ended by `finish`, on the thread that ended its last task (a
/// handler may still be blocked on another); the parent reader receives on its own thread. All
/// state is behind `lock`.
final class Runner: @unchecked Sendable {
    enum Handler {
        case abi(bgtask_launch_handler, UnsafeMutableRawPointer?)
        case mapped(MappedHandlerCall)
    }

    struct OpenTask {
        var assignment: TaskAssignment
        var info: UnsafeMutablePointer<bgtask_task_info>
        var expiration: (bgtask_expiration_handler, UnsafeMutableRawPointer?)?
        var completed = false
        var expirationDelivered = false
    }

    /// A background-time assertion (`UIApplication.beginBackgroundTask`): held, the launch goes
    /// on after its last task.
    struct Assertion {
        var name: String?
        var expiration: (bgtask_expiration_handler, UnsafeMutableRawPointer?)?
        var expirationDelivered = false
    }

    let assignment: LaunchAssignment
    let channel: LaunchChannel
    /// Where launch handlers run: the main queue in a launch; nowhere in the zygote's rehearsal,
    /// which must start no thread and leave the main queue untouched for its children.
    var scheduleHandler: (@escaping () -> Void) -> Void = { _ in }
    /// Made in the zygote's rehearsal too, which must stay single-threaded: making a queue starts
    /// no thread, only its first `async` does.
    let expirationQueue = DispatchQueue(label: "bgtask.runner.expiration")
    /// Ends the launch once every task has ended; called once, on the thread that ended the
    /// last one (no hand-off to another thread: the launch's end is on its critical path).
    var finish: () -> Never = { _exit(0) }

    private let lock = NSLock()
    private var handlers: [String: Handler] = [:]
    private var launchFinished = false
    private var tasks: [UInt64: OpenTask] = [:]
    private var tasksStarted = false
    private var signalledEnd = false
    /// Foreground launches end only when the parent says no more tasks will come.
    private var closed = false
    /// Tasks the parent added before the launch entry returned.
    private var deferredTasks: [TaskAssignment] = []
    /// The whole launch was expired: tasks that start from now on are expired at once.
    private var expiredAll = false
    /// Tasks the parent expired before they began (the host may expire a task as soon as the
    /// launch exists): each is expired as soon as it begins.
    private var expiredBeforeBegin = Set<UInt64>()
    private var assertions: [UInt64: Assertion] = [:]
    private var nextAssertion: UInt64 = 1
    /// When the launch's time runs out (CLOCK_MONOTONIC ns; 0: unknown); moved earlier when a
    /// foreground launch leaves the foreground (`deadline`).
    private var expiresAtNs: UInt64
    /// The parent reader expired the launch at `expiresAtNs` itself (see `untilDeadline`).
    private var expiredAtDeadline = false
    private var nextSeq: UInt64 = 1
    private var waiters: [UInt64: ReplyWaiter] = [:]

    init(assignment: LaunchAssignment, channel: LaunchChannel) {
        self.assignment = assignment
        self.channel = channel
        closed = assignment.role != .foreground
        expiresAtNs = assignment.expiresAtNs
    }

    // MARK: Reporting

    func report(_ message: ChildMessage) {
        do {
            try channel.send(message)
        } catch where error.code == .oversized {
            FileHandle.standardError.write(Data("bgtask-runner: dropped a message: \(error)\n".utf8))
        } catch {
            channelLost("send: \(error)")
        }
    }

    /// The channel is unusable: plugin code closed fd 3 (EBADF) or the parent hung up (EPIPE).
    /// Either way nobody can hear this launch any more, so it ends here; the supervisor reads
    /// the exit status.
    func channelLost(_ why: String) -> Never {
        fflush(stdout)
        FileHandle.standardError.write(Data("bgtask-runner: launch channel lost (\(why)); ending the launch\n".utf8))
        _exit(RunnerExitStatus.channelLost)
    }

    /// Ends the launch as iOS ends an app that breaks the scheduler's rules: the record carries
    /// `reason`, then the process aborts.
    func fatal(_ reason: String) -> Never {
        report(.fatal(error: reason))
        fflush(stdout)
        FileHandle.standardError.write(Data("bgtask: fatal: \(reason)\n".utf8))
        signal(SIGABRT, SIG_DFL)
        abort()
    }

    // MARK: Registration

    func isPermitted(_ identifier: String) -> Bool {
        assignment.permittedIdentifiers.contains { PermittedIdentifiers.pattern($0, matches: identifier) }
    }

    /// Continued-processing identifiers are the ones matched by a wildcard entry; only they may
    /// be registered after launch.
    func isContinuedProcessing(_ identifier: String) -> Bool {
        assignment.permittedIdentifiers.contains {
            PermittedIdentifiers.isWildcard($0) && PermittedIdentifiers.pattern($0, matches: identifier)
        }
    }

    func register(_ identifier: String, _ handler: Handler) -> Bool {
        if assignment.role == .extension {
            report(.registerRefused(identifier: identifier, reason: "extensions cannot register launch handlers; only the containing app can"))
            return false
        }
        guard isPermitted(identifier) else {
            report(.registerRefused(identifier: identifier, reason: "'\(identifier)' is not in BGTaskSchedulerPermittedIdentifiers of \(assignment.bundleIdentifier)"))
            return false
        }
        enum Verdict { case ok, twice, late }
        let verdict: Verdict = lock.withLock {
            if handlers[identifier] != nil { return .twice }
            if launchFinished && !isContinuedProcessing(identifier) { return .late }
            handlers[identifier] = handler
            return .ok
        }
        switch verdict {
        case .twice:
            fatal("launch handler for '\(identifier)' registered twice (BGTaskScheduler allows one registration per identifier)")
        case .late:
            fatal("launch handler for '\(identifier)' registered after the app finished launching (register in the launch entry)")
        case .ok:
            report(.registered(identifier: identifier, at: bgtask_monotonic_ns()))
            return true
        }
    }

    // MARK: Tasks

    /// Marks the launch finished and starts every assigned task with a registered handler.
    func startTasks() {
        let toStart: [TaskAssignment] = lock.withLock {
            launchFinished = true
            defer { deferredTasks.removeAll() }
            return assignment.tasks + deferredTasks
        }
        report(.launched(at: bgtask_monotonic_ns()))
        for task in toStart { begin(task) }
        // Only now may the launch end: a task that completes at once must not end it before
        // the others have started.
        lock.withLock { tasksStarted = true }
        signalEndIfDone()
    }

    /// A task the parent adds to a running foreground launch.
    func add(_ task: TaskAssignment) {
        let now: Bool = lock.withLock {
            guard launchFinished else {
                deferredTasks.append(task)
                return false
            }
            return true
        }
        if now { begin(task) }
    }

    /// A foreground launch leaves the foreground: the app hears it (`set_state_handler`) before
    /// the launch may end, so it can take background time as an app entering the background does.
    func close() {
        let handler: (bgtask_state_handler, UnsafeMutableRawPointer?)? = lock.withLock {
            let wasOpen = !closed
            closed = true
            return wasOpen && assignment.role == .foreground ? stateHandler : nil
        }
        if let (handler, context) = handler { handler(context, UInt32(BGTASK_APP_STATE_BACKGROUND)) }
        signalEndIfDone()
    }

    /// The plugin's receiver of state changes (`set_state_handler`).
    private var stateHandler: (bgtask_state_handler, UnsafeMutableRawPointer?)?

    func setStateHandler(_ handler: bgtask_state_handler?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { stateHandler = handler.map { ($0, context) } }
    }

    /// Starts one task on the main queue, or reports it not registered.
    private func begin(_ task: TaskAssignment) {
        let handler: Handler? = lock.withLock {
            guard let handler = handlers[task.identifier] else { return nil }
            let info = UnsafeMutablePointer<bgtask_task_info>.allocate(capacity: 1)
            info.initialize(to: bgtask_task_info(
                size: UInt32(MemoryLayout<bgtask_task_info>.size),
                task: task.task,
                identifier: UnsafePointer(strdup(task.identifier)),
                type: bgtask_task_type(UInt32(task.kind.abiValue))))
            tasks[task.task] = OpenTask(assignment: task, info: info)
            return handler
        }
        guard let handler, let pointer = lock.withLock({ tasks[task.task]?.info }) else {
            report(.taskNotRegistered(task: task.task))
            return
        }
        let lateForExpiry = lock.withLock { expiredAll || expiredBeforeBegin.remove(task.task) != nil }
        // Owned by the runner until the process ends; only read from here on.
        nonisolated(unsafe) let info = pointer
        scheduleHandler { [self] in
            report(.taskBegan(task: info.pointee.task, at: bgtask_monotonic_ns()))
            switch handler {
            case let .abi(function, context): function(context, info)
            case let .mapped(call): call.invoke(task: info, runner: self)
            }
            // The launch's time ran out before this task could start: it expires at once.
            if lateForExpiry { expirationQueue.async { self.expire(only: info.pointee.task) } }
        }
    }

    func setExpirationHandler(_ task: UInt64, _ handler: bgtask_expiration_handler?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock {
            guard tasks[task] != nil else { return }
            tasks[task]?.expiration = handler.map { ($0, context) }
        }
    }

    func complete(_ task: UInt64, success: Bool) {
        // Reported under the lock, so that the last completion's `finished` can never overtake
        // (and, with the process exiting, lose) another task's completion.
        let first: Bool = lock.withLock {
            guard let open = tasks[task], !open.completed else { return false }
            tasks[task]?.completed = true
            report(.taskCompleted(task: task, success: success, at: bgtask_monotonic_ns()))
            return true
        }
        guard first else { return }
        signalEndIfDone()
    }

    private func signalEndIfDone() {
        let done: Bool = lock.withLock {
            guard tasksStarted, closed, !signalledEnd, tasks.values.allSatisfy(\.completed), assertions.isEmpty else { return false }
            signalledEnd = true
            return true
        }
        if done { finish() }
    }

    /// Delivers expiration to `only` or to every open task, on the expiration queue. A task with
    /// no expiration handler is completed unsuccessfully, as on iOS.
    func expire(only: UInt64?) {
        lock.withLock {
            if let only {
                if tasks[only] == nil { expiredBeforeBegin.insert(only) }
            } else {
                expiredAll = true
            }
        }
        let targets: [(UInt64, (bgtask_expiration_handler, UnsafeMutableRawPointer?)?)] = lock.withLock {
            var targets: [(UInt64, (bgtask_expiration_handler, UnsafeMutableRawPointer?)?)] = []
            for (id, task) in tasks.sorted(by: { $0.key < $1.key })
            where !task.completed && !task.expirationDelivered && (only == nil || only == id) {
                tasks[id]?.expirationDelivered = true
                targets.append((id, task.expiration))
            }
            return targets
        }
        if only == nil { expireBackgroundTime() }
        for (id, expiration) in targets {
            let at = bgtask_monotonic_ns()
            // Reported before the call: an expiration handler that completes the last task
            // ends the launch, and the record must still say the task expired.
            if let (handler, context) = expiration {
                report(.expirationDelivered(task: id, at: at, toApp: true))
                if handler(context, id) { continue }
            }
            report(.expirationDelivered(task: id, at: at, toApp: false))
            complete(id, success: false)
        }
    }

    // MARK: Background time

    /// Takes a background-time assertion: its id, or 0 (`.invalid`) once the launch's time has
    /// run out, as iOS answers after the app's background time has expired.
    func beginBackgroundTime(name: String?, expiration: (bgtask_expiration_handler, UnsafeMutableRawPointer?)?) -> UInt64 {
        lock.withLock {
            guard !expiredAll else { return 0 }
            let id = nextAssertion
            nextAssertion += 1
            assertions[id] = Assertion(name: name, expiration: expiration)
            report(.backgroundTimeBegan(id: id, name: name, at: bgtask_monotonic_ns()))
            return id
        }
    }

    /// Ends an assertion (an unknown or ended one is ignored); the launch ends if it was the last
    /// thing keeping it.
    func endBackgroundTime(_ id: UInt64) {
        // Reported under the lock, as completions are: the launch's `finished` never overtakes it.
        let ended: Bool = lock.withLock {
            guard assertions.removeValue(forKey: id) != nil else { return false }
            report(.backgroundTimeEnded(id: id, at: bgtask_monotonic_ns()))
            return true
        }
        if ended { signalEndIfDone() }
    }

    /// Seconds until the launch's time runs out; very large while in the foreground.
    var backgroundTimeRemaining: Double {
        lock.withLock {
            if assignment.role == .foreground && !closed { return .greatestFiniteMagnitude }
            guard expiresAtNs > 0 else { return .greatestFiniteMagnitude }
            let now = bgtask_monotonic_ns()
            return now >= expiresAtNs ? 0 : Double(expiresAtNs - now) / 1e9
        }
    }

    /// BGTASK_APP_STATE_*: active while a foreground launch is in the foreground.
    var applicationState: UInt32 {
        lock.withLock { assignment.role == .foreground && !closed ? UInt32(BGTASK_APP_STATE_ACTIVE) : UInt32(BGTASK_APP_STATE_BACKGROUND) }
    }

    /// The launch's time now runs out at `at` (the host moved it: the app left the foreground).
    func setDeadline(_ at: UInt64) {
        lock.withLock { expiresAtNs = at }
    }

    /// Nanoseconds until the parent reader is to expire the launch itself (0: now), or nil
    /// (no deadline, or done). The runner knows its deadline (`LaunchAssignment.expiresAtNs`,
    /// moved by `ParentMessage.deadline`), so the budget's expiration does not wait for the
    /// host's message: the reader, which waits for the host's messages anyway, waits until the
    /// deadline at most and then expires the launch (`expireAtDeadline`). The host still sends
    /// its own at the same moment (each task's expiration is delivered once, whichever comes
    /// first) and still kills at the grace's end: an app that stops this thread gains nothing.
    /// A host that is busy or stopped no longer delays the app's expiration.
    func untilDeadline() -> UInt64? {
        lock.withLock {
            guard expiresAtNs > 0, !expiredAtDeadline else { return nil }
            let now = bgtask_monotonic_ns()
            return now >= expiresAtNs ? 0 : expiresAtNs - now
        }
    }

    /// The deadline has passed: expiration to every open task, as the host's would.
    func expireAtDeadline() {
        lock.withLock { expiredAtDeadline = true }
        expirationQueue.async { self.expire(only: nil) }
    }

    /// The launch's time has run out: every assertion's expiration handler, once, on this (the
    /// expiration) thread. An assertion the handler does not end keeps the launch until the
    /// watchdog kills it, as on iOS.
    private func expireBackgroundTime() {
        let targets: [(UInt64, (bgtask_expiration_handler, UnsafeMutableRawPointer?)?)] = lock.withLock {
            var targets: [(UInt64, (bgtask_expiration_handler, UnsafeMutableRawPointer?)?)] = []
            for (id, assertion) in assertions.sorted(by: { $0.key < $1.key }) where !assertion.expirationDelivered {
                assertions[id]?.expirationDelivered = true
                targets.append((id, assertion.expiration))
            }
            return targets
        }
        for (id, expiration) in targets {
            report(.backgroundTimeExpired(id: id, at: bgtask_monotonic_ns(), toApp: expiration != nil))
            if let (handler, context) = expiration { _ = handler(context, id) }
        }
    }

    // MARK: Remote notifications

    private var remoteNotificationDone = false

    /// The push's completion handler was called: reported once (later calls are ignored, as
    /// a second call of a completion handler does nothing the system sees).
    func remoteNotificationCompleted(_ result: UInt32) {
        let first: Bool = lock.withLock {
            defer { remoteNotificationDone = true }
            return !remoteNotificationDone
        }
        if first { report(.remoteNotificationCompleted(result: result, at: bgtask_monotonic_ns())) }
    }

    // MARK: Requests to the parent

    /// Sends a request and waits for the parent's reply.
    func ask(_ make: (UInt64) -> ChildMessage) -> (status: Int32, message: String?, requests: [TaskRequest]) {
        let waiter = exchange(make)
        return (waiter.status, waiter.message, waiter.requests)
    }

    /// Sends a notification request and waits for the parent's `notificationReply`.
    func askNotifications(_ make: (UInt64) -> ChildMessage) -> (status: Int32, message: String?, authorization: UInt32, notifications: [NotificationEntry]) {
        let waiter = exchange(make)
        return (waiter.status, waiter.message, waiter.authorization, waiter.notifications)
    }

    /// Sends a background-session call and waits for the parent's `transferReply`.
    func askTransfers(_ make: (UInt64) -> ChildMessage) -> (status: Int32, message: String?, json: String?) {
        let waiter = exchange(make)
        return (waiter.status, waiter.message, waiter.json)
    }

    func resolveTransfers(seq: UInt64, status: Int32, message: String?, json: String?) {
        guard let waiter = lock.withLock({ waiters.removeValue(forKey: seq) }) else { return }
        waiter.status = status
        waiter.message = message
        waiter.json = json
        waiter.semaphore.signal()
    }

    /// The plugin's receiver of transfer events (`transfer_events`), called on the reader thread.
    private var transferEventHandler: (handler: bgtask_json_visitor, context: UnsafeMutableRawPointer?)?

    func setTransferEvents(_ handler: bgtask_json_visitor?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { transferEventHandler = handler.map { ($0, context) } }
    }

    /// A `TransferEvent` from the parent: to the plugin's receiver, if it set one.
    func transferEvent(_ json: String) {
        guard let receiver = lock.withLock({ transferEventHandler }) else { return }
        json.withCString { receiver.handler(receiver.context, $0) }
    }

    /// Sends the message `make` builds with a new sequence number and waits (at most 30 s) for
    /// the reply with that number.
    private func exchange(_ make: (UInt64) -> ChildMessage) -> ReplyWaiter {
        let waiter = ReplyWaiter()
        let seq: UInt64 = lock.withLock {
            defer { nextSeq += 1 }
            waiters[nextSeq] = waiter
            return nextSeq
        }
        do {
            try channel.send(make(seq))
        } catch where error.code == .oversized {
            // Nothing was sent, so no answer will come: say so now rather than in 30 s.
            _ = lock.withLock { waiters.removeValue(forKey: seq) }
            waiter.status = Int32(BGTASK_E_INVALID_ARGUMENT.rawValue)
            waiter.message = "the request is too large for the launch channel: \(error)"
            return waiter
        } catch {
            channelLost("send: \(error)")
        }
        guard waiter.semaphore.wait(timeout: .now() + 30) == .success else {
            _ = lock.withLock { waiters.removeValue(forKey: seq) }
            let late = ReplyWaiter()
            late.status = Int32(BGTASK_E_HOST.rawValue)
            late.message = "the host did not answer within 30 s"
            return late
        }
        return waiter
    }

    func resolve(seq: UInt64, status: Int32, message: String?, requests: [TaskRequest]?) {
        guard let waiter = lock.withLock({ waiters.removeValue(forKey: seq) }) else { return }
        waiter.status = status
        waiter.message = message
        waiter.requests = requests ?? []
        waiter.semaphore.signal()
    }

    func resolveNotifications(seq: UInt64, status: Int32, message: String?, authorization: UInt32, notifications: [NotificationEntry]) {
        guard let waiter = lock.withLock({ waiters.removeValue(forKey: seq) }) else { return }
        waiter.status = status
        waiter.message = message
        waiter.authorization = authorization
        waiter.notifications = notifications
        waiter.semaphore.signal()
    }

    /// The parent hung up: nobody supervises this launch any more, so end it and every
    /// process it started.
    func parentLost() -> Never {
        killDescendants()
        kill(0, SIGKILL)
        _exit(RunnerExitStatus.channelLost)
    }
}

final class ReplyWaiter: @unchecked Sendable {
    let semaphore = DispatchSemaphore(value: 0)
    var status: Int32 = 0
    var message: String?
    var requests: [TaskRequest] = []
    var authorization: UInt32 = 0
    var notifications: [NotificationEntry] = []
    var json: String?
}

import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc
import Synchronization
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
///
/// A launch whose work is over (every task, background-time assertion and push handler ended)
/// does not end at once: the main queue finishes its turn (what app code queued after its last
/// `setTaskCompleted` or `endBackgroundTask`, in the same turn or right after), and the app must
/// then be quiet for `quietNs` (no message to the host, no answer awaited) before `end` runs:
/// the process exits (a fresh launch) or says `idle` and waits for its next launch (`resume`),
/// which the host sends after it has suspended and continued the process.
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

    /// The launch being run: the first one, then each resumed one (`resume`). What the app is
    /// (its bundle, container, permitted identifiers, groups) is the same in every one.
    var current: LaunchAssignment
    var assignment: LaunchAssignment { lock.withLock { current } }
    /// What does not change from one launch to the next (read without the lock, inside it too).
    let permittedIdentifiers: [String]
    let channel: LaunchChannel
    /// Where launch handlers run: the main queue in a launch; nowhere in the zygote's rehearsal,
    /// which must start no thread and leave the main queue untouched for its children.
    var scheduleHandler: (@escaping () -> Void) -> Void = { _ in }
    /// Made in the zygote's rehearsal too, which must stay single-threaded: making it starts no
    /// thread; the launch starts it (`main.swift`), with its parent reader.
    let expirationQueue = SerialThread()
    /// Times the launch's end (the quiet looks, the settle limit): never app code, so an
    /// expiration handler that blocks the expiration thread does not stop the launch's end.
    let endTimer = SerialThread()
    /// Ends the launch once its work is over and the app has gone quiet (`settle`): exits, or
    /// says `idle` (a suspendable launch). Called once per launch, on the main queue (or on the
    /// end timer's thread when the main thread is blocked in app code past `settleLimitNs`).
    var end: () -> Void = { _exit(0) }

    /// How long the app must be quiet after its work is over before its launch ends: work it
    /// started from another thread just before (a `Task` after `setTaskCompleted` that adds a
    /// notification, as public apps' refresh handlers do) is already running by then and has said something
    /// to the host, or heard its answer, which starts the wait again. Runnable work reaches the
    /// host in microseconds on an idle machine; 5 ms leaves room for a loaded one (a thread
    /// waiting for a core) at a small cost per launch: the process, not the app's next
    /// launch, waits (a launch for the app meanwhile waits for it to settle).
    static let quietNs: UInt64 = 5_000_000
    /// CPU the process may use in a quiet window and still count as quiet (the check's own
    /// wake-up costs microseconds): work between two calls to the host (app code on the
    /// cooperative pool between one answer and the next call) shows here even when it says
    /// nothing to the host for a whole window.
    static let quietCPUNs: UInt64 = 300_000
    /// The most a launch waits for its main queue's turn and for quiet: a main thread blocked in
    /// app code (a handler still waiting while another thread completed its task) cannot finish
    /// its turn, and the launch ends without it, as it always did.
    static let settleLimitNs: UInt64 = 1_000_000_000
    /// Messages sent to the host and answers heard, counted: the app's activity while the
    /// launch settles.
    let activity = Atomic<UInt64>(0)

    let lock = NSLock()
    var handlers: [String: Handler] = [:]
    var launchFinished = false
    var tasks: [UInt64: OpenTask] = [:]
    var tasksStarted = false
    var signalledEnd = false
    /// The launch's end ran (`end`); a resumed launch starts with it false again.
    var ended = false
    /// Which settle an expiration-queue backstop belongs to (a later launch's is not its business).
    var settleGeneration: UInt64 = 0
    /// The process said `idle` and waits for `resume`.
    var idle = false
    /// The push's completion handler was called (`remoteNotificationCompleted`).
    var remoteNotificationDone = false
    /// Called on the main thread with a resumed launch's info, before its tasks start.
    var resumeHandler: (bgtask_resume_handler, UnsafeMutableRawPointer?)?
    /// The plugin's receiver of device changes (`set_device_handler`), and whether the device
    /// changed while the process was suspended (told as it resumes).
    var deviceHandler: (bgtask_device_handler, UnsafeMutableRawPointer?)?
    var deviceChangedWhileSuspended = false
    /// The plugin's receiver of notifications delivered in the foreground (`set_notification_handler`).
    var notificationHandler: (bgtask_json_visitor, UnsafeMutableRawPointer?)?
    /// Foreground launches end only when the parent says no more tasks will come.
    var closed = false
    /// Tasks the parent added before the launch entry returned.
    var deferredTasks: [TaskAssignment] = []
    /// The whole launch was expired: tasks that start from now on are expired at once.
    var expiredAll = false
    /// Tasks the parent expired before they began (the host may expire a task as soon as the
    /// launch exists): each is expired as soon as it begins.
    var expiredBeforeBegin = Set<UInt64>()
    var assertions: [UInt64: Assertion] = [:]
    var nextAssertion: UInt64 = 1
    /// When the launch's time runs out (CLOCK_MONOTONIC ns; 0: unknown); moved earlier when a
    /// foreground launch leaves the foreground (`deadline`).
    var expiresAtNs: UInt64
    /// The expiration thread expired the launch at `expiresAtNs` itself (see `armDeadline`).
    var expiredAtDeadline = false
    var nextSeq: UInt64 = 1
    var waiters: [UInt64: ReplyWaiter] = [:]

    init(assignment: LaunchAssignment, channel: LaunchChannel) {
        current = assignment
        permittedIdentifiers = assignment.permittedIdentifiers
        self.channel = channel
        closed = assignment.role != .foreground
        expiresAtNs = assignment.expiresAtNs
    }

    // MARK: Reporting

    func report(_ message: ChildMessage) {
        activity.add(1, ordering: .relaxed)
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
        permittedIdentifiers.contains { PermittedIdentifiers.pattern($0, matches: identifier) }
    }

    /// Continued-processing identifiers are the ones matched by a wildcard entry; only they may
    /// be registered after launch.
    func isContinuedProcessing(_ identifier: String) -> Bool {
        permittedIdentifiers.contains {
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
            return current.tasks + deferredTasks
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
            return wasOpen && current.role == .foreground ? stateHandler : nil
        }
        if let (handler, context) = handler { handler(context, UInt32(BGTASK_APP_STATE_BACKGROUND)) }
        signalEndIfDone()
    }

    /// The plugin's receiver of state changes (`set_state_handler`).
    var stateHandler: (bgtask_state_handler, UnsafeMutableRawPointer?)?

    func setStateHandler(_ handler: bgtask_state_handler?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { stateHandler = handler.map { ($0, context) } }
    }

    /// The process ends after this launch (it is not kept): the app hears it on the main thread
    /// (`applicationWillTerminate`), when the launch ended there. Not from another thread: a
    /// main thread blocked in app code would run the delegate's code beside it.
    func willTerminate() {
        guard Thread.isMainThread, let (handler, context) = lock.withLock({ stateHandler }) else { return }
        handler(context, UInt32(BGTASK_APP_STATE_TERMINATING))
    }

    /// Starts one task on the main queue, or reports it not registered.
    func begin(_ task: TaskAssignment) {
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

    func signalEndIfDone() {
        let generation: UInt64? = lock.withLock {
            guard tasksStarted, closed, !signalledEnd, !ended, tasks.values.allSatisfy(\.completed), assertions.isEmpty else { return nil }
            signalledEnd = true
            settleGeneration += 1
            return settleGeneration
        }
        if let generation { settle(generation) }
    }

    /// The launch's work is over: its end waits for the main queue's turn (everything queued on
    /// it before now runs first), then for quiet (`quietNs` without a message to the host or an
    /// answer awaited), at most `settleLimitNs`.
    func settle(_ generation: UInt64) {
        let limitNs = bgtask_monotonic_ns() + Self.settleLimitNs
        endTimer.async(afterNs: Self.settleLimitNs) { [self] in endOnce(generation) }
        let seen = activity.load(ordering: .relaxed)
        scheduleHandler { [self] in waitForQuiet(generation, seen: seen, cpu: Self.processCPUNs(), limitNs: limitNs) }
    }

    /// Whether a thread of this process other than the main one (which asks) is running or
    /// waiting for a core (`R` in /proc/self/task/TID/stat): work the app started a moment ago
    /// (a `Task` on the cooperative pool) that a loaded machine has not run yet has neither
    /// talked to the host nor used CPU, but its thread is runnable. Read at the launch's end
    /// only, while every thread lives (a walk of a process's tasks while they die is what
    /// makes a reap slow).
    /// `besides`: threads of the runner's own that are idle (the expiration thread and the end
    /// timer between jobs, which may still be on their way back to their wait).
    static func anotherThreadRunnable(besides idle: [Int32?] = []) -> Bool {
        guard let directory = opendir("/proc/self/task") else { return false }
        defer { closedir(directory) }
        let main = getpid()
        var buffer = [UInt8](repeating: 0, count: 512)
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let tid = Int32(name), tid != main, !idle.contains(tid) else { continue }
            let fd = open("/proc/self/task/\(tid)/stat", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { continue }
            let count = read(fd, &buffer, buffer.count)
            Glibc.close(fd)
            guard count > 0, let paren = buffer[..<count].lastIndex(of: UInt8(ascii: ")")), paren + 2 < count else { continue }
            if buffer[paren + 2] == UInt8(ascii: "R") { return true }
        }
        return false
    }

    /// This process's CPU time so far (all threads, user and system).
    static func processCPUNs() -> UInt64 {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return UInt64(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1_000_000_000 + UInt64(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000
    }

    /// On the main queue, after everything queued before: ends the launch once `quietNs` passed
    /// with no activity and no answer awaited; otherwise looks again.
    func waitForQuiet(_ generation: UInt64, seen: UInt64, cpu: UInt64, limitNs: UInt64) {
        // Timed on the end timer's thread, then run on the main queue: Dispatch's own timer
        // (`asyncAfter`) made a thread in each launch as it ended (see SerialThread).
        endTimer.async(afterNs: Self.quietNs) { [self] in DispatchQueue.main.async { [self] in quietLooked(generation, seen: seen, cpu: cpu, limitNs: limitNs) } }
    }

    private func quietLooked(_ generation: UInt64, seen: UInt64, cpu: UInt64, limitNs: UInt64) {
        let now = activity.load(ordering: .relaxed)
        let cpuNow = Self.processCPUNs()
        let awaiting = lock.withLock { !waiters.isEmpty }
        if (now != seen || awaiting || cpuNow > cpu + Self.quietCPUNs || Self.anotherThreadRunnable(besides: [expirationQueue.idleThreadID, endTimer.idleThreadID]))
            && bgtask_monotonic_ns() < limitNs {
            waitForQuiet(generation, seen: now, cpu: cpuNow, limitNs: limitNs)
        } else {
            endOnce(generation)
        }
    }

    /// Runs `end` once for this launch, unless the app took up work again while it settled (a
    /// new background-time assertion, a task added): then the launch goes on, and ends when
    /// that work is over.
    func endOnce(_ generation: UInt64) {
        let go: Bool = lock.withLock {
            guard !ended, signalledEnd, settleGeneration == generation else { return false }
            guard tasks.values.allSatisfy(\.completed), assertions.isEmpty else {
                signalledEnd = false
                return false
            }
            ended = true
            return true
        }
        if go { end() }
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
        activity.add(1, ordering: .relaxed)
        guard let waiter = lock.withLock({ waiters.removeValue(forKey: seq) }) else { return }
        waiter.status = status
        waiter.message = message
        waiter.json = json
        waiter.semaphore.signal()
    }

    /// The plugin's receiver of transfer events (`transfer_events`), called on the reader thread.
    var transferEventHandler: (handler: bgtask_json_visitor, context: UnsafeMutableRawPointer?)?

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
    func exchange(_ make: (UInt64) -> ChildMessage) -> ReplyWaiter {
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
        activity.add(1, ordering: .relaxed)
        guard let waiter = lock.withLock({ waiters.removeValue(forKey: seq) }) else { return }
        waiter.status = status
        waiter.message = message
        waiter.requests = requests ?? []
        waiter.semaphore.signal()
    }

    func resolveNotifications(seq: UInt64, status: Int32, message: String?, authorization: UInt32, notifications: [NotificationEntry]) {
        activity.add(1, ordering: .relaxed)
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

extension LaunchAssignment {
    /// The launch as the ABI's `bgtask_launch_info`, valid during `body` (its strings are the
    /// assignment's, borrowed for the call; `reason` is the caller's, which the launch entry's
    /// caller keeps for the process's life).
    func withLaunchInfo<T>(reason: UnsafePointer<CChar>?, _ body: (inout bgtask_launch_info) -> T) -> T {
        bundleIdentifier.withCString { bundleIdentifier in
            bundlePath.withCString { bundlePath in
                dataDirectory.withCString { dataDirectory in
                    launchID.withCString { launchID in
                        (eventJSON ?? "").withCString { event in
                            var info = bgtask_launch_info(
                                size: UInt32(MemoryLayout<bgtask_launch_info>.size),
                                role: bgtask_launch_role(role.abiValue),
                                bundle_identifier: bundleIdentifier, bundle_path: bundlePath,
                                data_directory: dataDirectory, launch_id: launchID,
                                event_json: eventJSON == nil ? nil : event, reason: reason)
                            return body(&info)
                        }
                    }
                }
            }
        }
    }
}

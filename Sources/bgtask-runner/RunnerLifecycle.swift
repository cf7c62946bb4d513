import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc
import Synchronization
import _BGTaskSystemShims

extension Runner {
    // MARK: Suspension

    /// The launch ended and the process stays (a suspendable launch): no deadline until the next
    /// launch (the reader must not expire a launch that is over), and only `resume` is taken.
    func becameIdle() {
        lock.withLock {
            idle = true
            expiresAtNs = 0
        }
        armDeadline()
    }

    func setResumeHandler(_ handler: bgtask_resume_handler?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { resumeHandler = handler.map { ($0, context) } }
    }

    /// The plugin hears resumed launches (it set a resume handler).
    var hearsResumes: Bool { lock.withLock { resumeHandler != nil } }

    /// The app's next launch, in this process: the launch's state starts over (its tasks, its
    /// time, its assertions), what the app registered stays. On the main queue, the plugin's
    /// resume handler hears of it, then its tasks start. False when the process is not idle
    /// (the host sends `resume` only after `idle`: anything else is a protocol error).
    func resume(_ next: LaunchAssignment) -> Bool {
        let resumed: Bool = lock.withLock {
            guard idle else { return false }
            for task in tasks.values {
                free(UnsafeMutableRawPointer(mutating: task.info.pointee.identifier))
                task.info.deallocate()
            }
            tasks = [:]
            // The device changed while the app slept: it hears so as it resumes.
            if next.thermalState != current.thermalState || next.lowPowerMode != current.lowPowerMode {
                deviceChangedWhileSuspended = true
            }
            current = next
            closed = next.role != .foreground
            expiresAtNs = next.expiresAtNs
            expiredAtDeadline = false
            expiredAll = false
            expiredBeforeBegin = []
            deferredTasks = []
            tasksStarted = false
            signalledEnd = false
            ended = false
            remoteNotificationDone = false
            idle = false
            return true
        }
        guard resumed else { return false }
        if lock.withLock({ () -> Bool in defer { deviceChangedWhileSuspended = false }; return deviceChangedWhileSuspended }) {
            tellDevice()
        }
        scheduleHandler { [self] in
            if let (handler, context) = lock.withLock({ resumeHandler }) {
                let reason = strdup(next.reason)
                defer { free(reason) }
                next.withLaunchInfo(reason: reason) { info in handler(context, &info) }
            }
            startTasks()
        }
        // After the main queue has the launch: arming the deadline wakes the expiration thread,
        // which went first and delayed the main thread's wake-up on a busy machine. The
        // deadline is seconds away; its alarm is set microseconds after the handler is queued.
        armDeadline()
        _ = bgtask_set_process_title(CommandLine.unsafeArgv, CommandLine.argc, "bgtask-launch \(next.launchID) \(next.bundleIdentifier)")
        return true
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
            if current.role == .foreground && !closed { return .greatestFiniteMagnitude }
            guard expiresAtNs > 0 else { return .greatestFiniteMagnitude }
            let now = bgtask_monotonic_ns()
            return now >= expiresAtNs ? 0 : Double(expiresAtNs - now) / 1e9
        }
    }

    /// BGTASK_APP_STATE_*: active while a foreground launch is in the foreground.
    var applicationState: UInt32 {
        lock.withLock { current.role == .foreground && !closed ? UInt32(BGTASK_APP_STATE_ACTIVE) : UInt32(BGTASK_APP_STATE_BACKGROUND) }
    }

    /// The launch's time now runs out at `at` (the host moved it: the app left the foreground).
    func setDeadline(_ at: UInt64) {
        lock.withLock { expiresAtNs = at }
        armDeadline()
    }

    /// Sets the expiration thread's alarm to the launch's deadline (or none). The runner knows
    /// its deadline (`LaunchAssignment.expiresAtNs`, moved by `ParentMessage.deadline`), so the
    /// budget's expiration does not wait for the host's message: at the deadline the
    /// expiration thread wakes and expires the launch itself (`expireAtDeadline`), one wake-up
    /// (the parent reader woke first and handed it over: two, on a machine where a thousand
    /// launches expire together). The host still sends its own at the same moment (each task's
    /// expiration is delivered once, whichever comes first) and still kills at the grace's
    /// end: an app that stops this thread gains nothing. A host that is busy or stopped does
    /// not delay the app's expiration.
    func armDeadline() {
        let at = lock.withLock { expiredAtDeadline ? 0 : expiresAtNs }
        expirationQueue.setAlarm(atNs: at)
    }

    /// Nanoseconds until the launch is to expire itself (0: now), or nil (no deadline, or done).
    func untilDeadline() -> UInt64? {
        lock.withLock {
            guard expiresAtNs > 0, !expiredAtDeadline else { return nil }
            let now = bgtask_monotonic_ns()
            return now >= expiresAtNs ? 0 : expiresAtNs - now
        }
    }

    /// The alarm rang (on the expiration thread): past the deadline, expiration to every open
    /// task, as the host's would; a deadline moved later is armed again.
    func expireAtDeadline() {
        guard let wait = untilDeadline() else { return }
        guard wait == 0 else { return armDeadline() }
        lock.withLock { expiredAtDeadline = true }
        expire(only: nil)
    }

    /// The launch's time has run out: every assertion's expiration handler, once, on this (the
    /// expiration) thread. An assertion the handler does not end keeps the launch until the
    /// watchdog kills it, as on iOS.
    func expireBackgroundTime() {
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

    /// The push's completion handler was called: reported once (later calls are ignored, as
    /// a second call of a completion handler does nothing the system sees).
    func remoteNotificationCompleted(_ result: UInt32) {
        let first: Bool = lock.withLock {
            defer { remoteNotificationDone = true }
            return !remoteNotificationDone
        }
        if first { report(.remoteNotificationCompleted(result: result, at: bgtask_monotonic_ns())) }
    }
}

// An app written for the tests of issue 29 (a launch's process is suspended after its work and
// resumed by the app's next launch). Its background paths follow two patterns seen in public
// apps; the code, names and messages here are this project's own.
//
// Pattern A, seen in NetNewsWire's app delegate: on a main-actor turn the app ends its last
// background-time assertion (`endBackgroundTask`) and, in that same turn, writes a log line.
// Pattern B, seen in Firefox for iOS's background notification refresh: a refresh handler
// completes its task, then a `Task` it started goes on to ask for the notification settings and
// add a local notification, and the refresh is resubmitted.
//
// Both are work an app does after the launch's last task or assertion has ended; the host must
// let it finish before it suspends (or ends) the process.
import BackgroundTasks
import Foundation
import UIKit
import UserNotifications
import os

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "LifecycleApp") { LifecycleAppDelegate() }
}

/// The identifiers the app registers (its Info.plist permits them) and the notification it adds.
enum LifecycleIdentifier {
    /// Pattern A: the assertion is ended a few milliseconds after the task completes.
    static let outbox = "com.example.lifecycle.outbox"
    /// Pattern A: the assertion is ended by its expiration handler, when the launch's time runs out.
    static let outboxExpiring = "com.example.lifecycle.outbox-expiring"
    /// Pattern B.
    static let digest = "com.example.lifecycle.digest"
    /// The local notification the digest refresh adds.
    static let digestNotification = "com.example.lifecycle.digest.ready"
}

final class LifecycleAppDelegate: UIResponder, UIApplicationDelegate {
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        ProcessMemory.noteDidFinishLaunching()
        OutboxSender.register()
        DigestRefresh.register()
        return true
    }
}

/// What only this process's memory holds: how often `didFinishLaunching` and a refresh handler
/// ran. Each change is logged with the process id, so a launch's log shows whether it found an
/// earlier launch's memory (a resumed process: "refresh run 2", one "didFinishLaunching" over
/// both launches) or started over (a new process: "refresh run 1" again).
enum ProcessMemory {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var finishedLaunching = 0
    nonisolated(unsafe) private static var refreshes = 0
    private static let log = Logger(subsystem: "com.example.lifecycle", category: "memory")

    static func noteDidFinishLaunching() {
        let count = lock.withLock { finishedLaunching += 1; return finishedLaunching }
        log.info("didFinishLaunching \(count, privacy: .public), pid \(getpid(), privacy: .public)")
    }

    static func noteRefreshRun(_ identifier: String) {
        let count = lock.withLock { refreshes += 1; return refreshes }
        log.info("refresh run \(count, privacy: .public) (\(identifier, privacy: .public)), pid \(getpid(), privacy: .public)")
    }
}

/// Pattern A. The refresh sends the app's queued messages under background time rather than
/// under its task: it takes an assertion, completes the task at once, and the assertion is
/// ended from the main actor once the sending is over, with a line saying so written right
/// after `endBackgroundTask`, in the same turn.
enum OutboxSender {
    static let log = Logger(subsystem: "com.example.lifecycle", category: "outbox")
    /// How long the stand-in sending takes: long enough that the task has completed when the
    /// assertion ends (so the assertion is the launch's last work), short enough for a test.
    static let sendingTime: UInt64 = 5_000_000

    static func register() {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: LifecycleIdentifier.outbox, using: nil) { task in
            ProcessMemory.noteRefreshRun(task.identifier)
            let queued = 3
            let assertion = UIApplication.shared.beginBackgroundTask(withName: "outbox-send")
            task.setTaskCompleted(success: true)
            Task { @MainActor in
                try? await Task.sleep(nanoseconds: sendingTime)
                UIApplication.shared.endBackgroundTask(assertion)
                log.info("outbox: \(queued, privacy: .public) message(s) sent, background time given back")
            }
        }
        // The same path when the sending never finishes: the expiration handler (on the main
        // queue) gives the time back and logs, in its turn, what was left unsent.
        BGTaskScheduler.shared.register(forTaskWithIdentifier: LifecycleIdentifier.outboxExpiring, using: nil) { task in
            ProcessMemory.noteRefreshRun(task.identifier)
            let slot = AssertionSlot()
            slot.identifier = UIApplication.shared.beginBackgroundTask(withName: "outbox-send") {
                UIApplication.shared.endBackgroundTask(slot.identifier)
                log.info("outbox: out of time, 3 message(s) left for the next launch")
            }
            task.setTaskCompleted(success: true)
        }
    }
}

/// An assertion's identifier, for an expiration handler that ends its own assertion (it is
/// known only once `beginBackgroundTask` has returned).
final class AssertionSlot: @unchecked Sendable {
    private let lock = NSLock()
    private var stored = UIBackgroundTaskIdentifier.invalid
    var identifier: UIBackgroundTaskIdentifier {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}

/// Pattern B. The refresh asks for its next run, completes its task, and only then does what
/// it came for, in a `Task` on the cooperative pool (not the main actor: `register` is not
/// main-actor code): the notification settings, the pending notifications, then `add` — three
/// answers from the host, all after `setTaskCompleted`.
enum DigestRefresh {
    static let log = Logger(subsystem: "com.example.lifecycle", category: "digest")
    /// How far ahead the next digest refresh is asked for.
    static let interval: TimeInterval = 6 * 3600

    static func register() {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: LifecycleIdentifier.digest, using: nil) { task in
            ProcessMemory.noteRefreshRun(task.identifier)
            scheduleNext()
            task.setTaskCompleted(success: true)
            Task {
                await postDigest(newItems: 4)
            }
        }
    }

    static func scheduleNext() {
        let request = BGAppRefreshTaskRequest(identifier: LifecycleIdentifier.digest)
        request.earliestBeginDate = Date(timeIntervalSinceNow: interval)
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { log.error("digest: next refresh not scheduled: \(String(describing: error), privacy: .public)") }
        }
    }

    static func postDigest(newItems: Int) async {
        let center = UNUserNotificationCenter.current()
        let settings = await center.notificationSettings()
        guard settings.authorizationStatus == .authorized else {
            log.info("digest: notifications not authorized (\(settings.authorizationStatus.rawValue, privacy: .public)), nothing posted")
            return
        }
        let waiting = await center.pendingNotificationRequests()
        if waiting.contains(where: { $0.identifier == LifecycleIdentifier.digestNotification }) {
            log.info("digest: the last digest is still waiting, nothing posted")
            return
        }
        let content = UNMutableNotificationContent()
        content.title = "Today's digest"
        content.body = "\(newItems) new items are waiting for you."
        // Shown half an hour from now, not at once: it is still pending when the launch ends.
        let trigger = UNTimeIntervalNotificationTrigger(timeInterval: 30 * 60, repeats: false)
        let request = UNNotificationRequest(identifier: LifecycleIdentifier.digestNotification, content: content, trigger: trigger)
        do {
            try await center.add(request)
            log.info("digest: notification added")
        } catch {
            log.error("digest: notification refused: \(String(describing: error), privacy: .public)")
        }
    }
}

// RacyApp: app code with the expiration bugs real handlers have, for the test kit's own tests
// (no plugin entry: it is linked into the test binary, not loaded by a runner).
//
// - sync: the expiration handler cancels the work *and* completes the task, and the work's
//   completion block completes it too. Undisturbed it completes once; expired while the work
//   runs it completes twice. Only an expiration that lands during the work shows it.
// - sync-fixed: the same, with the expiration handler only cancelling (Apple's sample code).
// - upload: on cancellation the work returns early and skips the completion: expired, it never
//   completes (on a device the watchdog ends the app).
// - refresh: schedules its next refresh, then completes at once.
import BackgroundTasks

public final class RacyApp: Sendable {
    public static let syncIdentifier = "com.example.racy.sync"
    public static let fixedSyncIdentifier = "com.example.racy.sync-fixed"
    public static let uploadIdentifier = "com.example.racy.upload"
    public static let refreshIdentifier = "com.example.racy.refresh"

    public init() {}

    /// application(_:didFinishLaunchingWithOptions:)
    public func registerHandlers() {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.syncIdentifier, using: nil) { task in
            self.handleSync(task: task as! BGProcessingTask, completeOnExpiration: true)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.fixedSyncIdentifier, using: nil) { task in
            self.handleSync(task: task as! BGProcessingTask, completeOnExpiration: false)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.uploadIdentifier, using: nil) { task in
            self.handleUpload(task: task as! BGProcessingTask)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.refreshIdentifier, using: nil) { task in
            self.scheduleRefresh()
            task.setTaskCompleted(success: true)
        }
    }

    public func scheduleRefresh() {
        let request = BGAppRefreshTaskRequest(identifier: Self.refreshIdentifier)
        request.earliestBeginDate = Date(timeIntervalSinceNow: 60 * 60)
        try? BGTaskScheduler.shared.submit(request)
    }

    func handleSync(task: BGProcessingTask, completeOnExpiration: Bool) {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        let operation = SyncOperation()
        task.expirationHandler = {
            queue.cancelAllOperations()
            if completeOnExpiration {
                task.setTaskCompleted(success: false) // the bug: the completion block completes it too
            }
        }
        operation.completionBlock = {
            task.setTaskCompleted(success: !operation.isCancelled)
        }
        queue.addOperation(operation)
    }

    func handleUpload(task: BGProcessingTask) {
        let cancelled = Flag()
        task.expirationHandler = { cancelled.set() }
        DispatchQueue.global().async {
            for _ in 0..<10 {
                if cancelled.isSet { return } // the bug: returns without completing the task
                Thread.sleep(forTimeInterval: 0.002)
            }
            task.setTaskCompleted(success: true)
        }
    }
}

/// Syncs in small steps, stopping early when cancelled.
final class SyncOperation: Operation, @unchecked Sendable {
    override func main() {
        for _ in 0..<10 {
            if isCancelled { return }
            Thread.sleep(forTimeInterval: 0.002)
        }
    }
}

final class Flag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

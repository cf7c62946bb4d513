import BGTaskABI
import CBGTaskPluginABI
import Foundation

/// A background task the system launched the app to run. Complete it with
/// `setTaskCompleted(success:)` as soon as the work is done; the launch ends when every task has.
open class BGTask: NSObject, @unchecked Sendable {
    private let lock = NSLock()
    private let _identifier: String
    private var _expirationHandler: (() -> Void)?
    private var completed = false
    let taskID: UInt64

    /// The identifier the task was registered and requested with.
    open var identifier: String { _identifier }

    /// Called, on a thread other than the handler's queue, when the launch's time is running out
    /// (or the user cancels a continued task). Finish quickly and call `setTaskCompleted`.
    /// Cleared by `setTaskCompleted`.
    open var expirationHandler: (() -> Void)? {
        get { lock.withLock { _expirationHandler } }
        set { lock.withLock { _expirationHandler = completed ? nil : newValue } }
    }

    init(identifier: String, taskID: UInt64) {
        _identifier = identifier
        self.taskID = taskID
    }

    @available(*, unavailable, message: "the system creates tasks and hands them to launch handlers")
    public override init() { fatalError("BGTask is created by the system") }

    /// Tells the system the task is done. Only the first call counts.
    open func setTaskCompleted(success: Bool) {
        let first = lock.withLock {
            let first = !completed
            completed = true
            _expirationHandler = nil
            return first
        }
        guard first else {
            HostConnection.current.noteRepeatedCompletion(taskID, success: success)
            return
        }
        HostConnection.current.untrack(taskID)
        let taskID = taskID
        HostConnection.current.handOver {
            if let (api, host) = HostConnection.current.connection {
                api.set_task_completed(host, taskID, success)
            }
        }
    }

    /// Takes the expiration handler for delivery; nil once completed or when none is set.
    func takeExpirationHandler() -> (() -> Void)? {
        lock.withLock { completed ? nil : _expirationHandler }
    }

    open override var description: String {
        "<\(type(of: self)): \(identifier)>"
    }
}

/// A task that refreshes the app's content (from a `BGAppRefreshTaskRequest`).
open class BGAppRefreshTask: BGTask, @unchecked Sendable {}

/// A deferrable task that may run for minutes (from a `BGProcessingTaskRequest`).
open class BGProcessingTask: BGTask, @unchecked Sendable {}

/// A processing task for health research (from a `BGHealthResearchTaskRequest`).
open class BGHealthResearchTask: BGProcessingTask, @unchecked Sendable {}

/// A user-initiated task that continues in the background and reports progress (iOS 26).
open class BGContinuedProcessingTask: BGTask, ProgressReporting, @unchecked Sendable {
    private let textLock = NSLock()
    private var _title = ""
    private var _subtitle = ""
    private var reporter: DispatchSourceTimer?
    private var lastReported: (Int64, Int64) = (-1, -1)

    /// The task's progress; the host shows it (`bgtask progress`) and expires a task whose
    /// progress stops moving.
    public let progress = Progress(totalUnitCount: 0)

    open var title: String { textLock.withLock { _title } }
    open var subtitle: String { textLock.withLock { _subtitle } }

    /// Changes the text the user sees for this task.
    open func updateTitle(_ title: String, subtitle: String) {
        textLock.withLock {
            _title = title
            _subtitle = subtitle
        }
        // Text usually describes the progress: send the progress first, so the two agree.
        reportProgress()
        if let (api, host) = HostConnection.current.connection, api.has(\.update_title) {
            title.withCString { t in subtitle.withCString { s in api.update_title(host, taskID, t, s) } }
        }
    }

    func setInitialText(title: String, subtitle: String) {
        textLock.withLock {
            _title = title
            _subtitle = subtitle
        }
    }

    /// Progress has no observation on Linux's Foundation, so its counts are sampled and sent
    /// to the host when they change.
    func startReportingProgress() {
        let timer = DispatchSource.makeTimerSource(queue: .global(qos: .utility))
        timer.schedule(deadline: .now(), repeating: .milliseconds(100))
        timer.setEventHandler { [weak self] in self?.reportProgress() }
        textLock.withLock { reporter = timer }
        timer.resume()
    }

    private func reportProgress() {
        let counts = (progress.completedUnitCount, progress.totalUnitCount)
        let changed = textLock.withLock {
            defer { lastReported = counts }
            return lastReported != counts
        }
        if changed, let (api, host) = HostConnection.current.connection, api.has(\.update_progress) {
            api.update_progress(host, taskID, counts.0, counts.1)
        }
    }

    open override func setTaskCompleted(success: Bool) {
        reportProgress()
        textLock.withLock {
            reporter?.cancel()
            reporter = nil
        }
        super.setTaskCompleted(success: success)
    }
}

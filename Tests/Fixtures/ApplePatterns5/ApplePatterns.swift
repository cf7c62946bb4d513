// ApplePatterns: code written the way public iOS apps write it against Apple's BackgroundTasks,
// compiled twice: ApplePatterns5 (Swift 5 language mode) and ApplePatterns6 (Swift 6; the same
// file, symlinked). Each handler prints one line saying what it observed.
import BackgroundTasks

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "ApplePatterns") { _ in PatternsApp().didFinishLaunching() }
}

// MARK: - The app's own abstractions, which the framework classes witness

protocol BackgroundTaskScheduling {
    @discardableResult
    func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (BGTask) -> Void
    ) -> Bool
    func submit(_ taskRequest: BGTaskRequest) throws
    func cancel(taskRequestWithIdentifier identifier: String)
    func getPendingTaskRequests(completionHandler: @escaping ([BGTaskRequest]) -> Void)
    func pendingTaskRequests() async -> [BGTaskRequest]
}

extension BGTaskScheduler: BackgroundTaskScheduling {}

protocol TaskCompleting: AnyObject {
    func setTaskCompleted(success: Bool)
    var expirationHandler: (() -> Void)? { get set }
}

extension BGTask: TaskCompleting {}

extension BGAppRefreshTaskRequest {
    convenience init(identifier: String, earliestBeginAfter interval: TimeInterval) {
        self.init(identifier: identifier)
        earliestBeginDate = Date(timeIntervalSinceNow: interval)
    }
}

// MARK: - The app delegate

final class PatternsApp {
    static let castIdentifier = "com.example.patterns.cast"
    static let labelIdentifier = "com.example.patterns.label"
    static let witnessIdentifier = "com.example.patterns.witness"
    static let pendingIdentifier = "com.example.patterns.pending"
    static let swiftTaskIdentifier = "com.example.patterns.swifttask"
    static let semaphoreIdentifier = "com.example.patterns.semaphore"

    let processingQueue = DispatchQueue(label: "com.example.patterns.processing")
    let processingQueueKey = DispatchSpecificKey<String>()
    let scheduler: BackgroundTaskScheduling = BGTaskScheduler.shared

    init() {
        processingQueue.setSpecific(key: processingQueueKey, value: "processing")
    }

    func didFinishLaunching() {
        // Trailing closure, nil queue, forced downcast: the most common shape.
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.castIdentifier, using: nil) { task in
            self.handleCast(task: task as! BGAppRefreshTask)
        }

        // Explicit label, with the queue forwarded through the app's own wrapper.
        registerProcessingTask(identifier: Self.labelIdentifier, queue: processingQueue) { task in
            self.handleLabel(task: task)
        }

        // Through the app's protocol.
        scheduler.register(forTaskWithIdentifier: Self.witnessIdentifier, using: nil) { task in
            self.handleWitness(task: task)
        }

        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.pendingIdentifier, using: nil) { task in
            self.handlePending(task: task)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.swiftTaskIdentifier, using: nil) { task in
            self.handleSwiftTask(task: task)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.semaphoreIdentifier, using: nil) { task in
            self.handleSemaphore(task: task)
        }
    }

    func registerProcessingTask(
        identifier: String,
        queue: DispatchQueue?,
        handler: @escaping (BGProcessingTask) -> Void
    ) {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: queue, launchHandler: { task in
            handler(task as! BGProcessingTask)
        })
    }

    // MARK: Handlers

    func handleCast(task: BGAppRefreshTask) {
        print("patterns: cast got \(type(of: task)) \(task.identifier)")
        task.setTaskCompleted(success: true)
    }

    func handleLabel(task: BGProcessingTask) {
        let onQueue = DispatchQueue.getSpecific(key: processingQueueKey) == "processing"
        if onQueue {
            dispatchPrecondition(condition: .onQueue(processingQueue))
        }
        print("patterns: label got \(type(of: task)) on the app's queue: \(onQueue)")
        task.setTaskCompleted(success: onQueue)
    }

    func handleWitness(task: BGTask) {
        let completing: TaskCompleting = task
        completing.expirationHandler = {
            completing.setTaskCompleted(success: false)
        }

        let request: BGTaskRequest = BGAppRefreshTaskRequest(
            identifier: "com.example.not.permitted", earliestBeginAfter: 15 * 60)

        // (a) A typed catch, switching on the code.
        var matchedCode = false
        do {
            try scheduler.submit(request)
        } catch let error as BGTaskScheduler.Error {
            switch error.code {
            case .notPermitted:
                matchedCode = true
            default:
                print("patterns: witness: unexpected code \(error.code)")
            }
        } catch {
            print("patterns: witness: unexpected error \(error)")
        }

        // (b) Matching the code directly in the catch clause.
        var matchedPattern = false
        do {
            try scheduler.submit(request)
        } catch BGTaskScheduler.Error.notPermitted {
            matchedPattern = true
        } catch {
            print("patterns: witness: unexpected error \(error)")
        }

        // (c) Through NSError's domain and code.
        var matchedNSError = false
        do {
            try scheduler.submit(request)
        } catch {
            let nsError = error as NSError
            matchedNSError = nsError.domain == BGTaskScheduler.errorDomain
                && nsError.code == BGTaskScheduler.Error.Code.notPermitted.rawValue
        }

        let all = matchedCode && matchedPattern && matchedNSError
        print("patterns: witness notPermitted matched: code \(matchedCode), pattern \(matchedPattern), NSError \(matchedNSError)")
        completing.setTaskCompleted(success: all)
    }

    func handlePending(task: BGTask) {
        let identifier = Self.labelIdentifier
        do {
            try BGTaskScheduler.shared.submit(BGProcessingTaskRequest(identifier: identifier))
        } catch {
            print("patterns: pending: could not submit \(identifier): \(error)")
            task.setTaskCompleted(success: false)
            return
        }
        BGTaskScheduler.shared.getPendingTaskRequests { requests in
            let inCallback = requests.contains { $0.identifier == identifier }
            Task {
                let requests = await BGTaskScheduler.shared.pendingTaskRequests()
                let inAsync = requests.contains { $0.identifier == identifier }
                print("patterns: pending \(identifier) in getPendingTaskRequests: \(inCallback), in pendingTaskRequests(): \(inAsync)")
                task.setTaskCompleted(success: inCallback && inAsync)
            }
        }
    }

    func handleSwiftTask(task: BGTask) {
        let work = Task {
            do {
                while true {
                    try await Task.sleep(nanoseconds: 60 * 1_000_000_000)
                }
            } catch {
                print("patterns: swifttask cancelled: \(error is CancellationError)")
                task.setTaskCompleted(success: false)
            }
        }
        task.expirationHandler = {
            work.cancel()
        }
    }

    func handleSemaphore(task: BGTask) {
        let semaphore = DispatchSemaphore(value: 0)
        task.expirationHandler = {
            semaphore.signal()
        }
        semaphore.wait()
        print("patterns: semaphore signalled by the expiration handler")
        task.setTaskCompleted(success: false)
    }
}

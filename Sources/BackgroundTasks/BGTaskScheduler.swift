import BGTaskABI
import CBGTaskPluginABI
import Foundation

/// Registers launch handlers and submits task requests, as Apple's `BGTaskScheduler`.
///
/// Inside a bgtask launch every call goes to the runner through the plugin ABI; outside one
/// (a unit test, a tool) `register` returns false and submitting fails with `.unavailable`.
open class BGTaskScheduler: NSObject, @unchecked Sendable {
    private static let sharedScheduler = BGTaskScheduler(shared: ())

    /// The shared scheduler.
    open class var shared: BGTaskScheduler { sharedScheduler }

    /// Resources this machine offers continued-processing tasks (`.gpu` where a GPU is present
    /// or `bgtask device` says so).
    open class var supportedResources: BGContinuedProcessingTaskRequest.Resources {
        guard let (api, host) = HostConnection.current.connection, api.has(\.supported_resources) else { return [] }
        return .init(rawValue: Int(api.supported_resources(host)))
    }

    private init(shared: Void) {}

    @available(*, unavailable, message: "use BGTaskScheduler.shared")
    public override init() { fatalError("use BGTaskScheduler.shared") }

    /// Registers the handler the system calls to run tasks with `identifier`.
    ///
    /// Call it while the app finishes launching (the plugin's launch closure). Returns false
    /// when the identifier is not in BGTaskSchedulerPermittedIdentifiers, or in an extension.
    /// Registering an identifier twice, or after launch (continued processing excepted), ends
    /// the launch, as on iOS; the run record names the identifier. The handler runs on `queue`,
    /// or on a serial background queue for nil.
    @discardableResult
    open func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (BGTask) -> Void
    ) -> Bool {
        guard let (api, host) = HostConnection.current.connection else { return false }
        let registration = Registration(
            identifier: identifier,
            queue: queue ?? DispatchQueue(label: "bgtask.handler.\(identifier)", qos: .background),
            handler: launchHandler)
        let context = Unmanaged.passRetained(registration).toOpaque()
        let registered = identifier.withCString { api.register_handler(host, $0, launchTrampoline, context) }
        if registered == 0 {
            Unmanaged<Registration>.fromOpaque(context).release()
            return false
        }
        return true
    }

    /// Submits a request. Resubmitting an identifier replaces its pending request.
    @available(*, deprecated, message: "Use submitTaskRequest(_:completionHandler:) or 'try await submitTaskRequest(_:)' to capture all error conditions")
    open func submit(_ taskRequest: BGTaskRequest) throws {
        try submitRequest(taskRequest)
    }

    /// Submits a request and calls `completionHandler` with nil, or the `BGTaskScheduler.Error`
    /// that refused it, on a background queue (iOS 27). The request reaches the runner before
    /// this returns, so a task completed right after does not end the launch without it.
    ///
    /// `@preconcurrency`, as Apple's Objective-C declarations are when imported: a handler that
    /// captures non-Sendable state is a warning in Swift 6 mode, as on iOS, not an error.
    @preconcurrency
    open func submitTaskRequest(_ taskRequest: BGTaskRequest, completionHandler: @escaping @Sendable ((any Swift.Error)?) -> Void) {
        let refusal: Error?
        do {
            try submitRequest(taskRequest)
            refusal = nil
        } catch {
            refusal = error
        }
        DispatchQueue.global().async { completionHandler(refusal) }
    }

    /// Submits a request; throws a `BGTaskScheduler.Error` when it is refused (iOS 27).
    open func submitTaskRequest(_ taskRequest: BGTaskRequest) async throws {
        try submitRequest(taskRequest)
    }

    /// The one submission path of `submit` and both `submitTaskRequest`s.
    private func submitRequest(_ taskRequest: BGTaskRequest) throws(Error) {
        guard let (api, host) = HostConnection.current.connection else {
            throw Error(.unavailable, message: "not running inside a bgtask launch")
        }
        var message = [CChar](repeating: 0, count: 512)
        let status: Int32 = taskRequest.identifier.withCString { identifier in
            let strings = (taskRequest as? BGContinuedProcessingTaskRequest).map { ($0.title, $0.subtitle) }
            return (strings?.0 ?? "").withCString { title in
                (strings?.1 ?? "").withCString { subtitle in
                    var request = bgtask_request()
                    request.size = UInt32(MemoryLayout<bgtask_request>.size)
                    request.type = taskRequest.taskType
                    request.identifier = identifier
                    request.earliest_begin_date = taskRequest.earliestBeginDate?.timeIntervalSince1970 ?? .nan
                    if strings != nil {
                        request.title = title
                        request.subtitle = subtitle
                    }
                    taskRequest.fill(&request)
                    return api.submit(host, &request, &message, message.count)
                }
            }
        }
        guard status != BGTASK_OK.rawValue else { return }
        let text = String(decoding: message.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let code = Error.Code(rawValue: Int(status)) ?? .unavailable
        throw Error(code, message: text.isEmpty ? nil : text)
    }

    /// Cancels the pending request with `identifier`, if any.
    open func cancel(taskRequestWithIdentifier identifier: String) {
        guard let (api, host) = HostConnection.current.connection else { return }
        identifier.withCString { api.cancel(host, $0) }
    }

    /// Cancels every pending request of this app.
    open func cancelAllTaskRequests() {
        guard let (api, host) = HostConnection.current.connection else { return }
        api.cancel_all(host)
    }

    /// Calls `completionHandler` with this app's pending requests (`@preconcurrency` as
    /// `submitTaskRequest(_:completionHandler:)` is).
    @preconcurrency
    open func getPendingTaskRequests(completionHandler: @escaping @Sendable ([BGTaskRequest]) -> Void) {
        completionHandler(currentPendingRequests())
    }

    /// This app's pending requests.
    open func pendingTaskRequests() async -> [BGTaskRequest] {
        currentPendingRequests()
    }

    private func currentPendingRequests() -> [BGTaskRequest] {
        guard let (api, host) = HostConnection.current.connection else { return [] }
        let collector = PendingCollector()
        let context = Unmanaged.passUnretained(collector).toOpaque()
        _ = api.pending(host, { context, request in
            guard let context, let request else { return }
            let collector = Unmanaged<PendingCollector>.fromOpaque(context).takeUnretainedValue()
            do {
                collector.requests.append(BGTaskRequest.make(from: try bgtask_request.read(from: request, writtenBy: .host)))
            } catch {
                BGTaskPlugin.log("BackgroundTasks: a pending request is left out: \(error)")
            }
        }, context)
        return collector.requests
    }
}

private final class PendingCollector {
    var requests: [BGTaskRequest] = []
}

/// A registered launch handler; retained for the life of the process (handlers live as long as
/// the launch, as on iOS).
private final class Registration: @unchecked Sendable {
    let identifier: String
    let queue: DispatchQueue
    let handler: (BGTask) -> Void

    init(identifier: String, queue: DispatchQueue, handler: @escaping (BGTask) -> Void) {
        self.identifier = identifier
        self.queue = queue
        self.handler = handler
    }
}

/// Called by the runner on its handler thread: builds the task object of the right class and
/// hands it to the app's handler on the app's queue.
private let launchTrampoline: bgtask_launch_handler = { context, info in
    guard let context, let info else { return }
    let registration = Unmanaged<Registration>.fromOpaque(context).takeUnretainedValue()
    let taskInfo: bgtask_task_info
    do {
        taskInfo = try bgtask_task_info.read(from: info)
    } catch {
        // Its task id cannot be trusted either: the task stays open until the launch's time ends.
        BGTaskPlugin.log("BackgroundTasks: a task for '\(registration.identifier)' is refused: \(error)")
        return
    }
    let identifier = String(optionalCString: taskInfo.identifier) ?? registration.identifier, taskID = taskInfo.task
    let task: BGTask = switch taskInfo.type {
    case BGTASK_TYPE_PROCESSING.rawValue: BGProcessingTask(identifier: identifier, taskID: taskID)
    case BGTASK_TYPE_HEALTH_RESEARCH.rawValue: BGHealthResearchTask(identifier: identifier, taskID: taskID)
    case BGTASK_TYPE_CONTINUED_PROCESSING.rawValue: BGContinuedProcessingTask(identifier: identifier, taskID: taskID)
    default: BGAppRefreshTask(identifier: identifier, taskID: taskID)
    }
    HostConnection.current.track(task)
    if let (api, host) = HostConnection.current.connection {
        api.set_expiration_handler(host, task.taskID, expirationTrampoline, nil)
    }
    if let continued = task as? BGContinuedProcessingTask {
        continued.startReportingProgress()
    }
    registration.queue.async { registration.handler(task) }
}

/// Called by the runner on its expiration thread, never the handler's queue.
private let expirationTrampoline: bgtask_expiration_handler = { _, taskID in
    guard let task = HostConnection.current.task(taskID), let handler = task.takeExpirationHandler() else {
        return false
    }
    handler()
    return true
}

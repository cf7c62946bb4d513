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
    func submitTaskRequest(_ taskRequest: BGTaskRequest, completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    func submitTaskRequest(_ taskRequest: BGTaskRequest) async throws
    func cancel(taskRequestWithIdentifier identifier: String)
    func getPendingTaskRequests(completionHandler: @escaping @Sendable ([BGTaskRequest]) -> Void)
    func pendingTaskRequests() async -> [BGTaskRequest]
}

extension BGTaskScheduler: BackgroundTaskScheduling {}

/// The test double an app's unit tests put in the scheduler's place: it refuses everything with
/// a hand-made NSError, as such mocks do.
final class RefusingScheduler: BackgroundTaskScheduling {
    let refusal = NSError(domain: BGTaskSchedulerErrorDomain, code: 3)

    func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (BGTask) -> Void
    ) -> Bool { false }
    func submit(_ taskRequest: BGTaskRequest) throws { throw refusal }
    func submitTaskRequest(_ taskRequest: BGTaskRequest, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        completionHandler(refusal)
    }
    func submitTaskRequest(_ taskRequest: BGTaskRequest) async throws { throw refusal }
    func cancel(taskRequestWithIdentifier identifier: String) {}
    func getPendingTaskRequests(completionHandler: @escaping @Sendable ([BGTaskRequest]) -> Void) { completionHandler([]) }
    func pendingTaskRequests() async -> [BGTaskRequest] { [] }
}

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
    static let errorsIdentifier = "com.example.patterns.errors"
    static let submitIdentifier = "com.example.patterns.submit"
    static let requestsIdentifier = "com.example.patterns.requests"
    /// Permitted for submissions only: nothing registers them.
    static let laterIdentifier = "com.example.patterns.later"
    static let studyIdentifier = "com.example.patterns.study"
    static let notPermittedIdentifier = "com.example.not.permitted"

    static let submitQueueKey = DispatchSpecificKey<String>()
    let submitQueue = DispatchQueue(label: "com.example.patterns.submit")

    let processingQueue = DispatchQueue(label: "com.example.patterns.processing")
    let processingQueueKey = DispatchSpecificKey<String>()
    let scheduler: BackgroundTaskScheduling = BGTaskScheduler.shared

    init() {
        processingQueue.setSpecific(key: processingQueueKey, value: "processing")
        submitQueue.setSpecific(key: Self.submitQueueKey, value: "submit")
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
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.errorsIdentifier, using: nil) { task in
            self.handleErrors(task: task)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.submitIdentifier, using: submitQueue) { task in
            self.handleSubmit(task: task)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.requestsIdentifier, using: nil) { task in
            self.handleRequests(task: task)
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
            try scheduler.submit(BGProcessingTaskRequest(identifier: identifier))
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

    // MARK: BGTaskScheduler.Error, as apps and their tests use it

    func handleErrors(task: BGTask) {
        let unavailable = BGTaskScheduler.Error(.unavailable)
        let described = BGTaskScheduler.Error(.notPermitted, userInfo: [NSLocalizedDescriptionKey: "the message"])
        print("patterns: errors made: \(unavailable) | \(described)")
        print("patterns: errors fields: code \(described.code), errorCode \(described.errorCode), "
              + "userInfo \(described.userInfo[NSLocalizedDescriptionKey] as? String ?? "nil"), "
              + "no userInfo \(unavailable.userInfo.isEmpty && unavailable.errorUserInfo.isEmpty), "
              + "domain \(BGTaskScheduler.Error.errorDomain) \(BGTaskScheduler.errorDomain == BGTaskSchedulerErrorDomain)")
        print("patterns: errors localizedDescription: \(unavailable.localizedDescription) | \(described.localizedDescription)")
        let bridged = described as NSError
        print("patterns: errors as NSError: \(bridged.domain) \(bridged.code) \(bridged.userInfo[NSLocalizedDescriptionKey] as? String ?? "nil")")

        // The SDK's own error, thrown for an identifier the Info.plist does not permit.
        let refused = BGAppRefreshTaskRequest(identifier: Self.notPermittedIdentifier)
        var sdkPattern = false
        do {
            try scheduler.submit(refused)
        } catch BGTaskScheduler.Error.notPermitted {
            sdkPattern = true
        } catch {}
        var sdkText = "nothing thrown"
        do {
            try scheduler.submit(refused)
        } catch {
            sdkText = "\(error)"
        }
        print("patterns: errors SDK refusal: pattern \(sdkPattern), text \(sdkText)")

        // A test double's hand-made NSError, through the same patterns.
        let mock: BackgroundTaskScheduling = RefusingScheduler()
        var mockPattern = false
        do {
            try mock.submit(refused)
        } catch BGTaskScheduler.Error.notPermitted {
            mockPattern = true
        } catch {}
        let handMade: any Error = NSError(domain: BGTaskSchedulerErrorDomain, code: 3)
        let switched: String
        switch handMade {
        case BGTaskScheduler.Error.unavailable: switched = "unavailable"
        case BGTaskScheduler.Error.notPermitted: switched = "notPermitted"
        default: switched = "nothing"
        }
        var ifCase = false
        if case BGTaskScheduler.Error.notPermitted = handMade { ifCase = true }
        let otherDomain = BGTaskScheduler.Error.notPermitted ~= NSError(domain: "OtherDomain", code: 3)
        let otherCode = BGTaskScheduler.Error.notPermitted ~= NSError(domain: BGTaskSchedulerErrorDomain, code: 1)
        print("patterns: errors NSError: catch \(mockPattern), switch \(switched), if case \(ifCase), "
              + "other domain \(otherDomain), other code \(otherCode)")

        let converted = BGTaskScheduler.Error(_nsError: NSError(domain: BGTaskSchedulerErrorDomain, code: 3))
        let wrongDomain = BGTaskScheduler.Error(_bridgedNSError: NSError(domain: "OtherDomain", code: 3))
        let rightDomain = BGTaskScheduler.Error(_bridgedNSError: NSError(domain: BGTaskSchedulerErrorDomain, code: 2))
        let equal = BGTaskScheduler.Error(.unavailable) == unavailable && converted != described
        let distinct: Set<BGTaskScheduler.Error> = [unavailable, BGTaskScheduler.Error(.unavailable), described, converted]
        print("patterns: errors converted: \(converted.code) \(converted), bridged \(rightDomain.map { "\($0.code)" } ?? "nil"), "
              + "wrong domain \(wrongDomain == nil ? "nil" : "converted"), equal \(equal), distinct \(distinct.count)")
        task.setTaskCompleted(success: sdkPattern && mockPattern && ifCase)
    }

    // MARK: submitTaskRequest (iOS 27)

    func handleSubmit(task: BGTask) {
        let refused = BGAppRefreshTaskRequest(identifier: Self.notPermittedIdentifier)
        BGTaskScheduler.shared.submitTaskRequest(refused) { error in
            let onCallerQueue = DispatchQueue.getSpecific(key: PatternsApp.submitQueueKey) != nil
            var matched = false
            if let error, case BGTaskScheduler.Error.notPermitted = error { matched = true }
            print("patterns: submit completionHandler: notPermitted \(matched), on the caller's queue \(onCallerQueue)")
            Task { await PatternsApp.submitAsync(task: task) }
        }
    }

    static func submitAsync(task: BGTask) async {
        let processing = BGProcessingTaskRequest(identifier: laterIdentifier)
        processing.requiresExternalPower = true
        processing.earliestBeginDate = Date(timeIntervalSince1970: 2_000_000_000)
        let study = BGHealthResearchTaskRequest(identifier: studyIdentifier)
        study.protectionTypeOfRequiredData = FileProtectionType.complete.rawValue as NSString
        var accepted = "accepted"
        do {
            try await BGTaskScheduler.shared.submitTaskRequest(processing)
            try await BGTaskScheduler.shared.submitTaskRequest(study)
        } catch {
            accepted = "\(error)"
        }
        var refusal = "accepted"
        do {
            try await BGTaskScheduler.shared.submitTaskRequest(BGAppRefreshTaskRequest(identifier: notPermittedIdentifier))
        } catch let error as BGTaskScheduler.Error {
            refusal = "\(error.code)"
        } catch {
            refusal = "\(error)"
        }
        var mockRefusal = false
        do {
            try await RefusingScheduler().submitTaskRequest(processing)
        } catch BGTaskScheduler.Error.notPermitted {
            mockRefusal = true
        } catch {}
        let refresh = BGAppRefreshTaskRequest(identifier: requestsIdentifier)
        let viaHandler: Bool = await withCheckedContinuation { continuation in
            BGTaskScheduler.shared.submitTaskRequest(refresh) { error in continuation.resume(returning: error == nil) }
        }
        let pending = await BGTaskScheduler.shared.pendingTaskRequests()
        let pendingStudy = pending.first { $0.identifier == studyIdentifier } as? BGHealthResearchTaskRequest
        print("patterns: submit async: \(accepted), refused \(refusal), mock refused \(mockRefusal), "
              + "completion handler accepted \(viaHandler), "
              + "pending equal: processing \(pending.contains(processing)), study \(pending.contains(study)), refresh \(pending.contains(refresh)), "
              + "study protection \(pendingStudy.map { "\($0.protectionTypeOfRequiredData)" } ?? "missing")")
        task.setTaskCompleted(success: accepted == "accepted" && viaHandler && pending.contains(study))
    }

    // MARK: Request equality and protectionTypeOfRequiredData

    func handleRequests(task: BGTask) {
        let date = Date(timeIntervalSince1970: 2_000_000_000)
        let a = BGAppRefreshTaskRequest(identifier: "x"), b = BGAppRefreshTaskRequest(identifier: "x")
        let same = a == b
        a.earliestBeginDate = date
        let dateDiffers = a == b
        b.earliestBeginDate = date
        let set: Set<BGTaskRequest> = [a, b, BGAppRefreshTaskRequest(identifier: "y")]
        let refreshAsRequest: BGTaskRequest = BGAppRefreshTaskRequest(identifier: "x")
        let processingAsRequest: BGTaskRequest = BGProcessingTaskRequest(identifier: "x")
        print("patterns: requests refresh: same fields \(same), date differs \(dateDiffers), same date \(a == b), "
              + "set \(set.count), refresh vs processing \(refreshAsRequest == processingAsRequest), "
              + "isEqual \(a.isEqual(b)) hash \(a.hash == b.hash)")

        let p = BGProcessingTaskRequest(identifier: "p"), q = BGProcessingTaskRequest(identifier: "p")
        p.requiresExternalPower = true
        let powerDiffers = p == q
        q.requiresExternalPower = true
        let copied = p.copy() as! BGProcessingTaskRequest
        print("patterns: requests processing: power differs \(powerDiffers), same \(p == q), copy \(copied == p)")

        let c = BGContinuedProcessingTaskRequest(identifier: "c.1", title: "Export", subtitle: "3 files")
        let d = BGContinuedProcessingTaskRequest(identifier: "c.1", title: "Export", subtitle: "3 files")
        let sameContinued = c == d
        d.strategy = .fail
        let strategyDiffers = c == d
        d.strategy = c.strategy
        d.title = "Import"
        print("patterns: requests continued: same \(sameContinued), strategy differs \(strategyDiffers), title differs \(c == d)")

        let h = BGHealthResearchTaskRequest(identifier: "h"), i = BGHealthResearchTaskRequest(identifier: "h")
        let defaultProtection = h.protectionTypeOfRequiredData
        h.protectionTypeOfRequiredData = FileProtectionType.complete.rawValue as NSString
        let fromRawValue = h.protectionTypeOfRequiredData
        let protectionDiffers = h == i
        i.protectionTypeOfRequiredData = "NSFileProtectionComplete"
        let fromLiteral = i.protectionTypeOfRequiredData
        let asString = h.protectionTypeOfRequiredData as String
        print("patterns: requests health: default \(defaultProtection), raw value \(fromRawValue), literal \(fromLiteral), "
              + "string \(asString == FileProtectionType.complete.rawValue), protection differs \(protectionDiffers), same \(h == i)")
        // The spelling tutorials teach: a member of the class, as if the property were a FileProtectionType.
        let taught = BGHealthResearchTaskRequest(identifier: "h")
        taught.protectionTypeOfRequiredData = .complete
        let complete = taught.protectionTypeOfRequiredData
        taught.protectionTypeOfRequiredData = .completeUntilFirstUserAuthentication
        print("patterns: requests health taught: complete \(complete), until first authentication \(taught.protectionTypeOfRequiredData), "
              + "unless open \(NSString.completeUnlessOpen), as the raw value \(complete as String == FileProtectionType.complete.rawValue)")
        task.setTaskCompleted(success: same && !dateDiffers && a == b && set.count == 2 && h == i)
    }
}

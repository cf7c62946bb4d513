import BGTaskABI
import BGTaskControl
import BGTaskModel
import BGTaskWire
import BackgroundTasks
import CBGTaskPluginABI
import Foundation

/// Plays the system for app code inside a test process: while it is installed,
/// `BGTaskScheduler.shared` (register, submit, cancel, pending) talks to it, through the same
/// plugin ABI the runner serves in a launch, so app code runs unchanged and the SDK under it is
/// the one plugins ship with.
///
/// What it decides, it decides with the host's own rules: submissions with `SubmissionRules`
/// (permitted identifiers, background modes, entitlements, one pending refresh and ten
/// processing requests, `tooManyPendingTaskRequests`, `notPermitted`, `unavailable`), what is
/// due with the scheduler's `Eligibility` (an immediate policy), registrations as the runner
/// does (permitted identifiers, once each, before launch ends but for continued processing).
/// Time is a `VirtualClock`; launches, expiration and grace are real time.
///
/// One scheduler is installed at a time in a process (`BGTaskScheduler.shared` is one object):
/// `install()` waits for the previous one to be uninstalled, so tests that use the kit run one
/// after the other even when the test framework runs them in parallel. Use
/// `withTestScheduler(_:_:)`, which installs and uninstalls around its body.
public final class TestScheduler: @unchecked Sendable {
    /// Why the app is running, as the launch closure's `BGTaskLaunch.role` says.
    public enum Role: Sendable {
        case background, foreground, `extension`

        var abiValue: bgtask_launch_role {
            switch self {
            case .background: BGTASK_ROLE_BACKGROUND.rawValue
            case .foreground: BGTASK_ROLE_FOREGROUND.rawValue
            case .extension: BGTASK_ROLE_EXTENSION.rawValue
            }
        }
    }

    public let app: TestApp
    public let clock: VirtualClock
    /// The app's container for this scheduler's life (a launch's `dataDirectory`): a fresh
    /// temporary directory, removed by `uninstall()`.
    public let containerDirectory: URL

    let lock = NSLock()
    private var _device = TestDevice()
    private var _appRefreshEnabled = true
    private var role: Role = .background
    private var registrations: [String: (bgtask_launch_handler, UnsafeMutableRawPointer?)] = [:]
    private var launchFinished = false
    private var pending: [StoredRequest] = []
    /// The type each identifier was last submitted as, for `start` without one.
    private var submittedTypes: [String: TaskType] = [:]
    var tasks: [UInt64: TaskState] = [:]
    private var unreported: [TestProblem] = []
    private var logLines: [String] = []
    private var appGroupDirectories: [String: UnsafeMutablePointer<CChar>] = [:]
    private var isInstalled = false

    /// The kit's "main queue": launch handlers are called on it one at a time, as the runner
    /// calls them on the main queue (the SDK then hops to the queue the app registered with).
    let launchQueue = DispatchQueue(label: "bgtask.testkit.launch")
    /// Expiration is delivered here, never on a handler's queue, as the runner does.
    let expirationQueue = DispatchQueue(label: "bgtask.testkit.expiration")

    public init(app: TestApp, clock: VirtualClock = VirtualClock()) throws {
        self.app = app
        self.clock = clock
        containerDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-testkit-\(UUID().uuidString)")
        for sub in ["Documents", "Library/Caches", "Library/Application Support", "Library/Preferences", "tmp"] {
            try FileManager.default.createDirectory(at: containerDirectory.appendingPathComponent(sub), withIntermediateDirectories: true)
        }
        for group in app.bundle.appGroups {
            let directory = containerDirectory.appendingPathComponent("groups/\(group)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            appGroupDirectories[group] = strdup(directory.path)
        }
    }

    deinit {
        appGroupDirectories.values.forEach { free($0) }
        for task in tasks.values { task.release() }
    }

    // MARK: Installation

    /// Makes this scheduler the one `BGTaskScheduler.shared` talks to, once any other installed
    /// scheduler is uninstalled.
    public func install() async {
        await InstallationGate.shared.acquire()
        Installation.set(self)
        lock.withLock { isInstalled = true }
        HostConnection.current.attach(api: TestHostTable.table.pointee, host: nil, role: role.abiValue)
        HostConnection.current.observeRepeatedCompletions { taskID, _ in
            Installation.current?.appCompleted(taskID, success: nil)
        }
    }

    /// Detaches this scheduler: `BGTaskScheduler.shared` behaves again as it does outside a
    /// launch (register returns false, submit throws `.unavailable`), and the container is
    /// removed. Tasks still running keep their reports; their calls no longer reach it.
    public func uninstall() {
        let wasInstalled = lock.withLock {
            defer { isInstalled = false }
            return isInstalled
        }
        guard wasInstalled else { return }
        HostConnection.current.detach()
        Installation.set(nil)
        try? FileManager.default.removeItem(at: containerDirectory)
        InstallationGate.shared.release()
    }

    // MARK: The device and the app's switches

    /// The conditions scheduling depends on (power, network, Low Power Mode, Background App
    /// Refresh), as `bgtask device` sets them. Defaults: everything favourable.
    public var device: TestDevice {
        get { lock.withLock { _device } }
        set { lock.withLock { _device = newValue } }
    }

    /// The app's own Background App Refresh switch (Settings, per app).
    public var appRefreshEnabled: Bool {
        get { lock.withLock { _appRefreshEnabled } }
        set { lock.withLock { _appRefreshEnabled = newValue } }
    }

    var appState: AppState {
        var state = AppState(app: app.identifier)
        state.refreshEnabled = _appRefreshEnabled
        return state
    }

    /// Lines the app wrote with `BGTaskPlugin.log`.
    public var log: [String] { lock.withLock { logLines } }

    // MARK: Launching

    /// Runs a plugin's launch closure (`BGTaskPlugin.entry(name:) { launch in … }`, reached
    /// through its entry function, e.g. `bgtaskPluginEntry`) on the main actor, as the runner
    /// does when it launches the app: the closure registers the app's handlers. Its
    /// `BGTaskLaunch` has `role`, the app's identifier, `containerDirectory` as `dataDirectory`,
    /// and `eventJSON`. When it returns the app has finished launching. Throws when the
    /// descriptor is not a bgtask plugin's or the closure throws (the launch fails).
    public func launch(_ entry: () -> UnsafeRawPointer, role: Role = .background, eventJSON: String? = nil) async throws {
        let descriptor: bgtask_plugin
        do {
            descriptor = try bgtask_plugin.read(from: entry(), writtenBy: .plugin)
        } catch {
            throw TestKitError("the entry returned no usable plugin descriptor: \(error)")
        }
        guard descriptor.magic == BGTASK_PLUGIN_MAGIC, descriptor.abi_version == BGTASK_ABI_VERSION, let function = descriptor.launch else {
            throw TestKitError("the entry returned a descriptor that is not a bgtask ABI \(BGTASK_ABI_VERSION) plugin's (magic \(descriptor.magic), ABI \(descriptor.abi_version))")
        }
        lock.withLock { self.role = role }
        let launchID = "testkit-" + String(UUID().uuidString.prefix(8))
        let texts: [String] = [app.identifier, app.bundle.url.path, containerDirectory.path, launchID, role == .foreground ? "foreground" : "simulated"]
        let strings: [UnsafeMutablePointer<CChar>] = texts.map { text in strdup(text) }
        let event: UnsafeMutablePointer<CChar>? = eventJSON.map { text in strdup(text) }
        defer {
            strings.forEach { free($0) }
            event.map { free($0) }
        }
        let info = UnsafeMutablePointer<bgtask_launch_info>.allocate(capacity: 1)
        info.initialize(to: bgtask_launch_info(
            size: UInt32(MemoryLayout<bgtask_launch_info>.size), role: role.abiValue,
            bundle_identifier: strings[0], bundle_path: strings[1], data_directory: strings[2], launch_id: strings[3],
            event_json: event.map { UnsafePointer($0) }, reason: strings[4]))
        defer { info.deallocate() }
        let errorSize = 1024
        let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: errorSize)
        errorBuffer.initialize(repeating: 0, count: errorSize)
        defer { errorBuffer.deallocate() }
        nonisolated(unsafe) let launchInfo = UnsafePointer(info), buffer = errorBuffer, call = function
        nonisolated(unsafe) let table = UnsafePointer(TestHostTable.table)
        // The runner calls the launch function on its main thread; the SDK asserts the main actor.
        let status: Int32 = await MainActor.run { call(table, nil, launchInfo, buffer, errorSize) }
        lock.withLock { launchFinished = true }
        guard status == 0 else {
            throw TestKitError("the launch failed: \(String(cString: errorBuffer))")
        }
    }

    /// Marks the app as finished launching, as returning from the launch closure does: from now
    /// on only continued-processing identifiers may be registered. The first launch of tasks
    /// does it too.
    public func finishLaunching() {
        lock.withLock { launchFinished = true }
    }

    // MARK: Requests

    /// The app's pending requests, dates on the virtual clock.
    public var pendingRequests: [PendingRequest] {
        lock.withLock { pending.map { PendingRequest($0.request) } }
    }

    /// Why `identifier` has not run: the scheduler's blockers in words (as `bgtask why` says
    /// them), or nil when it is not pending. Empty when it is due.
    public func why(_ identifier: String) -> [String]? {
        lock.withLock {
            guard let stored = pending.first(where: { $0.request.identifier == identifier }) else { return nil }
            return eligibility.blockers(for: stored, app: app.bundle, state: appState, appRunning: false)
                .filter(\.blocking).map(\.message)
        }
    }

    private var eligibility: Eligibility {
        Eligibility(policy: .immediate, now: clock.now, conditions: _device.conditions, runningLaunches: 0, maximumConcurrentLaunches: 1)
    }

    // MARK: Running tasks

    /// Launches the app for every pending request that is due on the virtual clock and whose
    /// conditions hold (all in one launch, as the host does), removing them from the pending
    /// requests. Nil when nothing is due.
    public func startDueTasks() -> TestLaunch? {
        let due: [(String, TaskType)] = lock.withLock {
            launchFinished = true
            let rules = eligibility, state = appState
            let due = pending.filter { rules.blockers(for: $0, app: app.bundle, state: state, appRunning: false).allSatisfy { !$0.blocking } }
            pending.removeAll { stored in due.contains { $0.request.identifier == stored.request.identifier } }
            return due.map { ($0.request.identifier, TaskType($0.request.kind)) }
        }
        return due.isEmpty ? nil : startLaunch(due)
    }

    /// Runs what is due (`startDueTasks`) and waits for the launch to end (`TestLaunch.finish`).
    /// An empty report when nothing is due.
    public func runDueTasks(expiringAfter expiry: Duration? = nil, timeout: Duration = .seconds(10),
                            grace: Duration = .seconds(1), settle: Duration = .milliseconds(20)) async -> LaunchReport {
        guard let launch = startDueTasks() else { return LaunchReport(tasks: [], problems: takeProblems()) }
        return await launch.finish(expiringAfter: expiry, timeout: timeout, grace: grace, settle: settle)
    }

    /// Launches the app for `identifier` now, due or not, as the debugger's
    /// `_simulateLaunchForTaskWithIdentifier` and `bgtask simulate-launch --force` do; its
    /// pending request, if any, is taken. The type is the pending request's, else `type`, else
    /// the one it was last submitted as, else the one the Info.plist's background modes allow.
    public func start(_ identifier: String, as type: TaskType? = nil) throws -> TestLaunch {
        let resolved: TaskType = try lock.withLock {
            launchFinished = true
            if let index = pending.firstIndex(where: { $0.request.identifier == identifier }) {
                return TaskType(pending.remove(at: index).request.kind)
            }
            if let type { return type }
            if let known = submittedTypes[identifier] { return known }
            do {
                return TaskType(try app.bundle.inferredKind(of: identifier))
            } catch {
                throw TestKitError("the type of '\(identifier)' is not known (no pending request, none submitted before, and the Info.plist does not decide it): pass `as:` (\(error))")
            }
        }
        return startLaunch([(identifier, resolved)])
    }

    /// Runs `identifier` now (`start`) and waits for its launch to end; `expiringAfter` expires
    /// it that long (real time) after its handler was called.
    public func run(_ identifier: String, as type: TaskType? = nil, expiringAfter expiry: Duration? = nil,
                    timeout: Duration = .seconds(10), grace: Duration = .seconds(1),
                    settle: Duration = .milliseconds(20)) async throws -> TaskReport {
        let report = try await start(identifier, as: type).finish(expiringAfter: expiry, timeout: timeout, grace: grace, settle: settle)
        guard let task = report[identifier] else { throw TestKitError("the launch did not run '\(identifier)'") }
        return task
    }

    /// Problems found outside any launch's report since the last one (registrations, late
    /// completions), taken: they are reported once.
    public func takeProblems() -> [TestProblem] {
        lock.withLock {
            defer { unreported.removeAll() }
            return unreported
        }
    }

    private func startLaunch(_ work: [(String, TaskType)]) -> TestLaunch {
        let states: [TaskState] = lock.withLock {
            work.map { identifier, type in
                let state = TaskState(id: TaskState.nextID(), identifier: identifier, type: type)
                state.registration = registrations[identifier]
                tasks[state.id] = state
                return state
            }
        }
        let launch = TestLaunch(scheduler: self, taskIDs: states.map(\.id))
        for state in states {
            launchQueue.async { [self] in begin(state) }
        }
        return launch
    }

    private func begin(_ state: TaskState) {
        let (registration, expireAtOnce): ((bgtask_launch_handler, UnsafeMutableRawPointer?)?, Bool) = lock.withLock {
            state.began = .now
            return (state.registration, state.expiryRequested)
        }
        guard let (handler, context) = registration else { return }
        handler(context, state.info)
        // Expired before it began (the launch's time ran out): it expires as soon as it has.
        if expireAtOnce { expirationQueue.async { self.deliverExpiration([state.id]) } }
    }

    // MARK: Expiration

    /// Expires every open task of `ids` on the expiration queue (a task not yet begun expires
    /// as soon as it begins), as the runner does when the launch's time runs out.
    func expire(_ ids: [UInt64]) {
        let now: [UInt64] = lock.withLock {
            ids.filter { id in
                guard let state = tasks[id] else { return false }
                state.expiryRequested = true
                return state.began != nil
            }
        }
        expirationQueue.async { self.deliverExpiration(now) }
    }

    private func deliverExpiration(_ ids: [UInt64]) {
        for id in ids {
            let target: (TaskState, (bgtask_expiration_handler, UnsafeMutableRawPointer?)?)? = lock.withLock {
                guard let state = tasks[id], state.registration != nil, state.firstCompletion == nil, !state.expirationDelivered else { return nil }
                state.expirationDelivered = true
                state.expiredAt = .now
                return (state, state.expiration)
            }
            guard let (state, expiration) = target else { continue }
            if let (handler, context) = expiration, handler(context, id) {
                lock.withLock { state.expirationHandled = true }
                continue
            }
            // No expiration handler: the system completes the task unsuccessfully, as on iOS.
            lock.withLock {
                state.expirationHandled = false
                if state.firstCompletion == nil { state.firstCompletion = (false, .now, false) }
            }
        }
    }

    // MARK: Reports

    /// Whether every task of `ids` has ended as far as waiting goes: completed by the app and
    /// quiet for `settle`, expired and out of `grace`, out of `timeout`, or never registered.
    func hasSettled(_ ids: [UInt64], started: ContinuousClock.Instant, timeout: Duration, grace: Duration, settle: Duration) -> Bool {
        let now = ContinuousClock.now
        return lock.withLock {
            ids.allSatisfy { id in
                guard let state = tasks[id] else { return true }
                if state.registration == nil { return true }
                if let last = state.lastAppCall { return now - last >= settle }
                if let expiredAt = state.expiredAt { return now - expiredAt >= grace }
                // An expiration asked for and not yet delivered (it is on the expiration queue):
                // the launch has not ended, however late the test asked. Without this, a test
                // that expires a launch after its timeout has passed (its own thread held up
                // on a loaded machine) got "never completed" instead of its expiration.
                if state.expiryRequested, state.began != nil, state.firstCompletion == nil { return false }
                return now - started >= timeout
            }
        }
    }

    func report(_ ids: [UInt64]) -> LaunchReport {
        lock.withLock {
            let reports = ids.compactMap { id -> TaskReport? in
                guard let state = tasks[id] else { return nil }
                state.reported = true
                return state.report
            }
            let problems = reports.flatMap(\.problems) + unreported
            unreported.removeAll()
            return LaunchReport(tasks: reports, problems: problems)
        }
    }

    // MARK: The host functions (called through TestHostTable)

    func register(_ identifier: String, _ handler: @escaping bgtask_launch_handler, _ context: UnsafeMutableRawPointer?) -> Bool {
        lock.withLock {
            if role == .extension { return false }
            guard app.bundle.permits(identifier) else { return false }
            if registrations[identifier] != nil {
                unreported.append(.registeredTwice(identifier: identifier))
                return false
            }
            if launchFinished && !app.bundle.isContinuedProcessingIdentifier(identifier) {
                unreported.append(.registeredAfterLaunch(identifier: identifier))
                return false
            }
            registrations[identifier] = (handler, context)
            return true
        }
    }

    func setExpirationHandler(_ task: UInt64, _ handler: bgtask_expiration_handler?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { tasks[task]?.expiration = handler.map { ($0, context) } }
    }

    /// An app's `setTaskCompleted`: the first arrives through the table (`success` given), the
    /// others through the SDK's repeated-completion observer.
    func appCompleted(_ task: UInt64, success: Bool?) {
        lock.withLock {
            guard let state = tasks[task] else { return }
            state.appCalls += 1
            state.lastAppCall = .now
            if state.firstCompletion == nil { state.firstCompletion = (success ?? false, .now, true) }
            if state.reported {
                unreported.append(.completedAfterLaunchEnded(identifier: state.identifier, calls: state.appCalls))
            }
        }
    }

    func submit(_ request: TaskRequest) -> SubmissionRules.Rejection? {
        var shifted = request
        shifted.earliestBeginDate = request.earliestBeginDate.map { $0 + clock.offsetFromRealTime }
        return lock.withLock {
            let conditions = _device.conditions
            if let rejection = SubmissionRules.deviceSwitches(shifted, conditions) ?? SubmissionRules.appSwitch(shifted, state: appState) {
                return rejection
            }
            if let rejection = SubmissionRules.check(shifted, app: app.bundle, pending: pending.map(\.request),
                                                     supportedResources: conditions.supportedResources, now: clock.now) {
                return rejection
            }
            submittedTypes[shifted.identifier] = TaskType(shifted.kind)
            pending.removeAll { $0.request.identifier == shifted.identifier }
            pending.append(StoredRequest(app: app.identifier, request: shifted, submittedAt: clock.now))
            return nil
        }
    }

    func cancel(_ identifier: String?) {
        lock.withLock { pending.removeAll { identifier == nil || $0.request.identifier == identifier } }
    }

    /// The pending requests with their dates moved back onto the app's (real) clock.
    func pendingForApp() -> [TaskRequest] {
        let offset = clock.offsetFromRealTime
        return lock.withLock {
            pending.map {
                var request = $0.request
                request.earliestBeginDate = request.earliestBeginDate.map { $0 - offset }
                return request
            }
        }
    }

    func appendLog(_ line: String) { lock.withLock { logLines.append(line) } }

    func updateProgress(_ task: UInt64, completed: Int64, total: Int64) {
        lock.withLock { tasks[task]?.progress = (completed, total) }
    }

    func updateTitle(_ task: UInt64, title: String, subtitle: String) {
        lock.withLock { tasks[task]?.title = (title, subtitle) }
    }

    /// The latest progress and text a continued-processing task with `identifier` reported.
    public func progress(of identifier: String) -> (completed: Int64, total: Int64, title: String?, subtitle: String?)? {
        lock.withLock {
            guard let state = tasks.values.filter({ $0.identifier == identifier }).max(by: { $0.id < $1.id }),
                  state.progress != nil || state.title != nil else { return nil }
            return (state.progress?.0 ?? 0, state.progress?.1 ?? 0, state.title?.0, state.title?.1)
        }
    }

    var supportedResources: UInt32 { lock.withLock { _device.conditions.supportedResources } }

    func appGroupContainer(_ group: String) -> UnsafePointer<CChar>? {
        lock.withLock { appGroupDirectories[group].map { UnsafePointer($0) } }
    }
}

/// Runs `body` with a test scheduler for `app` installed, uninstalling it however `body`
/// ends. Problems found outside any launch report (a handler registered twice or after launch,
/// a completion after its launch ended) that `body` did not take are thrown at the end.
public func withTestScheduler<R>(
    _ app: TestApp,
    clock: VirtualClock = VirtualClock(),
    isolation: isolated (any Actor)? = #isolation,
    _ body: (TestScheduler) async throws -> R
) async throws -> R {
    let scheduler = try TestScheduler(app: app, clock: clock)
    await scheduler.install()
    let result: R
    do {
        result = try await body(scheduler)
    } catch {
        scheduler.uninstall()
        throw error
    }
    scheduler.uninstall()
    let problems = scheduler.takeProblems()
    if !problems.isEmpty { throw TestKitFailure(problems: problems, context: "the test scheduler") }
    return result
}

/// The conditions the scheduler decides by; `bgtask device`'s switches.
public struct TestDevice: Sendable, Equatable {
    public var externalPower = true
    public var network = true
    public var idle = true
    public var lowPowerMode = false
    /// The device's Background App Refresh switch.
    public var backgroundAppRefresh = true
    /// Whether `BGTaskScheduler.supportedResources` includes the GPU.
    public var gpu = false

    public init() {}

    var conditions: DeviceConditions {
        DeviceConditions(externalPower: externalPower, network: network, idle: idle, lowPowerMode: lowPowerMode,
                         backgroundRefresh: backgroundAppRefresh, supportedResources: gpu ? BGTASK_RESOURCE_GPU : 0)
    }
}

/// A pending request as the scheduler keeps it (dates on the virtual clock).
public struct PendingRequest: Sendable, Equatable {
    public var identifier: String
    public var type: TaskType
    public var earliestBeginDate: Date?
    public var requiresNetworkConnectivity: Bool
    public var requiresExternalPower: Bool

    init(_ request: TaskRequest) {
        identifier = request.identifier
        type = TaskType(request.kind)
        earliestBeginDate = request.earliestBeginDate.map(Date.init(timeIntervalSince1970:))
        requiresNetworkConnectivity = request.requiresNetworkConnectivity
        requiresExternalPower = request.requiresExternalPower
    }
}

extension TaskType {
    init(_ kind: TaskKind) {
        self = switch kind {
        case .refresh: .refresh
        case .processing: .processing
        case .healthResearch: .healthResearch
        case .continuedProcessing: .continuedProcessing
        }
    }

    var kind: TaskKind {
        switch self {
        case .refresh: .refresh
        case .processing: .processing
        case .healthResearch: .healthResearch
        case .continuedProcessing: .continuedProcessing
        }
    }
}

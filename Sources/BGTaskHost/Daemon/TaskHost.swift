import BGTaskSystem
import BGTaskModel
import Dispatch
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// The host daemon: watches the plugin directory, keeps every request durable, decides when to
/// launch each app, supervises launches, and answers the control socket. It never loads plugin
/// code.
///
/// All mutable state is owned by `queue` (a serial queue); control connections and launch
/// threads hop onto it. The store is thread-safe on its own.
public final class TaskHost: @unchecked Sendable {
    public struct Configuration: Sendable {
        public var pluginsDirectory: URL
        public var stateDirectory: URL
        public var policy: SchedulingPolicy = .immediate
        public var clock: HostClock.Mode = .real
        public var maximumConcurrentLaunches = 2
        /// Overrides of the per-type defaults, for every launch.
        public var budget: Duration?
        public var grace: Duration?
        public var memoryLimitBytes: UInt64?
        public var cgroupRoot: URL?
        /// Each launch's `pids.max` under `cgroupRoot`; nil for none.
        public var processLimit: Int? = LaunchSupervisor.defaultProcessLimit
        public var runnerPath: String = LaunchSupervisor.defaultRunnerPath()
        /// Fork launches from a pre-warmed zygote (the fast path), or spawn the runner each time.
        public var useZygote = true
        /// Confine launches (see LaunchSupervisor.confine).
        public var confine = true
        /// How often device conditions are re-read while something depends on them.
        public var conditionsInterval: Duration = .seconds(1)
        /// Continued-processing tasks that may run at once, over all apps.
        public var maximumContinuedTasks = 2
        /// A continued-processing task whose progress does not change for this long is expired.
        public var progressStallInterval: Duration = .seconds(60)
        /// How long an opened app stays in the foreground after its launch entry returns (the
        /// time a user looks at it); then it leaves, and its process ends with its last task.
        public var foregroundStay: Duration = .seconds(1)
        /// Ended launches (with their run records) kept per app: when a launch ends, its app's
        /// older ended launches are deleted. Running launches are never deleted.
        public var historyPerApp = 1000
        /// Control connections at once, and the deadlines of a request and of an idle connection.
        public var controlLimits = ControlServer.Limits()
        /// A launch's log beyond this many bytes is read and discarded (its record says so).
        public var logLimitBytes: UInt64 = LaunchLimits.defaultLogLimitBytes
        /// Free space kept on the containers' filesystem (see LaunchLimits.diskReserveBytes).
        public var diskReserveBytes: UInt64 = LaunchLimits.defaultDiskReserveBytes

        public init(pluginsDirectory: URL, stateDirectory: URL) {
            self.pluginsDirectory = pluginsDirectory
            self.stateDirectory = stateDirectory
        }
    }

    struct RunningLaunch {
        var id: String
        var app: String
        var reason: String
        var tasks: [TaskAssignment]
        var requests: [String: TaskRequest]
        var control: LaunchControl
        var expiredTasks: Set<UInt64> = []
        var waiters: [DispatchSemaphore] = []
        var role: LaunchRole = .background
        /// The launch entry returned.
        var launched = false
        /// Foreground launches: told that no more tasks will come.
        var closed = false
        /// Foreground launches: in the foreground until then.
        var staysUntil: Date?
        var nextTaskID: UInt64 = 1
    }

    public let configuration: Configuration
    let store: PendingRequestStore
    let clock: HostClock
    let logger: Logger
    private var supervisor: LaunchSupervisor
    private let queue = DispatchQueue(label: "bgtask.host")
    private var catalog = PluginCatalog()
    private var running: [String: RunningLaunch] = [:]
    private var finishedRecords: [String: RunRecord] = [:]
    /// Continued-processing tasks: running, queued, their progress (on `queue`).
    private var continued: ContinuedProcessing
    /// Apps whose last launch could not be started, and when to try again (real time).
    private var retryAfter: [String: Date] = [:]
    static let startFailureBackoff: TimeInterval = 30
    private var stallTimer: DispatchSourceTimer?
    private var shuttingDown = false
    private var dueTimer: DispatchSourceTimer?
    private var conditionsTimer: DispatchSourceTimer?
    private var lastConditions: DeviceConditions?
    private let unlockLock = NSLock()
    /// Read from control and launch threads, written on `queue`: behind `unlockLock`.
    private var unlockedSinceBootValue = true
    private var unlockedSinceBoot: Bool {
        get { unlockLock.withLock { unlockedSinceBootValue } }
        set { unlockLock.withLock { unlockedSinceBootValue = newValue } }
    }
    private var server: ControlServer?
    private var watcher: PluginDirectoryWatcher?
    private var signalSources: [DispatchSourceSignal] = []
    private let stopped = DispatchSemaphore(value: 0)
    private let machine = MachineConditionsReader()
    /// `STATE/bgtask.lock`, held for the host's life: one host per state directory.
    private let lock: StateDirectory.Lock

    public init(configuration: Configuration, logger: Logger) throws(BGTaskError) {
        self.configuration = configuration
        self.logger = logger
        continued = ContinuedProcessing(slots: configuration.maximumContinuedTasks, stallInterval: configuration.progressStallInterval.timeInterval)
        if let warning = try StateDirectory.prepare(configuration.stateDirectory) { logger.warning("\(warning)") }
        lock = try StateDirectory.Lock(configuration.stateDirectory)
        store = try PendingRequestStore(directory: configuration.stateDirectory)
        clock = try HostClock(mode: configuration.clock, store: store)
        if let reason = clock.resetReason { logger.warning("virtual clock reset: \(reason)") }
        supervisor = LaunchSupervisor(runnerPath: configuration.runnerPath, logger: logger)
        supervisor.cgroupRoot = configuration.cgroupRoot
        supervisor.processLimit = configuration.processLimit
        if configuration.useZygote { supervisor.zygote = Zygote(runnerPath: configuration.runnerPath, logger: logger, confine: configuration.confine) }
        supervisor.confine = configuration.confine
        if configuration.confine && geteuid() == 0 { supervisor.identities = AppIdentities(stateDirectory: configuration.stateDirectory) }
        unlockedSinceBoot = (try? store.setting("device.locked")) != "on"
    }

    // MARK: Life cycle

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully: running launches are expired,
    /// killed after their grace if need be, and recorded.
    public func run() throws(BGTaskError) {
        try start()
        for signalNumber in [SIGINT, SIGTERM] {
            signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: queue)
            source.setEventHandler { [self] in
                logger.info("signal received: shutting down", metadata: ["signal": "\(signalNumber)"])
                beginShutdown()
            }
            source.resume()
            signalSources.append(source)
        }
        stopped.wait()
    }

    /// Starts serving without blocking (tests drive a host this way too).
    public func start() throws(BGTaskError) {
        // A peer that closes its end (a control client, a FIFO a launch left where the host
        // writes) is EPIPE for the call, never a signal that kills the host. Launches start
        // with every signal at its default (posix_spawn's SETSIGDEF; the zygote's spares reset
        // theirs), so they do not inherit this.
        signal(SIGPIPE, SIG_IGN)
        // Every child this process adopts (a killed launch's orphans and zombies) is its own to
        // reap: nothing else here starts processes.
        LaunchSupervisor.adoptsEveryChild = true
        try recoverInterruptedLaunches()
        catalog = PluginCatalog.scan(configuration.pluginsDirectory)
        logCatalog()
        let server = try ControlServer(
            path: configuration.stateDirectory.appendingPathComponent("control.sock").path, logger: logger
        ) { [weak self] request, peer in
            guard let self else { return .failure(.unavailable, "the host is stopping") }
            return self.handle(request, peer: peer)
        } batch: { [weak self] requests, peer in
            guard let self else { return requests.map { _ in .failure(.unavailable, "the host is stopping") } }
            return self.handle(requests, peer: peer)
        }
        self.server = server
        server.limits = configuration.controlLimits
        server.start()
        if FileManager.default.fileExists(atPath: configuration.pluginsDirectory.path) {
            watcher = try PluginDirectoryWatcher(directory: configuration.pluginsDirectory) { [weak self] in
                guard let self else { return }
                self.queue.async { self.rescanPlugins() }
            }
        } else {
            logger.warning("the plugin directory does not exist; not watching it", metadata: ["path": "\(configuration.pluginsDirectory.path)"])
        }
        logger.info("host started", metadata: [
            "plugins": "\(configuration.pluginsDirectory.path)", "state": "\(configuration.stateDirectory.path)",
            "policy": "\(configuration.policy.rawValue)", "clock": "\(configuration.clock.rawValue)",
        ])
        queue.async { self.evaluate() }
    }

    /// Begins a graceful shutdown; `run()` returns when it is complete.
    public func beginShutdown() {
        queue.async { [self] in
            guard !shuttingDown else { return }
            shuttingDown = true
            dueTimer?.cancel()
            conditionsTimer?.cancel()
            for launch in running.values { launch.control.shutdown(reason: "the host is shutting down") }
            finishShutdownIfIdle()
        }
    }

    private func finishShutdownIfIdle() {
        guard shuttingDown, running.isEmpty else { return }
        watcher?.stop()
        server?.stop()
        supervisor.zygote?.stop()
        logger.info("host stopped")
        stopped.signal()
    }

    /// Blocks until a `start()`ed host has shut down.
    public func waitUntilStopped() { stopped.wait() }

    // MARK: Recovery

    /// Launches the store says were running belong to a host that died: kill what is left of
    /// them, record them as `host-lost`, and make their requests pending again.
    private func recoverInterruptedLaunches() throws(BGTaskError) {
        for launch in try store.interruptedLaunches() {
            var detail = "the host stopped during the launch"
            if let pid = launch.pid, ProcessTree.launchID(of: pid) == launch.launchID {
                ProcessTree.killTree(pid)
                detail += "; its runner (pid \(pid)) was still running and has been killed"
            }
            let logPath = configuration.stateDirectory.appendingPathComponent("logs/\(launch.launchID).log").path
            let log = access(logPath, F_OK) == 0 ? logPath : nil
            let bundlePath = configuration.pluginsDirectory.appendingPathComponent("?").path
            removeLogs(of: try store.recoverInterruptedLaunch(.hostLost(launch, bundlePath: bundlePath, log: log, detail: detail),
                                                              keepHistory: configuration.historyPerApp))
            logger.warning("recovered a launch interrupted by a host crash", metadata: ["launch.id": "\(launch.launchID)", "bundle.id": "\(launch.app)"])
        }
    }

    // MARK: Catalog

    private func rescanPlugins() {
        let old = catalog
        catalog = PluginCatalog.scan(configuration.pluginsDirectory)
        for (identifier, _) in old.apps where catalog.apps[identifier] == nil {
            let dropped = (try? store.removeApp(identifier)) ?? 0
            logger.info("bundle removed; its pending requests are dropped", metadata: ["bundle.id": "\(identifier)", "dropped": "\(dropped)"])
        }
        for (identifier, bundle) in catalog.apps where old.apps[identifier] != bundle {
            logger.info("bundle loaded", metadata: ["bundle.id": "\(identifier)", "path": "\(bundle.url.path)"])
        }
        for (path, error) in catalog.invalid where old.invalid[path] != error {
            logger.error("invalid bundle skipped", metadata: ["path": "\(path)", "error": "\(error)"])
        }
        evaluate()
    }

    private func logCatalog() {
        for (identifier, bundle) in catalog.apps.sorted(by: { $0.key < $1.key }) {
            logger.info("bundle loaded", metadata: ["bundle.id": "\(identifier)", "path": "\(bundle.url.path)"])
        }
        for (path, error) in catalog.invalid.sorted(by: { $0.key < $1.key }) {
            logger.error("invalid bundle skipped", metadata: ["path": "\(path)", "error": "\(error)"])
        }
    }

    // MARK: Conditions

    /// The device conditions, read at most every 100 ms (a burst of submissions must not
    /// re-read /sys and the settings for each one); `device` invalidates the cache.
    func conditions() -> DeviceConditions {
        if let (at, cached) = conditionsCache.withLock({ $0 }), bgtask_monotonic_ns() < at + 100_000_000 { return cached }
        var overrides: [String: String] = [:]
        for key in DeviceOverrides.keys {
            if let value = try? store.setting("device.\(key)") { overrides[key] = value }
        }
        let fresh = DeviceOverrides.resolve(overrides: overrides, machine: machine, unlockedSinceBoot: unlockedSinceBoot)
        conditionsCache.withLock { $0 = (bgtask_monotonic_ns(), fresh) }
        return fresh
    }

    private let conditionsCache = LockedValue<(UInt64, DeviceConditions)?>(nil)

    /// Expires running tasks whose conditions no longer hold: processing tasks that require
    /// power when power goes away, and processing tasks when the device stops being idle.
    private func enforceConditions(_ conditions: DeviceConditions) {
        for (id, launch) in running {
            for task in launch.tasks where !launch.expiredTasks.contains(task.task) {
                guard let request = launch.requests[task.identifier] else { continue }
                var reason: String?
                if task.kind == .processing || task.kind == .healthResearch {
                    if !conditions.idle { reason = "the device is no longer idle" }
                    if request.requiresExternalPower && !conditions.externalPower { reason = "external power was lost" }
                    if request.requiresNetworkConnectivity && !conditions.network { reason = "network connectivity was lost" }
                }
                if let reason {
                    running[id]?.expiredTasks.insert(task.task)
                    launch.control.expire(task: task.task, reason: reason)
                    logger.info("expiring a task: \(reason)", metadata: ["launch.id": "\(id)", "task.id": "\(task.identifier)"])
                }
            }
        }
    }

    // MARK: Scheduling

    private func eligibility(_ conditions: DeviceConditions) -> Eligibility {
        Eligibility(policy: configuration.policy, now: clock.now, conditions: conditions,
                    runningLaunches: running.count, maximumConcurrentLaunches: configuration.maximumConcurrentLaunches)
    }

    /// Starts every launch that may start now, then arms the timers for the next decision.
    /// On `queue`.
    private func evaluate() {
        guard !shuttingDown else { return }
        let conditions = self.conditions()
        if conditions.locked == false { unlockedSinceBoot = true }
        enforceConditions(conditions)
        lastConditions = conditions
        // A running processing task is expired when the device stops being idle or loses the
        // power or network it requires: conditions are watched while one runs.
        var watchConditions = running.values.contains { $0.tasks.contains { $0.kind == .processing || $0.kind == .healthResearch } }
        var wakeAt: Date?
        let realNow = Date()
        retryAfter = retryAfter.filter { $0.value > realNow }
        do {
            let decision = try Scheduler(eligibility: eligibility(conditions)).decide(
                from: store, catalog: catalog.apps, running: Set(running.values.map(\.app)),
                runningCount: running.count, maximumLaunches: configuration.maximumConcurrentLaunches,
                backingOff: { retryAfter[$0] != nil })
            for (bundle, requests) in decision.launches { startLaunch(bundle, requests: requests, reason: .scheduled) }
            wakeAt = decision.wakeAt
            watchConditions = watchConditions || decision.watchConditions
        } catch {
            logger.error("scheduling failed", metadata: ["error": "\(error)"])
        }
        armDueTimer(wakeAt)
        armConditionsTimer(watchConditions)
    }

    private func armDueTimer(_ date: Date?) {
        dueTimer?.cancel()
        dueTimer = nil
        // The virtual clock moves only when told to; nothing to wait for in real time.
        guard let date, clock.mode == .real else { return }
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(wallDeadline: .now() + max(0, date.timeIntervalSinceNow) + 0.001)
        timer.setEventHandler { [weak self] in self?.evaluate() }
        timer.resume()
        dueTimer = timer
    }

    /// Device conditions have no change notification we can rely on everywhere, so they are
    /// re-read periodically, but only while something depends on them.
    private func armConditionsTimer(_ needed: Bool) {
        guard needed else {
            conditionsTimer?.cancel()
            conditionsTimer = nil
            return
        }
        guard conditionsTimer == nil else { return }
        let timer = DispatchSource.makeTimerSource(queue: queue)
        let interval = configuration.conditionsInterval.timeInterval
        timer.schedule(deadline: .now() + interval, repeating: interval)
        timer.setEventHandler { [weak self] in
            guard let self else { return }
            if self.conditions() != self.lastConditions { self.evaluate() }
        }
        timer.resume()
        conditionsTimer = timer
    }

    // MARK: Launches

    /// Starts one launch of `bundle` running `requests` (or `forced` tasks). On `queue`.
    @discardableResult
    private func startLaunch(_ bundle: PluginBundle, requests: [StoredRequest], forced: [TaskAssignment] = [], reason: LaunchReason,
                             role: LaunchRole = .background, eventJSON: String? = nil) -> String {
        let tasks = forced.isEmpty
            ? requests.enumerated().map { TaskAssignment(task: UInt64($0.offset + 1), identifier: $0.element.request.identifier, kind: $0.element.request.kind) }
            : forced
        var limits = LaunchLimits.defaults(for: role == .foreground ? [.continuedProcessing] : tasks.map(\.kind))
        if let budget = configuration.budget { limits.budget = budget }
        if let grace = configuration.grace { limits.grace = grace }
        if let memory = configuration.memoryLimitBytes { limits.memoryLimitBytes = memory }
        limits.logLimitBytes = configuration.logLimitBytes
        limits.diskReserveBytes = configuration.diskReserveBytes
        let launchID = LaunchPlan.newLaunchID()
        var plan = LaunchPlan(
            bundle: bundle, tasks: tasks, role: role, reason: reason, limits: limits, launchID: launchID,
            dataDirectory: configuration.stateDirectory.appendingPathComponent("containers/\(bundle.identifier)"),
            logFile: configuration.stateDirectory.appendingPathComponent("logs/\(launchID).log"), eventJSON: eventJSON)
        plan.supportedResources = conditions().supportedResources
        let control = LaunchControl()
        let store = self.store
        control.onStart = { pid in try? store.setLaunchPID(id: launchID, pid: pid) }
        do {
            // Records carry real time (the virtual clock only steers scheduling decisions).
            try store.beginLaunch(id: launchID, app: bundle.identifier, reason: reason.rawValue, tasks: tasks, at: Date())
        } catch {
            logger.error("cannot record a launch; not starting it", metadata: ["bundle.id": "\(bundle.identifier)", "error": "\(error)"])
            return launchID
        }
        control.onEvent = { [weak self] event in
            guard let self else { return }
            self.queue.async { self.launchEvent(launchID, event) }
        }
        running[launchID] = RunningLaunch(
            id: launchID, app: bundle.identifier, reason: reason.rawValue, tasks: tasks,
            requests: Dictionary(requests.map { ($0.request.identifier, $0.request) }, uniquingKeysWith: { a, _ in a }),
            control: control, role: role, nextTaskID: UInt64(tasks.count + 1))
        logger.info("launching", metadata: ["launch.id": "\(launchID)", "bundle.id": "\(bundle.identifier)", "reason": "\(reason)",
                                          "tasks": "\(tasks.map(\.identifier).joined(separator: ","))"])
        let supervisor = self.supervisor
        let broker = HostRequestBroker(host: self, launchID: launchID)
        let thread = Thread { [weak self, plan] in
            let record: RunRecord
            do {
                record = try supervisor.run(plan, broker: broker, control: control)
            } catch let error as BGTaskError {
                record = .notStarted(plan, error: error)
            } catch {
                record = .notStarted(plan, error: BGTaskError(.launch, "\(error)"))
            }
            guard let self else { return }
            self.queue.async { self.launchEnded(record) }
        }
        thread.name = "bgtask.launch.\(launchID)"
        thread.start()
        return launchID
    }

    /// The logs of launches pruned from the history go with them (`logs/LAUNCH_ID.log`).
    private func removeLogs(of launchIDs: [String]) {
        let logs = configuration.stateDirectory.appendingPathComponent("logs")
        for id in launchIDs { unlink(logs.appendingPathComponent("\(id).log").path) }
    }

    private func launchEnded(_ record: RunRecord) {
        if record.pid == 0 && record.termination == .launchFailed {
            // The host could not start the child (runner missing, out of descriptors): not the
            // app's fault. Its requests stay pending, and the app is retried after a pause.
            do { removeLogs(of: try store.recoverInterruptedLaunch(record, keepHistory: configuration.historyPerApp)) } catch {
                logger.error("cannot record a launch that failed to start", metadata: ["launch.id": "\(record.launchID)", "error": "\(error)"])
            }
            retryAfter[record.app] = Date().addingTimeInterval(Self.startFailureBackoff)
            queue.asyncAfter(deadline: .now() + Self.startFailureBackoff + 0.01) { [weak self] in self?.evaluate() }
            logger.error("could not start a launch; retrying later", metadata: ["bundle.id": "\(record.app)", "error": "\(record.error ?? "")"])
            let waiters = running.removeValue(forKey: record.launchID)?.waiters ?? []
            if !waiters.isEmpty { finishedRecords[record.launchID] = record }
            for waiter in waiters { waiter.signal() }
            if shuttingDown { finishShutdownIfIdle() } else { evaluate() }
            return
        }
        do {
            removeLogs(of: try store.finishLaunch(record, keepHistory: configuration.historyPerApp))
            var state = try store.appState(record.app)
            state.lastLaunchAt = clock.now
            state.lastLaunchID = record.launchID
            state.lastRegistered = record.termination == .launchFailed ? state.lastRegistered : record.registered
            if SchedulingPolicy.isBad(record) {
                state.penaltyLevel += 1
                state.penaltyUntil = clock.now.addingTimeInterval(SchedulingPolicy.penalty(level: state.penaltyLevel))
            } else if record.termination == .exited {
                state.penaltyLevel = 0
                state.penaltyUntil = nil
            }
            try store.saveAppState(state)
        } catch {
            logger.error("cannot record a finished launch", metadata: ["launch.id": "\(record.launchID)", "error": "\(error)"])
        }
        logger.info("launch ended", metadata: ["launch.id": "\(record.launchID)", "bundle.id": "\(record.app)", "termination": "\(record.termination.rawValue)"])
        let waiters = running.removeValue(forKey: record.launchID)?.waiters ?? []
        // Queued continued-processing requests die with the foreground launch that made them.
        continued.launchEnded(record.launchID, at: Date())
        startQueuedContinued()
        if !waiters.isEmpty { finishedRecords[record.launchID] = record }
        for waiter in waiters { waiter.signal() }
        if shuttingDown { finishShutdownIfIdle() } else { evaluate() }
    }

    // MARK: Submissions

    // Admission: the Background App Refresh switches and Low Power Mode make scheduling
    // unavailable.

    /// The device's part of admission: its Background App Refresh switch and Low Power Mode.
    private func deviceAdmission(_ request: TaskRequest, _ conditions: DeviceConditions) -> SubmissionRules.Rejection? {
        if request.kind != .continuedProcessing && !conditions.backgroundRefresh {
            return .init(status: .unavailable, message: "Background App Refresh is off for the device")
        }
        if request.kind == .refresh && conditions.lowPowerMode {
            return .init(status: .unavailable, message: "Low Power Mode is on: refresh requests are unavailable")
        }
        return nil
    }

    /// The app's part of admission: its own Background App Refresh switch.
    static func appAdmission(_ request: TaskRequest, state: AppState) -> SubmissionRules.Rejection? {
        if request.kind != .continuedProcessing && !state.refreshEnabled {
            return .init(status: .unavailable, message: "Background App Refresh is off for \(state.app)")
        }
        return nil
    }

    func submit(_ request: TaskRequest, app bundle: PluginBundle, fromLaunch launchID: String? = nil) -> SubmissionRules.Rejection? {
        if request.kind == .continuedProcessing { return submitContinued(request, app: bundle, fromLaunch: launchID) }
        return submitAll([(request, bundle)])[0]
    }

    /// Submits requests (not continued-processing ones) in one group commit: the rejection of
    /// each, or nil once it is durable. The app's switch and Apple's per-app rules are checked
    /// inside the store's write transaction, in order, so each sees the ones before it.
    func submitAll(_ items: [(request: TaskRequest, app: PluginBundle)]) -> [SubmissionRules.Rejection?] {
        let conditions = self.conditions()
        let supported = conditions.supportedResources
        let now = clock.now
        var rejections: [SubmissionRules.Rejection?] = Array(repeating: nil, count: items.count)
        var submissions: [PendingRequestStore.Submission] = []
        var positions: [Int] = []
        for (position, (request, bundle)) in items.enumerated() {
            if let rejection = deviceAdmission(request, conditions) {
                rejections[position] = rejection
                continue
            }
            submissions.append(.init(
                app: bundle.identifier, request: request, at: clock.now,
                admit: { Self.appAdmission(request, state: $0) },
                check: { SubmissionRules.check(request, app: bundle, pending: $0, supportedResources: supported, now: now) }))
            positions.append(position)
        }
        var accepted = false
        for (position, outcome) in zip(positions, store.submitAll(submissions)) {
            switch outcome {
            case .success(let rejection):
                rejections[position] = rejection
                if rejection == nil { accepted = true }
            case .failure(let error):
                rejections[position] = .init(status: .unavailable, message: "the host could not store the request: \(error)")
            }
        }
        if accepted { requestEvaluation() }
        return rejections
    }

    /// Queues one `evaluate()` on `queue` unless one is queued already: a burst of submissions
    /// costs one scheduling pass, not one each. Any thread.
    private func requestEvaluation() {
        let first = evaluationQueued.withLock { queued in
            defer { queued = true }
            return !queued
        }
        guard first else { return }
        queue.async {
            // Cleared before the pass: a submission committed during it queues another.
            self.evaluationQueued.withLock { $0 = false }
            self.evaluate()
        }
    }

    private let evaluationQueued = LockedValue(false)

    // MARK: Continued processing

    /// A continued-processing request runs in the foreground launch that submitted it, at once
    /// when a slot is free; otherwise it waits (`.queue`) or is refused (`.fail`).
    func submitContinued(_ request: TaskRequest, app bundle: PluginBundle, fromLaunch launchID: String?) -> SubmissionRules.Rejection? {
        let supported = conditions().supportedResources
        if let rejection = SubmissionRules.check(request, app: bundle, pending: [], supportedResources: supported, now: clock.now) { return rejection }
        return queue.sync {
            guard let launchID, let launch = running[launchID], launch.role == .foreground, !launch.closed else {
                return .init(status: .unavailable, message: "continued-processing requests are submitted from the foreground: open the app (bgtask open \(bundle.identifier)) and submit from it")
            }
            switch continued.admit(request, in: launchID) {
            case .start:
                startContinued(request, in: launchID)
                return nil
            case .queued:
                logger.info("continued-processing request queued", metadata: ["launch.id": "\(launchID)", "task.id": "\(request.identifier)"])
                return nil
            case let .refused(rejection):
                return rejection
            }
        }
    }

    /// On `queue`.
    private func startContinued(_ request: TaskRequest, in launchID: String) {
        guard var launch = running[launchID] else { return }
        let task = TaskAssignment(task: launch.nextTaskID, identifier: request.identifier, kind: .continuedProcessing)
        launch.nextTaskID += 1
        launch.tasks.append(task)
        launch.requests[request.identifier] = request
        continued.started(request, task: task.task, in: launchID, app: launch.app, at: Date())
        running[launchID] = launch
        launch.control.startTask(task)
        logger.info("continued-processing task started", metadata: ["launch.id": "\(launchID)", "task.id": "\(request.identifier)"])
        armStallTimer()
    }

    private func startQueuedContinued() {
        while let next = continued.nextToStart(isRunning: { running[$0] != nil }) {
            startContinued(next.request, in: next.launchID)
        }
    }

    /// On `queue`.
    private func launchEvent(_ launchID: String, _ event: LaunchControl.Event) {
        guard running[launchID] != nil else { return }
        switch event {
        case .launched:
            running[launchID]?.launched = true
            if running[launchID]?.role == .foreground {
                let stay = configuration.foregroundStay.timeInterval
                running[launchID]?.staysUntil = Date().addingTimeInterval(stay)
                queue.asyncAfter(deadline: .now() + stay) { [weak self] in self?.closeIfIdle(launchID) }
            }
        case .taskBegan:
            break
        case .taskEnded(let task):
            if continued.ended(task, in: launchID, at: Date()) { startQueuedContinued() }
        case let .progress(task, completed, total):
            continued.progress(task, in: launchID, completed: completed, total: total, at: Date())
        case let .title(task, title, subtitle):
            continued.title(task, in: launchID, title: title, subtitle: subtitle)
        }
        closeIfIdle(launchID)
    }

    /// A foreground launch whose entry has returned and that has nothing running or queued is
    /// told that no more tasks will come; it then ends.
    private func closeIfIdle(_ launchID: String) {
        guard let launch = running[launchID], launch.role == .foreground, launch.launched, !launch.closed,
              Date() >= launch.staysUntil ?? .distantFuture,
              !continued.holds(launchID) else { return }
        running[launchID]?.closed = true
        launch.control.close()
    }

    /// Expires continued tasks whose progress has not moved for `progressStallInterval`.
    private func armStallTimer() {
        guard stallTimer == nil else { return }
        let stall = configuration.progressStallInterval.timeInterval
        let period = max(0.05, min(1, stall / 4))
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + period, repeating: period)
        timer.setEventHandler { [weak self] in
            guard let self else { return }
            for (id, status) in self.continued.stalled(at: Date()) {
                self.running[id]?.control.expire(task: status.task, reason: "progress stalled")
                self.logger.info("expiring a continued-processing task: its progress stalled", metadata: ["launch.id": "\(id)", "task.id": "\(status.identifier)"])
            }
            if self.continued.isEmpty {
                self.stallTimer?.cancel()
                self.stallTimer = nil
            }
        }
        timer.resume()
        stallTimer = timer
    }

    /// Registers a waiter for a launch just started (on `queue`).
    private func waiter(for id: String) -> DispatchSemaphore {
        let semaphore = DispatchSemaphore(value: 0)
        running[id]?.waiters.append(semaphore)
        if running[id] == nil { semaphore.signal() }
        return semaphore
    }

    /// The response for a started launch: its id, and with `wait` its record once it ends
    /// (blocking the calling control thread, never `queue`).
    private func launched(_ id: String, _ semaphore: DispatchSemaphore, wait: Bool) -> ControlResponse {
        var response = ControlResponse()
        response.launchID = id
        guard wait else { return response }
        semaphore.wait()
        response.record = queue.sync { finishedRecords.removeValue(forKey: id) }
        return response
    }

    /// Launches a client may start by hand (`open`, `extension-run`) running at once: past it,
    /// `too-many-launches`. Each is a process; without a cap any client could start any number.
    var maximumClientLaunches: Int { max(8, 4 * configuration.maximumConcurrentLaunches) }

    /// The refusal of one more client-started launch, or nil. Call on `queue`.
    private func clientLaunchRefusal() -> ControlResponse? {
        let started = running.values.filter { $0.role == .foreground || $0.role == .extension }.count
        guard started >= maximumClientLaunches else { return nil }
        return .failure(.tooManyLaunches, "\(started) opened apps and extensions are running, the most at once (4 × --max-launches, at least 8); try again when one ends")
    }

    /// The most an `open` or extension event may hold: it travels in the launch's start
    /// message, whose frame (256 KiB) also carries the bundle's permitted identifiers.
    static let maximumEventBytes = 64 * 1024

    /// The refusal of an event too large to hand a launch, or nil.
    private static func eventRefusal(_ event: String?) -> ControlResponse? {
        guard let event, event.utf8.count > maximumEventBytes else { return nil }
        return .failure(.tooLarge, "the event is \(event.utf8.count) bytes, over the limit of \(maximumEventBytes)")
    }

    private func open(_ request: ControlRequest) -> ControlResponse {
        guard let app = request.app else { return .failure(.badRequest, "open needs an app") }
        if let refusal = Self.eventRefusal(request.event) { return refusal }
        enum Outcome { case started(String, DispatchSemaphore), refused(ControlResponse), notFound }
        let outcome = queue.sync { () -> Outcome in
            guard !shuttingDown, let bundle = catalog.apps[app] else { return .notFound }
            if let refusal = clientLaunchRefusal() { return .refused(refusal) }
            let id = startLaunch(bundle, requests: [], reason: .foreground, role: .foreground, eventJSON: request.event)
            return .started(id, waiter(for: id))
        }
        switch outcome {
        case .notFound:
            return .failure(.notFound, "no valid bundle with identifier \(app) is in \(configuration.pluginsDirectory.path)")
        case let .refused(response):
            return response
        case let .started(id, semaphore):
            return launched(id, semaphore, wait: request.wait == true)
        }
    }

    private func cancelTask(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "cancel-task needs a task identifier") }
        return queue.sync {
            var response = ControlResponse()
            switch continued.cancel(identifier) {
            case let .running(id, task)?:
                running[id]?.control.expire(task: task, reason: "cancelled by the user")
                response.launchID = id
            case let .dequeued(id)?:
                closeIfIdle(id)
                response.launchID = id
            case nil:
                return .failure(.notFound, "no continued-processing task \(identifier) is running or queued")
            }
            return response
        }
    }

    // MARK: Control

    func handle(_ request: ControlRequest, peer: PeerCredentials) -> ControlResponse {
        guard let verb = request.knownVerb else {
            return .failure(.unknownVerb, "unknown verb '\(ControlServer.quoted(request.verb))'")
        }
        switch verb {
        case .status: return ControlResponse()
        case .apps: return apps(request)
        case .submit: return controlSubmit([request])[0]
        case .pending:
            return respond { var r = ControlResponse(); r.pending = try store.pending(app: request.app); return r }
        case .cancel, .cancelAll:
            guard let app = request.app else { return .failure(.badRequest, "\(verb.rawValue) needs an app") }
            if verb == .cancel && request.identifier == nil { return .failure(.badRequest, "cancel needs a task identifier") }
            return respond {
                var r = ControlResponse()
                r.removed = try store.cancel(app: app, identifier: verb == .cancel ? request.identifier : nil)
                return r
            }
        case .history:
            return respond {
                var r = ControlResponse()
                let (records, omitted) = Self.fitting(try store.history(app: request.app, limit: request.limit ?? 50))
                r.records = records
                if omitted > 0 { (r.truncated, r.omitted) = (true, omitted) }
                return r
            }
        case .why: return why(request)
        case .device: return device(request)
        case .clock: return clockVerb(request)
        case .simulateLaunch: return simulateLaunch(request)
        case .simulateExpire: return simulateExpire(request)
        case .extensionRun: return runExtension(request)
        case .open: return open(request)
        case .cancelTask: return cancelTask(request)
        case .progress:
            return queue.sync {
                var response = ControlResponse()
                response.continued = continued.statuses(at: Date())
                return response
            }
        }
    }

    private func respond(_ body: () throws -> ControlResponse) -> ControlResponse {
        do { return try body() } catch { return .failure(.internalError, "\(error)") }
    }

    /// A page of `apps` stops before its estimated JSON passes this, so that it fits a control
    /// frame whatever the apps hold (long paths, many permitted identifiers: an app's own size
    /// is bounded by validation, see `BundleReader.Limits`).
    static let appsPageBytes = ControlFrame.maximumPayload / 2

    /// Room for the records of a `history` answer: the frame less room for the rest of it.
    static let historyBytes = ControlFrame.maximumPayload - 64 * 1024

    /// `records` (newest first) as many as fit `budget` bytes of the control protocol's JSON,
    /// in order, and how many were left out: the oldest that did not fit, and any record too
    /// large by itself (so that no launch's record can make another app's history unanswerable).
    static func fitting(_ records: [RunRecord], budget: Int = historyBytes) -> ([RunRecord], omitted: Int) {
        let encoder = JSONEncoder.control
        var kept: [RunRecord] = []
        var bytes = 0
        for record in records {
            let size = ((try? encoder.encode(record))?.count ?? budget) + 1
            if size > budget { continue }
            if bytes + size > budget { break }
            bytes += size
            kept.append(record)
        }
        return (kept, records.count - kept.count)
    }

    /// An upper estimate of an app's JSON in an `apps` answer: its strings, doubled for
    /// escapes (JSONEncoder writes `/` as `\/`), and room for the keys and the fixed fields.
    static func estimatedBytes(_ bundle: PluginBundle, running: String?) -> Int {
        var strings: [String] = [bundle.identifier, bundle.url.path, running ?? ""]
        strings += bundle.permittedIdentifiers
        strings += bundle.backgroundModes
        strings += bundle.extensions.map(\.identifier)
        return 256 + strings.reduce(0) { $0 + 2 * $1.utf8.count + 3 }
    }

    /// The catalog sorted by identifier, with per-app state: every app, or (with `limit` or
    /// `after`) one page of at most `limit` apps after `after`, with `next` set when more
    /// follow. Two indexed store queries whatever the number of requests; invalid bundles come
    /// with the first page.
    private func apps(_ request: ControlRequest) -> ControlResponse {
        if let limit = request.limit, limit < 1 { return .failure(.badRequest, "apps: limit must be at least 1, not \(limit)") }
        let paged = request.limit != nil || request.after != nil
        var omittedInvalid = 0
        // The catalog and the running launches are the queue's; the store is read off it.
        let (page, runningByApp, invalid, next) = queue.sync { () -> ([PluginBundle], [String: String], [InvalidBundle]?, String?) in
            var runningByApp: [String: String] = [:]
            for launch in running.values where runningByApp[launch.app] == nil { runningByApp[launch.app] = launch.id }
            var bundles = Array(catalog.apps.values)
            if let after = request.after { bundles.removeAll { $0.identifier <= after } }
            bundles.sort { $0.identifier < $1.identifier }
            // Invalid bundles (with the first page) take half a page at most; the rest are
            // counted (`omitted`).
            var invalid: [InvalidBundle]?
            var bytes = 0
            if request.after == nil {
                invalid = []
                for (path, error) in catalog.invalid.sorted(by: { $0.key < $1.key }) {
                    let entry = InvalidBundle(path: path, error: error.description)
                    let size = 2 * (entry.path.utf8.count + entry.error.utf8.count) + 32
                    if bytes + size > Self.appsPageBytes / 2 { break }
                    bytes += size
                    invalid?.append(entry)
                }
                omittedInvalid = catalog.invalid.count - (invalid?.count ?? 0)
            }
            // Unpaged too: an answer that would pass the page's bytes becomes a page, with
            // `next`, rather than an error for everyone.
            var count = 0
            while count < min(bundles.count, request.limit ?? .max) {
                bytes += Self.estimatedBytes(bundles[count], running: runningByApp[bundles[count].identifier])
                if count > 0 && bytes > Self.appsPageBytes { break }
                count += 1
            }
            let next = count < bundles.count ? bundles[count - 1].identifier : nil
            return (Array(bundles.prefix(count)), runningByApp, invalid, next)
        }
        let identifiers = page.map(\.identifier)
        let pendingCounts = (try? paged ? store.pendingCounts(apps: identifiers) : store.pendingCounts()) ?? [:]
        let states = (try? paged ? store.appStates(apps: identifiers) : store.appStates()) ?? [:]
        var response = ControlResponse()
        response.apps = page.map { bundle in
            let state = states[bundle.identifier] ?? AppState(app: bundle.identifier)
            return AppSummary(
                identifier: bundle.identifier, path: bundle.url.path, permittedIdentifiers: bundle.permittedIdentifiers,
                backgroundModes: bundle.backgroundModes.sorted(), extensions: bundle.extensions.map(\.identifier),
                running: runningByApp[bundle.identifier],
                refreshEnabled: state.refreshEnabled, penaltyLevel: state.penaltyLevel, penaltyUntil: state.penaltyUntil,
                pending: pendingCounts[bundle.identifier] ?? 0)
        }
        response.invalid = invalid
        response.next = next
        if omittedInvalid > 0 { (response.truncated, response.omitted) = (true, omittedInvalid) }
        return response
    }

    /// `submit` requests, pipelined ones together: one answer each, in order.
    private func controlSubmit(_ requests: [ControlRequest]) -> [ControlResponse] {
        let apps = queue.sync { requests.map { $0.app.flatMap { catalog.apps[$0] } } }
        var responses: [ControlResponse?] = Array(repeating: nil, count: requests.count)
        var items: [(request: TaskRequest, app: PluginBundle)] = []
        var positions: [Int] = []
        for (position, request) in requests.enumerated() {
            guard let app = request.app, var task = request.request else {
                responses[position] = .failure(.badRequest, "submit needs an app and a request")
                continue
            }
            if let delay = request.delay {
                guard delay.isFinite, abs(delay) <= HostClock.maximumOffset else {
                    responses[position] = .failure(.outOfRange, "submit: delay \(delay) s is outside the bound of \(HostClock.maximumOffsetText) from the host's clock")
                    continue
                }
                task.earliestBeginDate = clock.now.addingTimeInterval(delay).timeIntervalSince1970
            }
            guard let bundle = apps[position] else {
                responses[position] = .failure(.notFound, "no valid bundle with identifier \(app) is in \(configuration.pluginsDirectory.path)")
                continue
            }
            if task.kind == .continuedProcessing {
                responses[position] = Self.response(submitContinued(task, app: bundle, fromLaunch: nil))
            } else {
                items.append((task, bundle))
                positions.append(position)
            }
        }
        for (position, rejection) in zip(positions, submitAll(items)) { responses[position] = Self.response(rejection) }
        return responses.map { $0 ?? .failure(.internalError, "no answer") }
    }

    static func response(_ rejection: SubmissionRules.Rejection?) -> ControlResponse {
        rejection.map { .failure(code($0.status), $0.message) } ?? ControlResponse()
    }

    /// Pipelined requests: runs of consecutive submissions share one commit; every other request
    /// is handled on its own, in order.
    func handle(_ requests: [ControlRequest], peer: PeerCredentials) -> [ControlResponse] {
        var responses: [ControlResponse] = []
        var index = requests.startIndex
        while index < requests.endIndex {
            var end = index
            while end < requests.endIndex, requests[end].knownVerb == .submit { end += 1 }
            if end > index {
                responses += controlSubmit(Array(requests[index..<end]))
                index = end
            } else {
                responses.append(handle(requests[index], peer: peer))
                index += 1
            }
        }
        return responses
    }

    static func code(_ status: SubmissionRules.Status) -> ControlErrorCode {
        switch status {
        case .unavailable: .unavailable
        case .tooManyPendingTaskRequests: .tooManyPendingTaskRequests
        case .notPermitted: .notPermitted
        case .immediateRunIneligible: .immediateRunIneligible
        }
    }

    private func why(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "why needs a task identifier") }
        return queue.sync {
            let now = clock.now
            if let launch = running.values.first(where: { $0.tasks.contains { $0.identifier == identifier } && (request.app == nil || $0.app == request.app) }) {
                var response = ControlResponse()
                response.why = WhyReport(app: launch.app, identifier: identifier, state: "running", runningLaunch: launch.id,
                                         request: launch.requests[identifier], blockers: [], now: now)
                return response
            }
            let stored: StoredRequest?
            if let app = request.app {
                stored = (try? store.pending(app: app))?.first { $0.request.identifier == identifier }
            } else {
                stored = try? store.pendingRequest(identifier: identifier)
            }
            guard let stored else {
                var response = ControlResponse()
                response.why = WhyReport(app: request.app ?? catalog.app(permitting: identifier)?.identifier ?? "", identifier: identifier,
                                         state: "not-submitted", runningLaunch: nil, request: nil, blockers: [], now: now)
                return response
            }
            let state = (try? store.appState(stored.app)) ?? AppState(app: stored.app)
            let appRunning = running.values.contains { $0.app == stored.app }
            var blockers = eligibility(conditions()).blockers(for: stored, app: catalog.apps[stored.app], state: state, appRunning: appRunning)
            if configuration.clock == .virtual, let until = blockers.first(where: { $0.knownCode == .notDue })?.until {
                blockers[blockers.firstIndex { $0.knownCode == .notDue }!].message += " (virtual clock: bgtask clock advance \(Eligibility.format(until.timeIntervalSince(now))))"
            }
            var response = ControlResponse()
            response.why = WhyReport(app: stored.app, identifier: identifier, state: "pending", runningLaunch: nil,
                                     request: stored.request, blockers: blockers, now: now)
            return response
        }
    }

    private func device(_ request: ControlRequest) -> ControlResponse {
        conditionsCache.withLock { $0 = nil }
        defer { conditionsCache.withLock { $0 = nil } }
        if var changes = request.device {
            if let app = changes.removeValue(forKey: "app") {
                guard let value = changes.removeValue(forKey: "refresh") else {
                    return .failure(.badRequest, "--app goes with --refresh on|off")
                }
                // A switch of an installed app, as iOS's Settings shows: a row per name would
                // let a client grow the database without bound.
                guard queue.sync(execute: { catalog.apps[app] != nil }) else {
                    return .failure(.notFound, "no valid bundle with identifier \(app.prefix(255)) is in \(configuration.pluginsDirectory.path)")
                }
                do {
                    var state = try store.appState(app)
                    state.refreshEnabled = value == "on"
                    try store.saveAppState(state)
                } catch {
                    return .failure(.internalError, "\(error)")
                }
            }
            for (key, value) in changes {
                guard DeviceOverrides.keys.contains(key) else {
                    return .failure(.badRequest, "unknown device condition '\(key)' (known: \(DeviceOverrides.keys.joined(separator: ", ")))")
                }
                guard ["on", "off", "auto"].contains(value) else {
                    return .failure(.badRequest, "device \(key): expected on, off or auto, got '\(value)'")
                }
                do { try store.setSetting("device.\(key)", value == "auto" ? nil : value) } catch {
                    return .failure(.internalError, "\(error)")
                }
            }
        }
        return queue.sync {
            let conditions = self.conditions()
            if !conditions.locked { unlockedSinceBoot = true }
            if request.device != nil { evaluate() }
            var response = ControlResponse()
            response.device = self.conditions()
            return response
        }
    }

    private func clockVerb(_ request: ControlRequest) -> ControlResponse {
        queue.sync { () -> ControlResponse in
            if let seconds = request.advance {
                do { _ = try clock.advance(by: seconds) } catch {
                    let error = error as? BGTaskError
                    return .failure(error?.code == .outOfRange ? .outOfRange : .badRequest, error?.description ?? "clock advance failed")
                }
                evaluate()
            }
            var response = ControlResponse()
            response.clock = ClockReport(mode: clock.mode, now: clock.now, nextDue: try? store.nextDueDate(after: clock.now))
            return response
        }
    }

    private func simulateLaunch(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "simulate-launch needs a task identifier") }
        enum Started { case failure(ControlResponse), success((String, DispatchSemaphore)) }
        let started = queue.sync { () -> Started in
            guard !shuttingDown else { return .failure(.failure(.unavailable, "the host is shutting down")) }
            var stored = (try? store.pendingRequest(identifier: identifier)) ?? nil
            if let app = request.app, stored?.app != app { stored = (try? store.pending(app: app))?.first { $0.request.identifier == identifier } }
            let bundle: PluginBundle
            var forced: [TaskAssignment] = []
            if let stored {
                guard let found = catalog.apps[stored.app] else { return .failure(.failure(.notFound, "the app \(stored.app) is not in the plugin directory")) }
                bundle = found
            } else {
                guard request.force == true else {
                    return .failure(.failure(.notFound, "no pending request for \(identifier): as on iOS, simulating a launch needs one (submit it, or pass --force)"))
                }
                guard let found = request.app.flatMap({ catalog.apps[$0] }) ?? catalog.app(permitting: identifier) else {
                    return .failure(.failure(.notFound, "no app in the plugin directory permits \(identifier)"))
                }
                bundle = found
                let kind: TaskKind
                if let given = request.request?.kind { kind = given } else {
                    do { kind = try bundle.inferredKind(of: identifier) } catch { return .failure(.failure(.badRequest, (error as? BGTaskError)?.description ?? "\(error)")) }
                }
                forced = [TaskAssignment(task: 1, identifier: identifier, kind: kind)]
            }
            if let busy = running.values.first(where: { $0.app == bundle.identifier }) {
                return .failure(.failure(.unavailable, "\(bundle.identifier) is running launch \(busy.id); try again when it ends"))
            }
            let id = startLaunch(bundle, requests: stored.map { [$0] } ?? [], forced: forced, reason: .simulated)
            return .success((id, waiter(for: id)))
        }
        switch started {
        case .failure(let response): return response
        case .success(let (id, semaphore)): return launched(id, semaphore, wait: request.wait != false)
        }
    }

    /// A launch's `cancel` host functions: its app's pending requests (one, or all) removed.
    func cancelRequests(app: String, identifier: String?) {
        do {
            _ = try store.cancel(app: app, identifier: identifier)
        } catch {
            logger.error("cannot cancel requests", metadata: ["bundle.id": "\(app)", "error": "\(error)"])
        }
    }

    /// A launch's `pending` host function: its app's pending requests (none when the store
    /// cannot be read, which is logged).
    func pendingRequests(app: String) -> [TaskRequest] {
        do {
            return try store.pending(app: app).map(\.request)
        } catch {
            logger.error("cannot read pending requests", metadata: ["bundle.id": "\(app)", "error": "\(error)"])
            return []
        }
    }

    /// The app an extension belongs to (the app itself for an app).
    func owningApp(of bundle: PluginBundle) -> PluginBundle? {
        guard bundle.kind == .extension else { return bundle }
        return queue.sync { catalog.app(containingBundle: bundle.identifier) }
    }

    /// Starts an extension in its own supervised process with `event`, waits for its record.
    private func runExtension(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "extension-run needs an extension identifier") }
        if let refusal = Self.eventRefusal(request.event) { return refusal }
        var refusal: ControlResponse?
        let started = queue.sync { () -> (String, DispatchSemaphore)? in
            guard !shuttingDown,
                  let app = catalog.app(containingBundle: identifier),
                  let appex = app.extensions.first(where: { $0.identifier == identifier }) else { return nil }
            if let refused = clientLaunchRefusal() {
                refusal = refused
                return nil
            }
            let id = startLaunch(appex, requests: [], reason: .appExtension, role: .extension, eventJSON: request.event)
            return (id, waiter(for: id))
        }
        if let refusal { return refusal }
        guard let (id, semaphore) = started else {
            return .failure(.notFound, "no app in \(configuration.pluginsDirectory.path) contains a valid extension \(identifier) (see bgtask apps)")
        }
        return launched(id, semaphore, wait: request.wait != false)
    }

    private func simulateExpire(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "simulate-expire needs a task identifier") }
        return queue.sync {
            for (id, launch) in running {
                guard let task = launch.tasks.first(where: { $0.identifier == identifier }) else { continue }
                running[id]?.expiredTasks.insert(task.task)
                launch.control.expire(task: task.task, reason: "simulated")
                var response = ControlResponse()
                response.launchID = id
                return response
            }
            return .failure(.notFound, "\(identifier) is not running in any launch")
        }
    }
}


/// Requests from inside launches go to the host's store.
///
/// Apps compute dates from the real clock (`Date()`). Under a virtual clock their dates are
/// moved onto it: an `earliestBeginDate` 15 minutes after the app's now is 15 minutes after the
/// host's now, and `pendingTaskRequests` moves them back.
struct HostRequestBroker: LaunchRequestBroker {
    let host: TaskHost
    /// The launch whose requests these are.
    let launchID: String

    private var offset: TimeInterval {
        host.clock.mode == .virtual ? host.clock.now.timeIntervalSince(Date()) : 0
    }

    /// A request from an extension is the containing app's: the host bound the extension's
    /// identity when it started the launch, so it can only ever act for that app.
    func submit(_ request: TaskRequest, app: PluginBundle) -> SubmissionRules.Rejection? {
        guard let owner = host.owningApp(of: app) else {
            return .init(status: .unavailable, message: "the app containing \(app.identifier) is no longer in the plugin directory")
        }
        var shifted = request
        shifted.earliestBeginDate = request.earliestBeginDate.map { $0 + offset }
        return host.submit(shifted, app: owner, fromLaunch: launchID)
    }

    func cancel(identifier: String?, app: PluginBundle) {
        guard let owner = host.owningApp(of: app) else { return }
        host.cancelRequests(app: owner.identifier, identifier: identifier)
    }

    func pending(app: PluginBundle) -> [TaskRequest] {
        let offset = self.offset
        guard let owner = host.owningApp(of: app) else { return [] }
        return host.pendingRequests(app: owner.identifier).map {
            var request = $0
            request.earliestBeginDate = request.earliestBeginDate.map { $0 - offset }
            return request
        }
    }
}

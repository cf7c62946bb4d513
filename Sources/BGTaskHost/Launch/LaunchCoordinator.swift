import BGTaskControl
import BGTaskDashboard
import BGTaskLaunch
import BGTaskStore
import BGTaskModel
import BGTaskSystem
import Dispatch
import Foundation
import Logging

/// The running launches: starts each one (supervised by the host's supervision loops), records it in the store
/// before its process exists and after it ends, relays commands to it (expire, shut down, start a
/// continued-processing task, close), follows its events, and hands its record to whoever waits
/// for it. On the host queue (`@HostActor`); launch workers hop onto it.
///
/// It decides nothing about *when* to launch (`SchedulingLoop` does) and answers no client
/// (`ControlVerbs` does); it tells the host a launch ended through `onEnded`.
@HostActor
final class LaunchCoordinator: HostPart {
    struct RunningLaunch {
        var id: String
        var app: String
        var reason: String
        var tasks: [TaskAssignment]
        var requests: [String: TaskRequest]
        var control: LaunchControl
        var expiredTasks: Set<UInt64> = []
        /// Called with the record when the launch ends (on the queue).
        var waiters: [@Sendable (RunRecord) -> Void] = []
        var role: LaunchRole = .background
        /// The launch entry returned.
        var launched = false
        /// Foreground launches: told that no more tasks will come.
        var closed = false
        /// Foreground launches: in the foreground until then.
        var staysUntil: Date?
        /// Background launches: the work is over (tasks ended, no background time) and the
        /// launch only settles: it holds no launch slot (`busyCount`).
        var workOver = false
        var nextTaskID: UInt64 = 1
        /// The thermal state and Low Power Mode the launch was last told of.
        var device: (thermalState: UInt32, lowPowerMode: Bool) = (0, false)
        /// Expired whole because the device turned critical.
        var thermalExpired = false
        /// The day before which its MetricKit days were offered to it (nil: none were).
        var metricsOfferedBefore: Date?
        /// What `running` reports (`RunningLaunches.swift`).
        var startedAt = Date()
        var limits: (budgetMs: Double, graceMs: Double, memoryBytes: UInt64) = (0, 0, 0)
        var pid: Int32?
    }

    let core: HostCore
    private let device: DeviceState
    private let supervisor: LaunchSupervisor
    private(set) var running: [String: RunningLaunch] = [:]
    /// What each scheduling pass asks of `running`, kept in step with it (see launch-ends-in-bursts.md).
    private var tally = RunningTally()
    /// The apps in the foreground now (a foreground launch whose entry returned and that has not
    /// left), with their launch's control: read by the notifications part off this queue, to
    /// hand a notification delivered to such an app to its delegate's `willPresent`.
    nonisolated let foreground = LockedValue<[String: LaunchControl]>([:])
    /// Told of each launch as it begins and ends (the dashboard), on this queue.
    var observer: (@Sendable (DashboardEvent) -> Void)?
    /// Per app, the day (of the host's clock) its MetricKit payloads were last looked for, and
    /// its oldest day not delivered yet (from the store at the start, then as launches end): a
    /// launch reads the store for its metrics only when it has days that have ended to take.
    var metricsLookedFor: [String: Date] = [:]
    var undeliveredDays: [String: Date] = [:]
    /// The next block of task numbers (see `start`): each launch numbers its tasks, and those a
    /// foreground launch adds, within a block of its own.
    private var taskNumbers: UInt64 = 0
    static let taskNumberBlock: UInt64 = 1 << 20
    /// Apps whose last launch could not be started, and when to try again (real time).
    private var retryAfter: [String: Date] = [:]
    /// Why each app in `retryAfter` was not started, for `bgtask why`: its record's error, and
    /// whether it was its disk quota.
    private var startFailures: [String: (message: String, diskQuota: Bool)] = [:]
    static let startFailureBackoff: TimeInterval = 30
    /// An app refused over its disk quota is measured again this much later (each refusal is a
    /// walk of its containers and a record in its history).
    static let diskQuotaBackoff: TimeInterval = 120
    /// Continued-processing tasks: running, queued, their progress (see ContinuedLaunches.swift).
    var continued: ContinuedProcessing
    var stallTimer: DispatchSourceTimer?
    /// Called on the queue after a launch ended and was recorded, and when a start failure's
    /// backoff is over: time to look at the schedule again.
    var onEnded: () -> Void = {}
    /// The broker answering one launch's requests (submit, cancel, pending), by launch id.
    var makeBroker: (String) -> LaunchRequestBroker = { _ in InMemoryRequestBroker() }

    nonisolated init(core: HostCore, device: DeviceState) {
        self.core = core
        self.device = device
        let configuration = core.configuration
        continued = ContinuedProcessing(slots: configuration.maximumContinuedTasks, stallInterval: configuration.progressStallInterval.timeInterval)
        var supervisor = LaunchSupervisor(runnerPath: configuration.runnerPath, logger: core.logger)
        supervisor.cgroupRoot = configuration.cgroupRoot
        supervisor.processLimit = configuration.processLimit
        if configuration.useZygote {
            supervisor.zygote = Zygote(runnerPath: configuration.runnerPath, logger: core.logger, confine: configuration.confine)
        }
        supervisor.confine = configuration.confine
        supervisor.sandboxFailsClosed = configuration.sandboxFailsClosed
        if configuration.confine && geteuid() == 0 { supervisor.identities = AppIdentities(stateDirectory: configuration.stateDirectory) }
        if configuration.appLifecycle == .ios {
            let apps = SuspendedApps(
                budgetBytes: configuration.suspendedMemoryBytes ?? ProcessInfo.processInfo.physicalMemory / 4,
                maximumCount: configuration.maximumSuspendedApps, logger: core.logger)
            let zygote = supervisor.zygote
            apps.afterReap = { pid in LaunchSupervisor.reapOrphans(sparing: zygote?.processes ?? [], launchGroup: pid) }
            supervisor.suspendedApps = apps
        }
        self.supervisor = supervisor
        // The supervision loops exist from the host's start (their descriptors and threads are
        // part of the host at rest, not of its first launch).
        _ = SupervisionLoops.all
    }

    var partName: String { "launch coordinator" }

    /// Launches the store says were running belong to a host that died: kill what is left of
    /// them, record them as `host-lost`, and make their requests pending again.
    func start() throws(BGTaskError) {
        undeliveredDays = try core.store.undeliveredDays()
        supervisor.suspendedApps?.onMemoryPressureEviction = { [weak self] app in self?.core.async { self?.evictedForMemoryPressure(app) } }
        let state = core.configuration.stateDirectory
        for launch in try core.store.interruptedLaunches() {
            var detail = "the host stopped during the launch"
            if let pid = launch.pid, ProcessTree.launchID(of: pid) == launch.launchID {
                ProcessTree.killTree(pid)
                detail += "; its runner (pid \(pid)) was still running and has been killed"
            }
            let logPath = state.appendingPathComponent("logs/\(launch.launchID).log").path
            let log = access(logPath, F_OK) == 0 ? logPath : nil
            let bundlePath = core.configuration.pluginsDirectory.appendingPathComponent("?").path
            removeLogs(of: try core.store.recoverInterruptedLaunch(.hostLost(launch, bundlePath: bundlePath, log: log, detail: detail),
                                                                   keepHistory: core.configuration.historyPerApp))
            core.logger.warning("recovered a launch interrupted by a host crash", metadata: ["launch.id": "\(launch.launchID)", "bundle.id": "\(launch.app)"])
        }
        // Apps a dead host left suspended. Usually they are gone: their process group was
        // orphaned with stopped members, so the kernel continued them and they ended themselves
        // (their channel closed). Not when the host's parent was a subreaper in the host's own
        // session (a shell's, a test runner's): the group is then not orphaned, and they stay
        // stopped. Each is found by its last launch's id in its app process's title (anything
        // else at that pid is not theirs and is left alone).
        for (launchID, app, pid) in try core.store.suspendedLaunches() {
            let appPID = ProcessTree.appProcess(of: pid) ?? pid
            guard ProcessTree.launchID(of: appPID) == launchID else { continue }
            ProcessTree.killTree(pid)
            kill(pid, SIGKILL)
            core.logger.warning("ended an app's process a stopped host had left suspended", metadata: [
                "launch.id": "\(launchID)", "bundle.id": "\(app)", "pid": "\(pid)"])
        }
    }

    /// Stops the zygote. Launches are shut down before (`shutdownAll`), and this runs once none is left.
    func stop() {
        stallTimer?.cancel()
        stallTimer = nil
        supervisor.suspendedApps?.stop(reason: "the host stopped")
        supervisor.zygote?.stop()
    }

    // MARK: What is running

    var isEmpty: Bool { running.isEmpty }
    var count: Int { running.count }
    /// Launches that hold a launch slot (`--max-launches`): those whose work is not over. A
    /// launch whose tasks have ended finishes its main queue's turn and goes quiet before it
    /// is suspended or exits (milliseconds): the next app's launch does not wait for that.
    var busyCount: Int { tally.busy }
    var runningApps: Set<String> { tally.apps }
    /// Foreground and extension launches: the ones clients start by hand.
    var clientStartedCount: Int { tally.clientStarted }
    /// A processing task runs: device conditions must be watched while it does.
    /// A background launch runs: the machine's thermal state is watched (it is expired at critical).
    var runsBackgroundLaunches: Bool { tally.background > 0 }
    var runsProcessingTasks: Bool { tally.processing > 0 }
    func launch(of app: String) -> RunningLaunch? { tally.apps.contains(app) ? running.values.first { $0.app == app } : nil }
    /// The launch running task `identifier` (of `app`, when given).
    func launch(running identifier: String, app: String?) -> RunningLaunch? {
        running.values.first { $0.tasks.contains { $0.identifier == identifier } && (app == nil || $0.app == app) }
    }
    func isBackingOff(_ app: String) -> Bool { retryAfter[app] != nil }
    /// Each app's process as the lifecycle keeps it (running, suspended, evicted); empty with
    /// `--app-lifecycle fresh`.
    nonisolated var processStates: [AppProcessState] { supervisor.suspendedApps?.states() ?? [] }
    /// The suspended apps' jetsam (for the test kit and `bgtask apps --evict`).
    nonisolated var suspendedApps: SuspendedApps? { supervisor.suspendedApps }
    /// The apps `isBackingOff` names, as a value.
    var backingOff: Set<String> { Set(retryAfter.keys) }

    /// Forgets start failures whose backoff is over.
    func pruneBackoffs(now: Date = Date()) {
        retryAfter = retryAfter.filter { $0.value > now }
        startFailures = startFailures.filter { retryAfter[$0.key] != nil }
    }

    /// Why the app's last launch was not started and until when it waits (nil: it does not).
    func startFailure(of app: String) -> (message: String, diskQuota: Bool, until: Date)? {
        guard let until = retryAfter[app], until > Date(), let failure = startFailures[app] else { return nil }
        return (failure.message, failure.diskQuota, until)
    }

    // MARK: Starting

    /// Starts one launch of `bundle` running `requests` (or `forced` tasks); returns its id.
    @discardableResult
    func start(_ bundle: PluginBundle, requests: [StoredRequest], forced: [TaskAssignment] = [], reason: LaunchReason,
               role: LaunchRole = .background, eventJSON: String? = nil, push: LaunchPlan.PushDelivered? = nil) -> String {
        let configuration = core.configuration
        // Numbered from a block of the host's own (`taskNumbers`), never from 1 in each launch: a
        // resumed process may still hold the BGTask objects of its earlier launches, and a
        // setTaskCompleted on one must not complete a new task that reused its number.
        let base = taskNumbers
        taskNumbers += Self.taskNumberBlock
        let tasks = (forced.isEmpty
            ? requests.map { TaskAssignment(task: 0, identifier: $0.request.identifier, kind: $0.request.kind) }
            : forced).enumerated().map { TaskAssignment(task: base + UInt64($0.offset + 1), identifier: $0.element.identifier, kind: $0.element.kind) }
        var limits = LaunchLimits.defaults(for: role == .foreground ? [.continuedProcessing] : tasks.map(\.kind))
        if push != nil { limits.budget = PushRules.handlerBudget }
        // handleEventsForBackgroundURLSession has what a push's handler has (iOS: about 30 s).
        if reason == .backgroundTransfer { limits.budget = PushRules.handlerBudget }
        if let budget = configuration.budget { limits.budget = budget }
        if let grace = configuration.grace { limits.grace = grace }
        if let memory = configuration.memoryLimitBytes { limits.memoryLimitBytes = memory }
        limits.logLimitBytes = configuration.logLimitBytes
        limits.diskReserveBytes = configuration.diskReserveBytes
        limits.diskQuota = configuration.diskQuota
        let launchID = LaunchPlan.newLaunchID()
        var plan = LaunchPlan(
            bundle: bundle, tasks: tasks, role: role, reason: reason, limits: limits, launchID: launchID,
            // `isDirectory` given: without it, Foundation stats each path to decide.
            dataDirectory: configuration.stateDirectory.appendingPathComponent("containers/\(bundle.identifier)", isDirectory: true),
            logFile: configuration.stateDirectory.appendingPathComponent("logs/\(launchID).log", isDirectory: false), eventJSON: eventJSON,
            groupsDirectory: configuration.stateDirectory.appendingPathComponent("groups", isDirectory: true))
        plan.push = push
        plan.environment.merge(LaunchPlan.unifiedLoggingEnvironment(keepingPrivateValues: configuration.logPrivateValues)) { $1 }
        let conditions = device.conditions()
        plan.supportedResources = conditions.supportedResources
        // The device's switch, and the app's own (kept in memory: no read on the launch's path).
        if !conditions.backgroundRefresh || device.isAppRefreshOff(bundle.containingApp ?? bundle.identifier) {
            plan.backgroundRefreshStatus = LaunchPlan.refreshStatusDenied
        }
        // The CPU monitor, as iOS runs it: for background work, but not for the app in the
        // foreground, nor for processing tasks while the device is on external power.
        if configuration.cpuLimit == nil {
            plan.limits.cpuLimit = nil
            plan.limits.cpuLimitExemption = "the host runs with --cpu-limit off"
        } else if role == .foreground {
            plan.limits.cpuLimit = nil
            plan.limits.cpuLimitExemption = "the app is in the foreground"
        } else if conditions.externalPower, tasks.contains(where: { $0.kind.isProcessing }) {
            plan.limits.cpuLimit = nil
            plan.limits.cpuLimitExemption = "a processing task on external power"
        } else {
            plan.limits.cpuLimit = configuration.cpuLimit
        }
        if role != .extension { plan.metricsJSON = metricsJSON(for: bundle) }
        // The user opened the app: what its usage pattern is predicted from.
        if role == .foreground && (reason == .foreground || reason == .notificationResponse) {
            do { try core.store.recordUse(app: bundle.identifier, at: core.clock.now) } catch {
                core.logger.error("cannot record a use of an app", metadata: ["bundle.id": "\(bundle.identifier)", "error": "\(error)"])
            }
        }
        plan.thermalState = UInt32(conditions.thermalState.rawValue)
        plan.lowPowerMode = conditions.lowPowerMode
        let control = LaunchControl()
        let core = self.core
        control.onStart = { [weak self] pid in
            guard let self else { return }
            core.async { self.notePID(launchID, pid) }
        }
        // What a launch says as it runs (entry returned, tasks begun and ended, progress) is
        // the host's business only in a foreground launch (its stay, its continued-processing
        // tasks); a background launch's supervisor keeps it to itself, without a hop onto this
        // queue for each.
        if role == .foreground {
            control.onEvent = { [weak self] event in
                guard let self else { return }
                core.async { self.launchEvent(launchID, event) }
            }
        } else if role == .background {
            control.onWorkOver = { [weak self] in
                guard let self else { return }
                core.async {
                    guard let launch = self.running[launchID], !launch.workOver else { return }
                    self.running[launchID]?.workOver = true
                    self.tally.noteWorkOver()
                    self.onEnded()
                }
            }
        }
        running[launchID] = RunningLaunch(
            id: launchID, app: bundle.identifier, reason: reason.rawValue, tasks: tasks,
            requests: Dictionary(requests.map { ($0.request.identifier, $0.request) }, uniquingKeysWith: { a, _ in a }),
            control: control, role: role, nextTaskID: base + UInt64(tasks.count + 1), device: (plan.thermalState, plan.lowPowerMode),
            metricsOfferedBefore: plan.metricsJSON == nil ? nil : EnergyBudget.day(of: core.clock.now),
            limits: (plan.limits.budget.milliseconds, plan.limits.grace.milliseconds, plan.limits.memoryLimitBytes))
        tally.noteAdded(running[launchID]!)
        observer?(.launchBegan(report(running[launchID]!)))
        // The launch's preparation (containers, channel, log) starts on a launch worker while
        // the launch is recorded here; its process starts only once admitted, so the record
        // still comes before the process. It is then supervised by a supervision loop, and its
        // record comes back here.
        control.requireAdmission()
        // Recorded with the other launches this turn of the queue starts (`recordBegun`), and
        // queued for it before the supervisor can fail the launch and send its record back.
        // Records carry real time (the virtual clock only steers scheduling decisions).
        beginning.append((PendingRequestStore.LaunchBegin(id: launchID, app: bundle.identifier, reason: reason.rawValue, tasks: tasks, at: Date()),
                          control))
        if beginning.count == 1 { core.async { [weak self] in self?.recordBegun() } }
        let broker = makeBroker(launchID)
        supervisor.start(plan, broker: broker, control: control) { [weak self, plan] outcome in
            let record: RunRecord
            switch outcome {
            case .success(let finished): record = finished
            case .failure(let error): record = .notStarted(plan, error: error)
            }
            guard let self else { return }
            core.async { self.ended(record) }
        }
        core.logger.info("launching", metadata: ["launch.id": "\(launchID)", "bundle.id": "\(bundle.identifier)", "reason": "\(reason)",
                                               "tasks": "\(tasks.map(\.identifier).joined(separator: ","))"])
        return launchID
    }

    // MARK: Batched bookkeeping

    /// Launches started in this turn of the host's queue, to be recorded together: a
    /// scheduling pass that starts a hundred launches commits once, not a hundred times. Each
    /// launch's process starts only once its launch is recorded (admission); its preparation
    /// (containers, channel, log) runs on a worker meanwhile.
    private var beginning: [(launch: PendingRequestStore.LaunchBegin, control: LaunchControl)] = []
    /// Runners' pids, for the store (a dead host's launches are found by them), and records
    /// that came back: each batch written at the queue's next turn, in one transaction.
    private var startedPIDs: [(id: String, pid: Int32)] = []
    private var endedRecords: [RunRecord] = []

    /// Writes the launches begun so far (the scheduling pass calls it once it has started its
    /// launches, so that they are recorded, their requests marked running, in the pass's own
    /// turn: a submission that replaces one of those requests comes after; other starts are
    /// written at the queue's next turn).
    func recordBegun() {
        guard !beginning.isEmpty else { return }
        let batch = beginning
        beginning = []
        let store = core.store
        var failures: [String: BGTaskError] = [:]
        do { try store.beginLaunches(batch.map(\.launch)) } catch {
            // One at a time: a launch that cannot be recorded fails alone.
            for (launch, _) in batch {
                do { try store.beginLaunch(id: launch.id, app: launch.app, reason: launch.reason, tasks: launch.tasks, at: launch.at) } catch {
                    failures[launch.id] = error
                }
            }
        }
        for (launch, control) in batch {
            if let error = failures[launch.id] {
                // Not started: its launch ends with a `launch-failed` record, and the app backs off.
                core.logger.error("cannot record a launch; not starting it", metadata: ["bundle.id": "\(launch.app)", "error": "\(error)"])
            }
            control.admit(failures[launch.id] == nil)
        }
    }

    private func notePID(_ launchID: String, _ pid: Int32) {
        running[launchID]?.pid = pid
        startedPIDs.append((launchID, pid))
        guard startedPIDs.count == 1 else { return }
        core.async { [weak self] in
            guard let self else { return }
            let batch = startedPIDs
            startedPIDs = []
            do { try core.store.setLaunchPIDs(batch) } catch {
                core.logger.error("cannot record the pids of running launches", metadata: ["error": "\(error)"])
            }
        }
    }

    // MARK: Ending

    /// The logs of launches pruned from the history go with them (`logs/LAUNCH_ID.log`, and
    /// their memory and CPU over time, `.samples`).
    private func removeLogs(of launchIDs: [String]) {
        guard !launchIDs.isEmpty else { return }
        let logs = core.configuration.stateDirectory.appendingPathComponent("logs", isDirectory: true).path
        for id in launchIDs {
            unlink("\(logs)/\(id).log")
            unlink("\(logs)/\(id).samples")
        }
    }

    /// A launch's record came back: written with the others that come back in this turn of
    /// the queue (`recordEnded`), in one transaction.
    private func ended(_ record: RunRecord) {
        observer?(.launchEnded(record))
        endedRecords.append(record)
        if endedRecords.count == 1 { core.async { [weak self] in self?.recordEnded() } }
    }

    private func recordEnded() {
        let batch = endedRecords
        endedRecords = []
        let (store, clock, configuration) = (core.store, core.clock, core.configuration)
        // The host could not start the child (runner missing, out of descriptors): not the
        // app's fault. Its requests stay pending, and the app is retried after a pause.
        let notStarted = batch.filter { $0.pid == 0 && $0.termination == .launchFailed }
        let finished = batch.filter { !($0.pid == 0 && $0.termination == .launchFailed) }
        for record in notStarted { recordNotStarted(record) }
        if !finished.isEmpty {
            // The records and the apps' state in one transaction (launch bookkeeping: not
            // synced, see `finishLaunch`).
            let now = clock.now
            let update: (RunRecord, inout AppState) -> Void = { record, state in
                state.lastLaunchAt = now
                state.lastLaunchID = record.launchID
                state.lastRegistered = record.termination == .launchFailed ? state.lastRegistered
                    : record.listEntriesOmitted?["registered"] != nil ? nil : record.registered
                if SchedulingPolicy.isBad(record) {
                    state.penaltyLevel += 1
                    state.penaltyUntil = now.addingTimeInterval(SchedulingPolicy.penalty(level: state.penaltyLevel))
                } else if record.termination == .exited || record.termination == .suspended {
                    state.penaltyLevel = 0
                    state.penaltyUntil = nil
                }
            }
            do {
                for pruned in try store.finishLaunches(finished, keepHistory: configuration.historyPerApp, day: EnergyBudget.day(of: now),
                                                       updatingState: update) { removeLogs(of: pruned) }
            } catch {
                // One at a time: a record that cannot be written fails alone.
                for record in finished {
                    do {
                        removeLogs(of: try store.finishLaunch(record, keepHistory: configuration.historyPerApp, day: EnergyBudget.day(of: now)) {
                            update(record, &$0)
                        })
                    } catch {
                        core.logger.error("cannot record a finished launch", metadata: ["launch.id": "\(record.launchID)", "error": "\(error)"])
                    }
                }
            }
            let today = EnergyBudget.day(of: now)
            for record in finished where (undeliveredDays[record.app] ?? .distantFuture) > today { undeliveredDays[record.app] = today }
            for record in finished {
                core.logger.info("launch ended", metadata: ["launch.id": "\(record.launchID)", "bundle.id": "\(record.app)", "termination": "\(record.termination.rawValue)"])
            }
        }
        for record in batch {
            let ended = running.removeValue(forKey: record.launchID)
            if let ended { tally.noteRemoved(ended) }
            if record.metricsDelivered == true, let day = ended?.metricsOfferedBefore { metricsTaken(record, offeredBefore: day) }
            if let control = ended?.control { foreground.withLock { if $0[record.app] === control { $0[record.app] = nil } } }
            let waiters = ended?.waiters ?? []
            // Queued continued-processing requests die with the foreground launch that made them.
            continued.launchEnded(record.launchID, at: Date())
            for waiter in waiters { waiter(record) }
        }
        startQueuedContinued()
        onEnded()
    }

    private func recordNotStarted(_ record: RunRecord) {
        let (store, configuration) = (core.store, core.configuration)
        do { removeLogs(of: try store.recoverInterruptedLaunch(record, keepHistory: configuration.historyPerApp)) } catch {
            core.logger.error("cannot record a launch that failed to start", metadata: ["launch.id": "\(record.launchID)", "error": "\(error)"])
        }
        // Over its disk quota: the app's fault, measured again after a longer pause.
        let overQuota = record.disk?.exceeded != nil
        let pause = overQuota ? Self.diskQuotaBackoff : Self.startFailureBackoff
        retryAfter[record.app] = Date().addingTimeInterval(pause)
        startFailures[record.app] = (record.error ?? "the launch could not be started", overQuota)
        core.async(after: .now() + pause + 0.01) { [weak self] in self?.onEnded() }
        core.logger.error(overQuota ? "not launching an app over its disk quota; measuring again later" : "could not start a launch; retrying later",
                          metadata: ["bundle.id": "\(record.app)", "error": "\(record.error ?? "")"])
    }

    /// Calls `ended` with launch `id`'s record when it ends (on the queue); false when no such
    /// launch is running (then `ended` is never called).
    func whenEnded(_ id: String, _ ended: @escaping @Sendable (RunRecord) -> Void) -> Bool {
        guard running[id] != nil else { return false }
        running[id]?.waiters.append(ended)
        return true
    }

    // MARK: Commands

    /// Expires the running task `identifier` in whichever launch runs it: the launch's id, or nil.
    func expire(identifier: String, reason: String) -> String? {
        for (id, launch) in running {
            guard let task = launch.tasks.first(where: { $0.identifier == identifier }) else { continue }
            running[id]?.expiredTasks.insert(task.task)
            launch.control.expire(task: task.task, reason: reason)
            return id
        }
        return nil
    }

    /// Expires running tasks whose conditions no longer hold: processing tasks that require
    /// power when power goes away, and processing tasks when the device stops being idle; and
    /// every background launch when the device turns critically hot. Tells each running launch
    /// of a new thermal state or Low Power Mode (`ProcessInfo`'s, and its notifications).
    func enforce(_ conditions: DeviceConditions) {
        let device = (thermalState: UInt32(conditions.thermalState.rawValue), lowPowerMode: conditions.lowPowerMode)
        // Under the conditions last enforced, only launches started since can be at odds with them.
        let ids = tally.enforced == conditions ? tally.unenforced : Array(running.keys)
        tally.enforced = conditions
        tally.unenforced = []
        for id in ids {
            guard let launch = running[id] else { continue }
            if launch.device != device {
                running[id]?.device = device
                launch.control.device(thermalState: device.thermalState, lowPowerMode: device.lowPowerMode)
            }
            // As iOS at a critical thermal state: background work is expired (its expiration
            // handlers run, then the grace); the foreground app is left alone.
            if conditions.thermalState == .critical && launch.role != .foreground && !launch.thermalExpired {
                running[id]?.thermalExpired = true
                let reason = "the device's thermal state turned critical (\(conditions.sources["thermalState"] ?? "machine"))"
                launch.control.expire(task: nil, reason: reason)
                core.logger.info("expiring a launch: \(reason)", metadata: ["launch.id": "\(id)", "bundle.id": "\(launch.app)"])
                continue
            }
            for task in launch.tasks where !launch.expiredTasks.contains(task.task) {
                guard let request = launch.requests[task.identifier] else { continue }
                var reason: String?
                if task.kind.isProcessing {
                    if !conditions.idle { reason = "the device is no longer idle" }
                    if request.requiresExternalPower && !conditions.externalPower { reason = "external power was lost" }
                    if request.requiresNetworkConnectivity && !conditions.network { reason = "network connectivity was lost" }
                }
                if let reason {
                    running[id]?.expiredTasks.insert(task.task)
                    launch.control.expire(task: task.task, reason: reason)
                    core.logger.info("expiring a task: \(reason)", metadata: ["launch.id": "\(id)", "task.id": "\(task.identifier)"])
                }
            }
        }
    }

    /// The host is shutting down: no launch is started by hand any more (`shutdownAll`).
    private(set) var isShuttingDown = false

    /// Shuts every running launch down: expired now, killed after its grace.
    func shutdownAll(reason: String) {
        isShuttingDown = true
        for launch in running.values { launch.control.shutdown(reason: reason) }
    }

    // MARK: Events

    private func launchEvent(_ launchID: String, _ event: LaunchControl.Event) {
        guard running[launchID] != nil else { return }
        switch event {
        case .launched:
            running[launchID]?.launched = true
            if let launch = running[launchID], launch.role == .foreground {
                foreground.withLock { $0[launch.app] = launch.control }
                let stay = core.configuration.foregroundStay.timeInterval
                running[launchID]?.staysUntil = Date().addingTimeInterval(stay)
                core.async(after: .now() + stay) { [weak self] in self?.closeIfIdle(launchID) }
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
    func closeIfIdle(_ launchID: String) {
        guard let launch = running[launchID], launch.role == .foreground, launch.launched, !launch.closed,
              Date() >= launch.staysUntil ?? .distantFuture,
              !continued.holds(launchID) else { return }
        running[launchID]?.closed = true
        foreground.withLock { if $0[launch.app] === launch.control { $0[launch.app] = nil } }
        launch.control.close()
    }

    /// Adds a task to a running launch (a continued-processing task in its foreground launch).
    func addTask(_ request: TaskRequest, kind: TaskKind, to launchID: String) -> TaskAssignment? {
        guard var launch = running[launchID] else { return nil }
        let task = TaskAssignment(task: launch.nextTaskID, identifier: request.identifier, kind: kind)
        tally.noteRemoved(launch)
        launch.nextTaskID += 1
        launch.tasks.append(task)
        launch.requests[request.identifier] = request
        running[launchID] = launch
        tally.noteAdded(launch)
        launch.control.startTask(task)
        return task
    }
}

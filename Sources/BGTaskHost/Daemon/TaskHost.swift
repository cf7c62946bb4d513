import BGTaskControl
import BGTaskDashboard
import BGTaskLaunch
import BGTaskTransfers
import BGTaskStore
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
/// It is made of parts, each with a narrow interface, calls going one way (down this list) and
/// events coming back up through callbacks set here:
///
/// - `StateDirectory.Lock`: one host per state directory, held for the host's life;
/// - `AppCatalog`: the valid bundles of the plugin directory, rescanned when it changes;
/// - `DeviceState`: power, network, idleness, lock, with the operator's overrides;
/// - `LaunchCoordinator`: the running launches (start, commands, events, records), and
///   continued-processing tasks in their foreground launches;
/// - `SchedulingLoop`: when to launch, and the timers for the next decision;
/// - `Submissions`: requests coming in (launches, extensions, clients), into the store;
/// - `LocalNotifications`: apps' notification requests, delivered when due (its own queue);
/// - `ControlVerbs` behind `ControlServer`: the control socket.
///
/// Every part's mutable state is confined to one serial queue (`HostCore.queue`), which is the
/// executor of a global actor (`HostActor`): the parts on it are `@HostActor`, so the compiler
/// refuses any touch of their state from elsewhere, and control connections and launch threads
/// hop onto it with `HostCore.sync`/`async`. The store is thread-safe on its own. The parts
/// start in order and stop in reverse (`HostParts`).
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
        /// A layer the machine offers that cannot be applied fails the launch (see
        /// LaunchSupervisor.sandboxFailsClosed); false: `--sandbox best-effort`.
        public var sandboxFailsClosed = true
        /// What becomes of an app's process when a launch's work is over: suspended and
        /// resumed by the app's next launch (`.ios`, the default), or ended (`.fresh`).
        public var appLifecycle: AppLifecycle = .ios
        /// The most memory suspended apps may hold together (their private pages) before the
        /// least recently used are evicted (`--suspended-memory`); nil: a quarter of the machine's.
        public var suspendedMemoryBytes: UInt64?
        /// The most apps suspended at once (`--max-suspended-apps`): each holds three of the
        /// host's descriptors (its channel, its log pipe, its pidfd).
        public var maximumSuspendedApps = 1000
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
        /// The background CPU limit (`--cpu-limit`; nil: off).
        public var cpuLimit: CPULimit? = .ios
        /// Each app's disk quota (`--disk-quota`, `--disk-quota-inodes`; see DiskQuota).
        public var diskQuota = DiskQuota()
        /// The host's reserve in its state directory for records and acknowledged requests
        /// (`--store-reserve`; see StoreReserve). 0: none.
        public var storeReserveBytes: UInt64 = StoreReserve.defaultBytes
        /// Launches keep private values in their unified-logging entries (`--log-private`).
        public var logPrivateValues = false
        /// Serve an APNs-compatible provider endpoint at this address and port (nil: none).
        public var apnsEndpoint: (host: String, port: Int)?
        /// The APNs endpoint's TLS: PEM files of its certificate chain and private key (nil: cleartext).
        public var apnsTLS: (certificate: String, key: String)?
        /// Provider token keys (key identifier → PEM file) and team: token authentication on.
        public var apnsProviderKeys: [String: String] = [:]
        public var apnsTeamID: String?
        /// The APNs endpoint's connection cap, handshake, request and idle timeouts, streams per connection.
        public var apnsLimits = APNsEndpointLimits()
        /// Serve the dashboard and /metrics (`--http-port`; nil: not served).
        public var dashboard: DashboardOptions?
        /// Local notifications are authorized for every app whose own switch is not off
        /// (`--allow-notifications`); otherwise denied until the operator allows an app.
        public var allowNotifications = false
        /// Post delivered notifications to the desktop (org.freedesktop.Notifications) where a
        /// session bus is present.
        public var desktopNotifications = true

        public init(pluginsDirectory: URL, stateDirectory: URL) {
            self.pluginsDirectory = pluginsDirectory
            self.stateDirectory = stateDirectory
        }
    }

    public let configuration: Configuration
    private let core: HostCore
    private let lock: StateDirectory.Lock
    private let catalog: AppCatalog
    private let device: DeviceState
    private let launches: LaunchCoordinator
    private let scheduling: SchedulingLoop
    private let pushes: PushDelivery
    private let submissions: Submissions
    private let notifications: LocalNotifications
    private let transfers: BackgroundTransfers
    private let verbs: ControlVerbs
    @HostActor private var parts: HostParts?
    @HostActor private var shuttingDown = false
    @HostActor private var finished = false
    private let stopped = DispatchSemaphore(value: 0)

    public init(configuration: Configuration, logger: Logger) throws(BGTaskError) {
        self.configuration = configuration
        if let warning = try StateDirectory.prepare(configuration.stateDirectory) { logger.warning("\(warning)") }
        if configuration.confine && geteuid() == 0 { try ContainerReach.check(stateDirectory: configuration.stateDirectory.path) }
        lock = try StateDirectory.Lock(configuration.stateDirectory)
        // The disk reserve before the database: made while there is room (see StoreReserve).
        let reserve = StoreReserve(stateDirectory: configuration.stateDirectory, bytes: configuration.storeReserveBytes)
        if let warning = reserve.prepare() { logger.warning("\(warning)") }
        let store = try PendingRequestStore(directory: configuration.stateDirectory, reserve: reserve)
        logger.info("disk quotas per app: \(configuration.diskQuota.isOn ? "\(RunRecord.mib(configuration.diskQuota.bytes)), \(configuration.diskQuota.inodes) files" : "none"); \(ProjectQuotas.cachedEnforcement(configuration.stateDirectory.path))")
        let clock = try HostClock(mode: configuration.clock, store: store)
        if let reason = clock.resetReason { logger.warning("virtual clock reset: \(reason)") }
        core = HostCore(configuration: configuration, store: store, clock: clock, logger: logger, queue: HostActor.queue)
        catalog = AppCatalog(core: core)
        device = DeviceState(store: store)
        launches = LaunchCoordinator(core: core, device: device)
        pushes = PushDelivery(core: core, catalog: catalog, launches: launches, device: device)
        scheduling = SchedulingLoop(core: core, catalog: catalog, launches: launches, device: device, pushes: pushes)
        submissions = Submissions(core: core, device: device, launches: launches, scheduling: scheduling)
        var desktop: DesktopNotifier?
        if configuration.desktopNotifications {
            let (found, why) = DesktopNotifier.detect(environment: ProcessInfo.processInfo.environment, logger: logger)
            desktop = found
            if found == nil { logger.info("desktop notifications: off, \(why)") }
        }
        let foreground = launches.foreground
        notifications = LocalNotifications(core: core, desktop: desktop, inForeground: { app in foreground.withLock { $0[app] } })
        let device = self.device
        transfers = BackgroundTransfers(.init(
            store: store, clock: clock, stateDirectory: configuration.stateDirectory,
            identities: configuration.confine && geteuid() == 0 ? AppIdentities(stateDirectory: configuration.stateDirectory) : nil,
            conditions: { device.conditions() }, logger: logger,
            bounds: TransferBounds(diskReserveBytes: configuration.diskReserveBytes)))
        // An app's disk quota counts what its transfers hold in the host's staging.
        DiskAccounting.stagingUse.withLock { [transfers] in
            $0 = DiskAccounting.StagingMeter { app in
                let held = transfers.stagingUsage(app: app)
                return DiskUse(bytes: held.bytes, inodes: UInt64(held.inodes))
            }
        }
        verbs = ControlVerbs(core: core, catalog: catalog, device: device, launches: launches, scheduling: scheduling,
                             submissions: submissions, pushes: pushes, notifications: notifications)
        verbs.transfers = transfers
        let scheduling = self.scheduling
        transfers.onChange = { scheduling.requestEvaluation() }
        // Events up: a catalog change or an ended launch is a reason to look at the schedule.
        let (core, catalog, launches, submissions, notifications, transfers) = (core, catalog, launches, submissions, notifications, transfers)
        core.sync {
            scheduling.transfers = transfers
            catalog.onChange = { [weak self] in self?.launchesOrCatalogChanged() }
            launches.onEnded = { [weak self] in self?.launchesOrCatalogChanged() }
            launches.makeBroker = { HostRequestBroker(core: core, catalog: catalog, submissions: submissions, notifications: notifications, launchID: $0, transfers: transfers) }
        }
    }

    // MARK: Life cycle

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully: running launches are expired,
    /// killed after their grace if need be, and recorded.
    public func run() throws(BGTaskError) {
        let shutdownSignals = Self.blockShutdownSignals()
        // One thread takes SIGINT and SIGTERM, whichever thread the kernel would have given
        // them to: every thread of the host blocks them (the mask is inherited, and it was set
        // before any part started a thread), so they stay pending for this sigwait. (A
        // dispatch signal source lost them when the kernel picked a thread of SwiftNIO's.)
        // The thread exists before `start()` opens the control socket, so a host that answers
        // has all the threads it idles with (a client that counts them, as
        // ResourceBoundsTests does, counted this one late on a loaded machine); it takes the
        // signals only once the parts have started, and ends if they could not.
        let partsStarted = DispatchSemaphore(value: 0)
        let serving = LockedValue(false)
        let waiter = Thread { [self] in
            partsStarted.wait()
            guard serving.withLock({ $0 }) else { return }
            var waitedFor = shutdownSignals
            while true {
                var signalNumber: Int32 = 0
                guard sigwait(&waitedFor, &signalNumber) == 0 else { continue }
                core.logger.info("signal received: shutting down", metadata: ["signal": "\(signalNumber)"])
                self.beginShutdown()
            }
        }
        waiter.name = "bgtask-signals"
        waiter.start()
        do {
            try start()
        } catch {
            partsStarted.signal()
            throw error
        }
        serving.withLock { $0 = true }
        partsStarted.signal()
        stopped.wait()
    }

    /// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it starts from
    /// now on), and returns the set: `bgtask host` calls it first thing, before any thread
    /// exists, and `run()` waits for them with sigwait. Launches unblock every signal.
    @discardableResult
    public static func blockShutdownSignals() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGTERM)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        return set
    }

    /// Starts serving without blocking (tests drive a host this way too): the launches a dead
    /// host left are recovered, the catalog read, the first scheduling pass queued, and the
    /// control socket served last (a client it answers finds the host whole).
    public func start() throws(BGTaskError) {
        // A peer that closes its end (a control client, a FIFO a launch left where the host
        // writes) is EPIPE for the call, never a signal that kills the host. Launches start
        // with every signal at its default (posix_spawn's SETSIGDEF; the zygote's spares reset
        // theirs), so they do not inherit this.
        signal(SIGPIPE, SIG_IGN)
        // Every child this process adopts (a killed launch's orphans and zombies) is its own to
        // reap: nothing else here starts processes.
        LaunchSupervisor.adoptsEveryChild = true
        let verbs = self.verbs
        // The control socket is a new inode: on a filesystem an app left without any, one of
        // the reserve's spares is given up for it (see StoreReserve).
        core.store.reserve?.freeInodeIfNoneLeft()
        let server = try ControlServer(
            path: configuration.stateDirectory.appendingPathComponent("control.sock").path, logger: core.logger,
            handler: { commands, peer, reply in verbs.handle(commands, peer: peer, reply: reply) })
        server.limits = configuration.controlLimits
        var list: [HostPart] = [launches, catalog]
        if let (address, port) = configuration.apnsEndpoint {
            let scheduling = self.scheduling
            list.append(APNsEndpoint(options: .init(host: address, port: port, tls: configuration.apnsTLS, providerKeys: configuration.apnsProviderKeys, teamID: configuration.apnsTeamID, limits: configuration.apnsLimits), core: core, pushes: pushes, evaluate: { scheduling.evaluate() }))
        }
        if let options = configuration.dashboard {
            list.append(DashboardPart(options: options, verbs: verbs, launches: launches, logger: core.logger))
        }
        // Before scheduling: its first pass sees the transfers a previous host left.
        list.append(transfers)
        list.append(scheduling)
        list.append(notifications)
        // The control socket last: a client that is answered (HostProcess's readiness probe,
        // `bgtask host` scripts) finds every part started, with its threads (SwiftNIO's event
        // loops and thread pool for transfers and pushes, the dispatch workers of the first
        // scheduling and notification passes), and no verb reaches a part not yet started. It
        // also stops first, so no request reaches a part already stopped.
        list.append(server)
        let logger = core.logger
        do {
            // On the queue, as the parts' state is: nothing else runs there yet.
            try core.sync { [self] () throws(BGTaskError) in
                let parts = HostParts(list, logger: logger)
                self.parts = parts
                try parts.start()
            }
        } catch {
            // Bound and listening since `ControlServer.init`, but never started: a client
            // must not wait on a socket nobody will accept on.
            server.stop()
            throw error
        }
        core.logger.info("host started", metadata: [
            "plugins": "\(configuration.pluginsDirectory.path)", "state": "\(configuration.stateDirectory.path)",
            "policy": "\(configuration.policy.rawValue)", "clock": "\(configuration.clock.rawValue)",
        ])
    }

    /// Begins a graceful shutdown; `run()` returns when it is complete.
    public func beginShutdown() {
        core.async { [self] in
            guard !shuttingDown else { return }
            shuttingDown = true
            scheduling.stop()
            launches.shutdownAll(reason: "the host is shutting down")
            finishShutdownIfIdle()
        }
    }

    @HostActor private func launchesOrCatalogChanged() {
        // One pass for all the launches that end in a burst (queued behind them on the queue,
        // not run once per launch: a thousand expiring at once made a thousand passes).
        if shuttingDown { finishShutdownIfIdle() } else { scheduling.requestEvaluation() }
    }

    @HostActor private func finishShutdownIfIdle() {
        guard shuttingDown, !finished, launches.isEmpty else { return }
        finished = true
        parts?.stop()
        core.logger.info("host stopped")
        stopped.signal()
    }

    /// Blocks until a `start()`ed host has shut down.
    public func waitUntilStopped() { stopped.wait() }
}

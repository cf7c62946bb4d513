import ArgumentParser
import BGTaskDashboard
import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

extension BGTaskCommand {
    struct Host: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "host",
            abstract: "Run the host daemon in the foreground until SIGINT or SIGTERM.",
            discussion: """
                Watches the plugin directory (bundles dropped or moved in are validated and \
                loaded, invalid ones reported and skipped, removed ones' pending requests \
                dropped), keeps requests in STATE/bgtask.sqlite, launches apps when their \
                requests are due and their conditions hold, and serves the other verbs on \
                STATE/control.sock. On SIGINT/SIGTERM running launches are expired, killed \
                after their grace if need be, and recorded.
                """)

        @Option(name: .long, help: ArgumentHelp("The plugin directory (Name.app bundles).", valueName: "dir"), completion: .directory)
        var plugins: String

        @Option(name: .long, help: "immediate (run as soon as eligible) or realistic (rate limits and penalties).")
        var policy: SchedulingPolicy = .immediate

        @Option(name: .long, help: "real, or virtual (time moves only with `bgtask clock advance`).")
        var clock: HostClock.Mode = .real

        @Option(name: .customLong("max-launches"), help: "Simultaneous launches at most.")
        var maxLaunches = 2

        @Option(name: .customLong("max-continued"), help: "Continued-processing tasks running at once, over all apps.")
        var maxContinued = 2

        @Option(name: .long, help: ArgumentHelp("Expire a continued-processing task whose progress has not changed for this long. Default: 1m.", valueName: "duration"), transform: DurationArgument.parse)
        var stall: DurationArgument?

        @Option(name: .customLong("foreground-stay"), help: ArgumentHelp("How long an opened app stays in the foreground after launching. Default: 1s.", valueName: "duration"), transform: DurationArgument.parse)
        var foregroundStay: DurationArgument?

        @Option(name: .customLong("history-per-app"), help: "Ended launches kept in each app's history (`bgtask history`); older ones and their records are deleted as launches end.")
        var historyPerApp = 1000

        @Option(name: .long, help: "zygote (fork each launch from a pre-warmed launcher: the fast path) or spawn (posix_spawn the runner each time).")
        var launcher: Launcher = .zygote

        @Option(name: .customLong("app-lifecycle"), help: "ios (an app's process is suspended when a launch's work is over and resumed by its next launch, as on iOS) or fresh (a new process per launch). Default: ios.")
        var appLifecycle: AppLifecycle = .ios

        @Option(name: .customLong("suspended-memory"), help: ArgumentHelp("The most memory suspended apps may hold together (their private pages); past it the least recently used are evicted. Default: a quarter of the machine's memory.", valueName: "size"))
        var suspendedMemory: ByteCountArgument?

        @Option(name: .customLong("max-suspended-apps"), help: "Apps suspended at once at most; past it the least recently used is evicted. Default: 1000.")
        var maxSuspendedApps = 1000

        @Option(name: .customLong("max-connections"), help: "Control connections served at once; the next one is refused with too-many-connections. Default: 64.")
        var maxConnections = 64

        @Option(name: .customLong("request-timeout"), help: ArgumentHelp("A control request must arrive whole within this of its first byte (and an answer be read within it). Default: 5s.", valueName: "duration"), transform: DurationArgument.parse)
        var requestTimeout: DurationArgument?

        @Option(name: .customLong("idle-timeout"), help: ArgumentHelp("A control connection idle this long between requests is closed. Default: 30s.", valueName: "duration"), transform: DurationArgument.parse)
        var idleTimeout: DurationArgument?

        @Option(name: .customLong("store-reserve"), help: ArgumentHelp("Disk the host keeps allocated in its state directory for its own records (0 for none): released when the disk is full so that run records and acknowledged requests are still written; new submissions are refused (disk full) until it is back. Default: 8 MiB.", valueName: "size"))
        var storeReserve: ByteCountArgument?

        @Flag(name: .customLong("log-private"), help: "Keep private values in launches' unified-logging entries (Logger, os_log) instead of <private>, as a device with private data enabled does.")
        var logPrivate = false

        @Option(name: .customLong("apns-port"), help: ArgumentHelp("Serve an APNs-compatible provider endpoint on this port (HTTP/2 cleartext, prior knowledge): POST /3/device/TOKEN with APNs's headers delivers a push. 0: any free port (logged). Off by default.", valueName: "port"))
        var apnsPort: Int?

        @Option(name: .customLong("apns-address"), help: ArgumentHelp("The address the APNs endpoint listens on. Default: 127.0.0.1 (loopback only).", valueName: "address"))
        var apnsAddress = "127.0.0.1"

        @Option(name: .customLong("apns-tls-certificate"), help: ArgumentHelp("With --apns-tls-key: serve the APNs endpoint over TLS (ALPN h2, as APNs does), with this PEM certificate chain.", valueName: "pem"), completion: .file())
        var apnsTLSCertificate: String?

        @Option(name: .customLong("apns-tls-key"), help: ArgumentHelp("The APNs endpoint's PEM private key (with --apns-tls-certificate).", valueName: "pem"), completion: .file())
        var apnsTLSKey: String?

        @Option(name: .customLong("apns-auth-key"), help: ArgumentHelp("Require provider tokens (JWT, ES256) on the APNs endpoint, signed with this key: KEY_ID:FILE, the provider's .p8 file (or its public key, PEM). Repeat for more keys. Without it every request is accepted.", valueName: "key-id:file"))
        var apnsAuthKeys: [String] = []

        @Option(name: .customLong("apns-team-id"), help: ArgumentHelp("With --apns-auth-key: the team identifier a provider token's iss must name.", valueName: "team"))
        var apnsTeamID: String?

        @Option(name: .customLong("apns-max-connections"), help: "APNs endpoint connections open at once; one more is closed as it is accepted (logged). Default: 256.")
        var apnsMaxConnections = APNsEndpointLimits().maximumConnections

        @Option(name: .customLong("apns-max-streams"), help: "HTTP/2 streams open at once on one APNs endpoint connection (SETTINGS_MAX_CONCURRENT_STREAMS). Default: 100.")
        var apnsMaxStreams = APNsEndpointLimits().maximumStreamsPerConnection

        @Option(name: .customLong("apns-handshake-timeout"), help: ArgumentHelp("An APNs endpoint connection whose TLS handshake has not finished this long after it was accepted is closed. Default: 10s.", valueName: "duration"), transform: DurationArgument.parse)
        var apnsHandshakeTimeout: DurationArgument?

        @Option(name: .customLong("apns-request-timeout"), help: ArgumentHelp("An APNs endpoint stream whose request has not ended this long after it began is reset. Default: 10s.", valueName: "duration"), transform: DurationArgument.parse)
        var apnsRequestTimeout: DurationArgument?

        @Option(name: .customLong("apns-idle-timeout"), help: ArgumentHelp("An APNs endpoint connection with no open stream for this long is closed. Default: 60s.", valueName: "duration"), transform: DurationArgument.parse)
        var apnsIdleTimeout: DurationArgument?

        @Flag(name: .customLong("allow-notifications"), help: "Authorize local notifications for every app whose own switch (bgtask device --app A --notifications) is not off. Default: denied, as on a fresh device.")
        var allowNotifications = false

        @Option(name: .customLong("http-port"), help: ArgumentHelp("Serve the dashboard (a live timeline of launches, apps, pending requests and why, each launch's record and log) and /metrics (Prometheus) on this port. 0: any free port (logged). Off by default.", valueName: "port"))
        var httpPort: Int?

        @Option(name: .customLong("http-address"), help: ArgumentHelp("The address the dashboard listens on. Default: 127.0.0.1 (loopback only); any other needs --http-token-file.", valueName: "address"))
        var httpAddress = "127.0.0.1"

        @Option(name: .customLong("http-token-file"), help: ArgumentHelp("A file holding the token every dashboard client off loopback must present (Authorization: Bearer TOKEN, or ?token= once). At least 16 characters; the file must not be readable by others.", valueName: "file"), completion: .file())
        var httpTokenFile: String?

        @Flag(name: .customLong("http-actions"), help: "Let the dashboard act (simulate a launch or an expiration, push, change the device's conditions, advance a virtual clock, cancel a request). Read-only without it.")
        var httpActions = false

        @Flag(name: .customLong("no-desktop-notifications"), help: "Do not post delivered notifications to the desktop (org.freedesktop.Notifications), even where a session bus is present.")
        var noDesktopNotifications = false

        @OptionGroup var limits: LimitOptions

        @OptionGroup var options: StateOptions

        func validate() throws {
            if let apnsPort, !(0...65535).contains(apnsPort) { throw ValidationError("--apns-port must be 0 to 65535, not \(apnsPort)") }
            if (apnsTLSCertificate == nil) != (apnsTLSKey == nil) { throw ValidationError("--apns-tls-certificate and --apns-tls-key go together") }
            for key in apnsAuthKeys {
                let parts = key.split(separator: ":", maxSplits: 1)
                if parts.count != 2 || parts[0].isEmpty || parts[1].isEmpty { throw ValidationError("--apns-auth-key takes KEY_ID:FILE, not '\(key)'") }
            }
            if apnsTeamID != nil && apnsAuthKeys.isEmpty { throw ValidationError("--apns-team-id needs --apns-auth-key") }
            if apnsTLSCertificate != nil && apnsPort == nil { throw ValidationError("--apns-tls-certificate needs --apns-port") }
            if let httpPort, !(0...65535).contains(httpPort) { throw ValidationError("--http-port must be 0 to 65535, not \(httpPort)") }
            if httpPort == nil && (httpTokenFile != nil || httpActions) { throw ValidationError("--http-token-file and --http-actions need --http-port") }
            guard maxLaunches >= 1 else { throw ValidationError("--max-launches must be at least 1") }
            guard maxContinued >= 1 else { throw ValidationError("--max-continued must be at least 1") }
            guard historyPerApp >= 1 else { throw ValidationError("--history-per-app must be at least 1") }
            guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
            guard apnsMaxConnections >= 1 else { throw ValidationError("--apns-max-connections must be at least 1") }
            guard (1...10_000).contains(apnsMaxStreams) else { throw ValidationError("--apns-max-streams must be 1 to 10000, not \(apnsMaxStreams)") }
            for (name, value) in [("--apns-handshake-timeout", apnsHandshakeTimeout), ("--apns-idle-timeout", apnsIdleTimeout),
                                 ("--apns-request-timeout", apnsRequestTimeout)] where value?.duration == .zero {
                throw ValidationError("\(name) must be more than 0")
            }
            for (name, value) in [("--request-timeout", requestTimeout), ("--idle-timeout", idleTimeout)] where value?.duration == .zero {
                throw ValidationError("\(name) must be more than 0")
            }
        }

        /// `BGTASK_EXIT_WITH_PARENT=PID` (the test suite sets it): shut down gracefully, as on
        /// SIGTERM, when process PID ends, so a test process that dies cannot leave its hosts
        /// behind. Watched through a pidfd (PR_SET_PDEATHSIG follows the spawning thread, which a
        /// thread pool may end while the process lives on).
        static func exitWithParent(logger: Logger) -> DispatchSourceRead? {
            guard let text = ProcessInfo.processInfo.environment["BGTASK_EXIT_WITH_PARENT"], let parent = pid_t(text), parent > 1 else { return nil }
            let descriptor = bgtask_pidfd_open(parent)
            guard descriptor >= 0 else {
                logger.warning("BGTASK_EXIT_WITH_PARENT=\(text): no such process; shutting down")
                kill(getpid(), SIGTERM)
                return nil
            }
            let source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: .global())
            source.setEventHandler {
                logger.info("process \(parent) (BGTASK_EXIT_WITH_PARENT) ended: shutting down")
                kill(getpid(), SIGTERM)
            }
            source.setCancelHandler { close(descriptor) }
            source.resume()
            return source
        }

        func run() throws {
            // Before any thread exists: every thread inherits the mask (TaskHost.run waits for them).
            TaskHost.blockShutdownSignals()
            var configuration = TaskHost.Configuration(
                pluginsDirectory: URL(fileURLWithPath: plugins).standardizedFileURL,
                stateDirectory: options.stateDirectory.standardizedFileURL)
            configuration.policy = policy
            configuration.clock = clock
            configuration.maximumConcurrentLaunches = maxLaunches
            configuration.maximumContinuedTasks = maxContinued
            configuration.useZygote = launcher == .zygote
            configuration.historyPerApp = historyPerApp
            configuration.logPrivateValues = logPrivate
            configuration.apnsEndpoint = apnsPort.map { (apnsAddress, $0) }
            if let httpPort {
                configuration.dashboard = DashboardOptions(address: httpAddress, port: httpPort, token: try httpTokenFile.map(Self.readToken),
                                                           actions: httpActions)
            }
            if let apnsTLSCertificate, let apnsTLSKey { configuration.apnsTLS = (apnsTLSCertificate, apnsTLSKey) }
            for key in apnsAuthKeys {
                let parts = key.split(separator: ":", maxSplits: 1).map(String.init)
                configuration.apnsProviderKeys[parts[0]] = parts[1]
            }
            configuration.apnsTeamID = apnsTeamID
            configuration.apnsLimits.maximumConnections = apnsMaxConnections
            configuration.apnsLimits.maximumStreamsPerConnection = apnsMaxStreams
            if let apnsHandshakeTimeout { configuration.apnsLimits.handshakeTimeout = apnsHandshakeTimeout.duration }
            if let apnsIdleTimeout { configuration.apnsLimits.idleTimeout = apnsIdleTimeout.duration }
            if let apnsRequestTimeout { configuration.apnsLimits.requestTimeout = apnsRequestTimeout.duration }
            configuration.allowNotifications = allowNotifications
            configuration.desktopNotifications = !noDesktopNotifications
            if let stall { configuration.progressStallInterval = stall.duration }
            if let foregroundStay { configuration.foregroundStay = foregroundStay.duration }
            configuration.budget = limits.budget?.duration
            configuration.grace = limits.grace?.duration
            configuration.memoryLimitBytes = limits.memoryLimit?.bytes
            if let logLimit = limits.logLimit { configuration.logLimitBytes = logLimit.bytes }
            if let reserve = limits.diskReserve { configuration.diskReserveBytes = reserve.bytes }
            if let cpuLimit = limits.cpuLimit { configuration.cpuLimit = cpuLimit.limit }
            configuration.diskQuota = limits.quota
            if let storeReserve { configuration.storeReserveBytes = storeReserve.bytes }
            configuration.appLifecycle = appLifecycle
            configuration.suspendedMemoryBytes = suspendedMemory?.bytes
            configuration.maximumSuspendedApps = max(maxSuspendedApps, 0)
            configuration.controlLimits.maximumConnections = maxConnections
            if let requestTimeout { configuration.controlLimits.requestTimeout = requestTimeout.duration }
            if let idleTimeout { configuration.controlLimits.idleTimeout = idleTimeout.duration }
            var logger = options.makeLogger()
            if !options.verbose && ProcessInfo.processInfo.environment["BGTASK_LOG_LEVEL"] == nil { logger.logLevel = .info }
            logger.info("bgtask \(BGTaskVersion.current) host: plugins \(configuration.pluginsDirectory.path), state \(configuration.stateDirectory.path)")
            // Before the host starts any process: `auto` moves this one into a leaf cgroup.
            configuration.cgroupRoot = try limits.cgroupRoot(logger: logger)
            configuration.processLimit = limits.processLimit
            configuration.confine = limits.sandbox != .off
            configuration.sandboxFailsClosed = limits.sandbox == .required
            let parentWatch = Self.exitWithParent(logger: logger)
            defer { parentWatch?.cancel() }
            do {
                let host = try TaskHost(configuration: configuration, logger: logger)
                try host.run()
            } catch {
                printError(error.description)
                throw ExitCode(1)
            }
        }
    }
}

extension SchedulingPolicy: ExpressibleByArgument {}
extension HostClock.Mode: ExpressibleByArgument {}
extension SandboxMode: ExpressibleByArgument {}
extension AppLifecycle: ExpressibleByArgument {}

extension BGTaskCommand.Host {
    /// The dashboard's token from its file: one line, at least 16 characters, in a file no
    /// one but its owner can read.
    static func readToken(_ path: String) throws -> String {
        var info = stat()
        guard stat(path, &info) == 0 else { throw ValidationError("--http-token-file \(path): \(String(cString: strerror(errno)))") }
        guard info.st_mode & 0o077 == 0 else {
            throw ValidationError("--http-token-file \(path): readable or writable by others (mode \(String(info.st_mode & 0o777, radix: 8))); chmod 600 it")
        }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw ValidationError("--http-token-file \(path): not readable UTF-8 text") }
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard token.count >= 16, !token.contains(where: { $0.isWhitespace || $0 == ";" }) else {
            throw ValidationError("--http-token-file \(path): the token must be one word of at least 16 characters")
        }
        return token
    }
}

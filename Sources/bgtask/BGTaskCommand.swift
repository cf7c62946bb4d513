import ArgumentParser
import BGTaskHost
import BGTaskLaunch
import BGTaskModel
import Foundation
import Logging

@main
struct BGTaskCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bgtask",
        abstract: "Apple's BackgroundTasks on Linux: run, inspect and drive background task plugins.",
        discussion: """
            Plugins are shared libraries in bundles (Name.app with an Info.plist). Every launch \
            runs in its own supervised child process and ends in a run record. Durations are \
            written 90s, 250ms, 15m, 1h30m, 1d (units d, h, m, s, ms, largest first) or as plain \
            seconds. Shell completions: bgtask --generate-completion-script bash|zsh|fish.
            """,
        version: BGTaskVersion.current,
        subcommands: [Run.self, Bundle.self, Validate.self, Host.self, Apps.self, Submit.self, Pending.self, Cancel.self,
                      CancelAll.self, SimulateLaunch.self, SimulateExpire.self, Evict.self, History.self, Why.self, Device.self, Clock.self,
                      Extension.self, Open.self, Progress.self, CancelTask.self, Push.self, Pushes.self, DeviceToken.self, Transfers.self, Notifications.self, Respond.self, Metrics.self, Top.self, Log.self, Doctor.self]
    )
}

/// Options every verb that touches state shares.
struct StateOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp(
        "The state directory (app containers, logs, the database).",
        discussion: "Default: $BGTASK_STATE, else /var/lib/bgtask as root, else $XDG_STATE_HOME/bgtask, else ~/.local/state/bgtask.",
        valueName: "dir"), completion: .directory)
    var state: String?

    @Flag(name: .shortAndLong, help: "Log what the host does to stderr.")
    var verbose = false

    var stateDirectory: URL {
        if let state { return URL(fileURLWithPath: state) }
        let environment = ProcessInfo.processInfo.environment
        if let path = environment["BGTASK_STATE"], !path.isEmpty { return URL(fileURLWithPath: path) }
        // Root's: the system's state, where the apps' own uids can reach their containers (a
        // 0700 home cannot be searched by them; see ContainerReach).
        if geteuid() == 0 { return URL(fileURLWithPath: Self.rootStateDirectory) }
        if let xdg = environment["XDG_STATE_HOME"], !xdg.isEmpty {
            return URL(fileURLWithPath: xdg).appendingPathComponent("bgtask")
        }
        return FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".local/state/bgtask")
    }

    /// A root user's default state directory (the systemd unit's `StateDirectory=bgtask`).
    static let rootStateDirectory = "/var/lib/bgtask"

    /// A logger at the default level, for code that runs before the options are read.
    static func fallbackLogger() -> Logger {
        var logger = Logger(label: "bgtask", factory: LogDestination.makeHandler)
        logger.logLevel = ProcessInfo.processInfo.environment["BGTASK_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .warning
        return logger
    }

    func makeLogger() -> Logger {
        var logger = Logger(label: "bgtask", factory: LogDestination.makeHandler)
        let level = ProcessInfo.processInfo.environment["BGTASK_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:))
        logger.logLevel = verbose ? .debug : level ?? .warning
        return logger
    }
}

/// Where the CLI and the host log: stderr as text, or the journal in its structured form when
/// stderr is a journal stream (systemd's `JOURNAL_STREAM` rule; `BGTASK_LOG_FORMAT=text` or
/// `journal` forces one), decided once per process.
enum LogDestination {
    /// The journal's socket, opened once; nil for stderr.
    static let journal: JournalSocket? = {
        let (destination, warning) = JournalLogHandler.destination(
            environment: ProcessInfo.processInfo.environment, stderr: .standardError())
        if let warning { printError(warning) }
        guard case .journal(let path) = destination else { return nil }
        do { return try JournalSocket.open(path: path) } catch {
            let logger = Logger(label: "bgtask") { StreamLogHandler.standardError(label: $0) }
            logger.warning("cannot log to the journal, logging to stderr instead: \(error)")
            return nil
        }
    }()

    @Sendable static func makeHandler(label: String) -> any LogHandler {
        guard let journal else { return StreamLogHandler.standardError(label: label) }
        return JournalLogHandler(socket: journal)
    }
}

/// Launch limits `run` and `host` share.
struct LimitOptions: ParsableArguments {
    @Flag(name: .customLong("no-sandbox"), help: "Run launches without confinement (Landlock, the system-call filter, no_new_privs): for debugging a plugin the sandbox stops. Records say so. The same as --sandbox off.")
    var noSandbox = false

    @Option(name: .customLong("sandbox"), help: ArgumentHelp(
        "How much confinement every launch must have: required, best-effort or off.",
        discussion: "required (the default): every layer this machine offers (bgtask doctor lists them), or the launch fails with the reason. best-effort: a layer that cannot be applied is named in the record and the launch runs without it. off: as --no-sandbox.",
        valueName: "mode"))
    var sandboxMode: SandboxMode?

    /// The mode asked for: `--no-sandbox` is `off`.
    var sandbox: SandboxMode { noSandbox ? .off : sandboxMode ?? .required }

    @Option(name: .long, help: ArgumentHelp("The launch's time budget (e.g. 30s, 2m, 1h30m). Default: 30s for refresh, 10m for processing.", valueName: "duration"), transform: DurationArgument.parse)
    var budget: DurationArgument?

    @Option(name: .long, help: ArgumentHelp("Time from expiration to the watchdog kill (e.g. 5s, 500ms). Default: 5s.", valueName: "duration"), transform: DurationArgument.parse)
    var grace: DurationArgument?

    @Option(name: .customLong("memory-limit"), help: ArgumentHelp("Kill a launch when its resident memory crosses this (e.g. 50MB). Default: 256 MiB for refresh, 1 GiB for processing.", valueName: "size"))
    var memoryLimit: ByteCountArgument?

    @Option(name: .customLong("log-limit"), help: ArgumentHelp("The most a launch's log keeps (e.g. 1MiB); later output is read and discarded, and the record says how much. Default: 16 MiB.", valueName: "size"))
    var logLimit: ByteCountArgument?

    @Option(name: .customLong("disk-reserve"), help: ArgumentHelp("Free space to keep on the filesystem of the apps' containers (e.g. 1GB, 0 for none): a launch that writes while there is less is killed, and its record says so (disk). Default: 64 MiB.", valueName: "size"))
    var diskReserve: ByteCountArgument?

    @Option(name: .customLong("disk-quota"), help: ArgumentHelp("What each app's containers (its own and its app groups') and transfer staging may hold (e.g. 500MB, 0 for no limit): an app over it is not launched, a launch that passes it is killed (disk-quota), and records say so. Default: 1 GiB.", valueName: "size"))
    var diskQuota: ByteCountArgument?

    @Option(name: .customLong("cpu-limit"), help: ArgumentHelp("The background CPU limit: a launch that uses more than PERCENT of a core over any trailing DURATION is killed (cpu-limit), as iOS's CPU monitor kills a background app; processing tasks on external power and foreground launches are exempt. off: none. Default: 80%/60s, iOS's.", valueName: "percent/duration"), transform: CPULimitArgument.parse)
    var cpuLimit: CPULimitArgument?

    @Option(name: .customLong("disk-quota-inodes"), help: ArgumentHelp("How many files and directories each app's containers and staging may hold (0 for no limit), enforced as --disk-quota is. Default: 100000.", valueName: "count"))
    var diskQuotaInodes: UInt64?

    /// The disk quota these options give (the defaults for what is not given).
    var quota: DiskQuota {
        DiskQuota(bytes: diskQuota?.bytes ?? DiskQuota.defaultBytes, inodes: diskQuotaInodes ?? DiskQuota.defaultInodes)
    }

    @Option(name: .long, help: ArgumentHelp(
        "A delegated cgroup v2 directory, or auto: a child cgroup per launch with memory.max (instead of sampling), pids.max and cgroup.kill.",
        discussion: "auto uses the cgroup this process was started in when it is delegated to it (systemd's Delegate=yes), else says why and samples.",
        valueName: "dir|auto"), completion: .directory)
    var cgroup: String?

    @Option(name: .customLong("max-processes"), help: ArgumentHelp(
        "With --cgroup: the most processes and threads a launch may have at once (pids.max; 0 for no limit). Default: \(LaunchSupervisor.defaultProcessLimit).",
        valueName: "n"))
    var maxProcesses: Int?

    func validate() throws {
        if let maxProcesses, maxProcesses < 0 { throw ValidationError("--max-processes must be 0 (no limit) or more") }
    }

    /// The process limit for each launch's cgroup: nil for none.
    var processLimit: Int? {
        let limit = maxProcesses ?? LaunchSupervisor.defaultProcessLimit
        return limit > 0 ? limit : nil
    }

    /// The `--cgroup` directory launches get their groups under, if any: validated, or for
    /// `auto` the delegated cgroup claimed (nil, and a log line saying why, without one).
    func cgroupRoot(logger: Logger? = nil) throws -> URL? {
        guard let cgroup else { return nil }
        if cgroup == "auto" {
            return LaunchSupervisor.claimDelegatedCgroup(logger: logger ?? StateOptions.fallbackLogger())
        }
        let root = URL(fileURLWithPath: cgroup)
        do {
            for note in try LaunchSupervisor.validateCgroupRoot(root) { printError("--cgroup: \(note)") }
        } catch {
            printError("--cgroup: \(error)")
            throw ExitCode.validationFailure
        }
        return root
    }
}

/// Exit statuses of the CLI (documented in docs/cli.md).
enum Status {
    /// A bundle or Info.plist is invalid (EX_DATAERR).
    static let invalidBundle = ExitCode(65)
    /// The launch could not be started (EX_UNAVAILABLE).
    static let cannotLaunch = ExitCode(69)
}

func printError(_ text: String) {
    FileHandle.standardError.write(Data("bgtask: \(text)\n".utf8))
}

import ArgumentParser
import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskLaunch
import BGTaskModel
import Foundation

extension BGTaskCommand {
    struct Run: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Launch an app in a supervised child process, run tasks, print the run record.",
            discussion: """
                The app is loaded only in the child. Its launch entry registers handlers, the \
                named tasks run with the task class of their type, and the launch ends when all \
                of them have completed, expired past the grace period (watchdog) or crossed \
                the memory limit (jetsam). Exit status: 0 when every task succeeded, 1 when \
                not, 65 for an invalid bundle, 69 when the launch cannot start.
                """)

        @Argument(help: "The app bundle (Name.app).", completion: .directory)
        var bundle: String

        @Option(name: .long, help: ArgumentHelp(
            "A task to run: IDENTIFIER or IDENTIFIER:TYPE. Repeat to run several in one launch.",
            valueName: "identifier[:type]"))
        var task: [TaskArgument] = []

        @Option(name: .long, help: ArgumentHelp(
            "The task type for tasks given without one (refresh, processing, health-research, continued-processing).",
            discussion: "Default: from the bundle's UIBackgroundModes; with both fetch and processing, from the identifier's pending request, else its past launches, on the host at --state (or in its database there), when they give one type.",
            valueName: "type"))
        var type: TaskKind?

        @Option(name: .customLong("expire-after"), help: ArgumentHelp("Deliver expiration this long after launch (simulates the budget running out), e.g. 1s, 250ms.", valueName: "duration"), transform: DurationArgument.parse)
        var expireAfter: DurationArgument?

        @Option(name: .long, help: "The reason recorded for the launch (simulated, scheduled, foreground, ...).")
        var reason = "simulated"

        @Flag(name: .long, help: "Print the run record as one JSON object.")
        var json = false

        @Flag(name: .customLong("log-private"), help: "Keep private values in the launch's unified-logging entries (Logger, os_log) instead of <private>, as a device with private data enabled does.")
        var logPrivate = false
        @Option(name: .long, help: ArgumentHelp("Local notifications for this launch: on (authorized) or off (denied). Default: not determined until the app asks, then denied, as on a fresh device.", valueName: "on|off"))
        var notifications: Switch?

        @OptionGroup var limitOptions: LimitOptions
        @OptionGroup var options: StateOptions

        func validate() throws {
            guard !task.isEmpty else { throw ValidationError("name at least one task: --task IDENTIFIER") }
        }

        func run() throws {
            let url = URL(fileURLWithPath: bundle).standardizedFileURL
            let app: PluginBundle
            do { app = try BundleReader.read(url) } catch {
                printError(error.description)
                throw Status.invalidBundle
            }
            var assignments: [TaskAssignment] = []
            var history: TaskHistory?
            for (index, requested) in task.enumerated() {
                guard app.permits(requested.identifier) else {
                    printError("\(app.infoPlistURL.path): key BGTaskSchedulerPermittedIdentifiers: '\(requested.identifier)' is not permitted (permitted: \(app.permittedIdentifiers.joined(separator: ", ")))")
                    throw ExitCode.validationFailure
                }
                let kind: TaskKind
                if let explicit = requested.kind ?? type {
                    kind = explicit
                } else if app.backgroundModes.isSuperset(of: ["fetch", "processing"]) && !app.isContinuedProcessingIdentifier(requested.identifier) {
                    // Both modes: the bundle alone does not say. The identifier's history may.
                    if history == nil { history = TaskHistory.read(app: app.identifier, state: options.stateDirectory) }
                    switch history!.kind(of: requested.identifier) {
                    case .resolved(let found, let source):
                        kind = found
                        printError("--task \(requested.identifier): \(found.rawValue), from \(source) (pass --task \(requested.identifier):TYPE to choose)")
                    case .unresolved(let why):
                        printError("""
                            --task \(requested.identifier): the type is ambiguous: \(app.infoPlistURL.path) has both fetch and \
                            processing in UIBackgroundModes, and \(why). Pass it: --task \(requested.identifier):refresh \
                            (or :processing, :health-research), or --type TYPE for every task given without one
                            """)
                        throw ExitCode.validationFailure
                    }
                } else {
                    do { kind = try app.inferredKind(of: requested.identifier) } catch {
                        printError(error.description)
                        throw ExitCode.validationFailure
                    }
                }
                assignments.append(TaskAssignment(task: UInt64(index + 1), identifier: requested.identifier, kind: kind))
            }
            var limits = LaunchLimits.defaults(for: assignments.map(\.kind))
            if let budget = limitOptions.budget { limits.budget = budget.duration }
            if let grace = limitOptions.grace { limits.grace = grace.duration }
            if let memoryLimit = limitOptions.memoryLimit { limits.memoryLimitBytes = memoryLimit.bytes }
            if let logLimit = limitOptions.logLimit { limits.logLimitBytes = logLimit.bytes }
            if let reserve = limitOptions.diskReserve { limits.diskReserveBytes = reserve.bytes }
            if let cpuLimit = limitOptions.cpuLimit {
                limits.cpuLimit = cpuLimit.limit
                if cpuLimit.limit == nil { limits.cpuLimitExemption = "--cpu-limit off" }
            } else if assignments.contains(where: { $0.kind.isProcessing }),
                      MachineConditionsReader().externalPower() {
                // As the host does, as iOS does: no CPU monitor for processing work on external power.
                limits.cpuLimit = nil
                limits.cpuLimitExemption = "a processing task on external power"
            }
            limits.diskQuota = limitOptions.quota

            let state = options.stateDirectory
            // As the host does: an owner-only state directory, SIGPIPE a write error rather than
            // death (a FIFO or a closed reader must not cost the record), and every child this
            // process adopts reaped (it starts none but the runner).
            do {
                if let warning = try StateDirectory.prepare(state) { printError(warning) }
            } catch {
                printError(error.description)
                throw Status.cannotLaunch
            }
            signal(SIGPIPE, SIG_IGN)
            LaunchSupervisor.adoptsEveryChild = true
            let launchID = LaunchPlan.newLaunchID()
            let plan = LaunchPlan(
                bundle: app, tasks: assignments, reason: LaunchReason(rawValue: reason), limits: limits,
                expireAfter: expireAfter?.duration, launchID: launchID,
                dataDirectory: state.appendingPathComponent("containers").appendingPathComponent(app.identifier),
                logFile: state.appendingPathComponent("logs").appendingPathComponent("\(launchID).log"),
                environment: LaunchPlan.unifiedLoggingEnvironment(keepingPrivateValues: logPrivate))
            var supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: options.makeLogger())
            supervisor.cgroupRoot = try limitOptions.cgroupRoot(logger: supervisor.logger)
            supervisor.processLimit = limitOptions.processLimit
            supervisor.confine = limitOptions.sandbox != .off
            supervisor.sandboxFailsClosed = limitOptions.sandbox == .required
            if supervisor.confine && geteuid() == 0 {
                do { try ContainerReach.check(stateDirectory: state.path) } catch {
                    printError(error.description)
                    throw Status.cannotLaunch
                }
                supervisor.identities = AppIdentities(stateDirectory: state)
            }
            let record: RunRecord
            do { record = try supervisor.run(plan, broker: InMemoryRequestBroker(notificationsAllowed: notifications.map { $0 == .on })) } catch {
                printError(error.description)
                throw Status.cannotLaunch
            }
            if json {
                FileHandle.standardOutput.write(try record.jsonData())
                FileHandle.standardOutput.write(Data("\n".utf8))
            } else {
                print(record)
            }
            if !record.succeeded { throw ExitCode.failure }
        }
    }
}

/// What the state directory knows of an app's task identifiers: its pending requests and the
/// tasks of its past launches, from the host that answers on STATE/control.sock, else from the
/// host's database (STATE/bgtask.sqlite) when there is one. `run` asks it for the type of an
/// identifier its bundle leaves open (both `fetch` and `processing`).
struct TaskHistory {
    /// Where it came from, for messages: "the host at STATE", "STATE/bgtask.sqlite".
    var source: String
    /// The pending (or running) requests of the app: identifier → type.
    var pending: [String: TaskKind] = [:]
    /// The types each identifier ran as in the app's past launches (newest first).
    var launched: [String: Set<TaskKind>] = [:]
    /// Why there is nothing to go by, when there is not.
    var unavailable: String?

    /// Records read at most: the newest launches say what the app does now.
    static let recordLimit = 200

    enum Resolution {
        case resolved(TaskKind, String)
        case unresolved(String)
    }

    /// The type of `identifier`: that of its pending request if it has one, else the one type
    /// its past launches ran it as.
    func kind(of identifier: String) -> Resolution {
        if let unavailable { return .unresolved(unavailable) }
        if let kind = pending[identifier] { return .resolved(kind, "its pending request (\(source))") }
        let kinds = launched[identifier] ?? []
        if kinds.count == 1, let kind = kinds.first { return .resolved(kind, "its past launches (\(source))") }
        if kinds.isEmpty { return .unresolved("\(source) has no pending request or past launch of it to tell") }
        return .unresolved("its past launches (\(source)) ran it as \(kinds.map(\.rawValue).sorted().joined(separator: " and "))")
    }

    static func read(app: String, state: URL) -> TaskHistory {
        let client = ControlClient(stateDirectory: state)
        do {
            let answers = try client.send([.pending(app: app), .history(app: app, limit: recordLimit)])
            var history = TaskHistory(source: "the host at \(state.path)")
            if let refused = answers.first(where: { !$0.ok }) {
                history.unavailable = "the host at \(state.path) did not say (\(refused.error?.message ?? "refused"))"
                return history
            }
            history.add(pending: answers[0].pending ?? [], records: answers[1].records ?? [])
            return history
        } catch {
            // No host: its database, if one ran here.
            let database = state.appendingPathComponent("bgtask.sqlite")
            guard FileManager.default.fileExists(atPath: database.path) else {
                return TaskHistory(source: state.path, unavailable: "no host answers on \(state.path) and no host has kept requests there (no \(database.lastPathComponent))")
            }
            var history = TaskHistory(source: database.path)
            do {
                let store = try PendingRequestStore(directory: state)
                history.add(pending: try store.pending(app: app), records: try store.history(app: app, limit: recordLimit))
            } catch {
                history.unavailable = "\(database.path) could not be read (\(error.description))"
            }
            return history
        }
    }

    mutating func add(pending requests: [StoredRequest], records: [RunRecord]) {
        for stored in requests { pending[stored.request.identifier] = stored.request.kind }
        for record in records {
            for task in record.tasks { launched[task.identifier, default: []].insert(task.type) }
        }
    }
}

import ArgumentParser
import BGTaskHost
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

        @Argument(help: "The app bundle (Name.app).")
        var bundle: String

        @Option(name: .long, help: ArgumentHelp(
            "A task to run: IDENTIFIER or IDENTIFIER:TYPE. Repeat to run several in one launch.",
            valueName: "identifier[:type]"))
        var task: [TaskArgument] = []

        @Option(name: .long, help: "The task type for tasks given without one (refresh, processing, health-research, continued-processing). Default: from the bundle's UIBackgroundModes.")
        var type: TaskKind?

        @Option(name: .customLong("expire-after"), help: ArgumentHelp("Deliver expiration this long after launch (simulates the budget running out).", valueName: "duration"))
        var expireAfter: DurationArgument?

        @Option(name: .long, help: "The reason recorded for the launch.")
        var reason = "simulated"

        @Flag(name: .long, help: "Print the run record as one JSON object.")
        var json = false

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
            for (index, requested) in task.enumerated() {
                guard app.permits(requested.identifier) else {
                    printError("\(app.infoPlistURL.path): key BGTaskSchedulerPermittedIdentifiers: '\(requested.identifier)' is not permitted (permitted: \(app.permittedIdentifiers.joined(separator: ", ")))")
                    throw ExitCode.validationFailure
                }
                let kind: TaskKind
                if let explicit = requested.kind ?? type {
                    kind = explicit
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
                logFile: state.appendingPathComponent("logs").appendingPathComponent("\(launchID).log"))
            var supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: options.makeLogger())
            supervisor.cgroupRoot = try limitOptions.cgroupRoot(logger: supervisor.logger)
            supervisor.processLimit = limitOptions.processLimit
            supervisor.confine = !limitOptions.noSandbox
            if supervisor.confine && geteuid() == 0 { supervisor.identities = AppIdentities(stateDirectory: state) }
            let record: RunRecord
            do { record = try supervisor.run(plan, broker: InMemoryRequestBroker()) } catch {
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

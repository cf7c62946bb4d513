import ArgumentParser
import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation

private func dateText(_ date: Date?) -> String {
    guard let date else { return "now" }
    return ISO8601DateFormatter().string(from: date)
}

/// `+15m`, `+1d`, `+1h30m`, `30s` (relative to the host's clock), or an ISO 8601 date.
struct EarliestArgument: ExpressibleByArgument {
    enum Value { case relative(TimeInterval), absolute(Date) }
    var value: Value

    init?(argument: String) {
        guard let parsed = try? Self.parse(argument) else { return nil }
        self = parsed
    }

    init(value: Value) { self.value = value }

    /// The `transform:` of `--earliest`: a date, or a duration with or without its `+`.
    @Sendable static func parse(_ text: String) throws -> EarliestArgument {
        if let date = ISO8601DateFormatter().date(from: text) { return EarliestArgument(value: .absolute(date)) }
        let duration = text.hasPrefix("+") ? String(text.dropFirst()) : text
        do {
            return EarliestArgument(value: .relative(try DurationText.parseSeconds(duration)))
        } catch {
            let looksLikeADate = text.count >= 10 && text.prefix(4).allSatisfy(\.isNumber) && text.dropFirst(4).first == "-"
            if looksLikeADate {
                throw ValidationError("not an ISO 8601 date with a time zone (e.g. 2026-11-22T04:53:21Z), nor +DURATION (e.g. +15m, +1d)")
            }
            throw ValidationError("neither +DURATION (e.g. +15m, +1h30m, +1d) nor an ISO 8601 date (e.g. 2026-11-22T04:53:21Z): \(error.reason)")
        }
    }
}

extension BGTaskCommand {
    struct Apps: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the host's apps, with bundles that failed validation.")
        /// Apps asked for per request: an answer must fit a control frame (1 MiB), so the
        /// catalog comes in pages (the host makes a page smaller still if its apps are large).
        @Option(name: .customLong("page-size"), help: .hidden) var pageSize = 500
        @OptionGroup var host: HostOptions

        func validate() throws {
            guard pageSize >= 1 else { throw ValidationError("--page-size must be at least 1") }
        }

        func run() throws {
            var apps: [AppSummary] = []
            var invalid: [InvalidBundle] = []
            var after: String?
            while true {
                let response = try host.send(.apps(limit: pageSize, after: after))
                apps += response.apps ?? []
                if after == nil { invalid = response.invalid ?? [] }
                if after == nil, let omitted = response.omitted {
                    printError("apps: \(omitted) more invalid bundle(s) not listed (the answer's size limit)")
                }
                // A host from before paging answers everything at once, without `next`.
                guard let next = response.next, after.map({ next > $0 }) ?? true else { break }
                after = next
            }
            if host.json {
                struct Body: Encodable { var apps: [AppSummary]; var invalid: [InvalidBundle] }
                return try host.printJSON(Body(apps: apps, invalid: invalid))
            }
            for app in apps {
                var line = "\(app.identifier)  \(app.pending) pending"
                if let running = app.running { line += ", running \(running)" }
                if app.process == "suspended" {
                    line += ", suspended since \(dateText(app.suspendedSince)) (pid \(app.processID ?? 0), \(String(format: "%.1f MiB", Double(app.processBytes ?? 0) / 1_048_576)) of its own, \(app.processLaunches ?? 0) launch(es))"
                } else if app.process == "not-running", let eviction = app.lastEviction {
                    line += ", not running (evicted \(dateText(app.lastEvictionAt)): \(eviction))"
                }
                if !app.refreshEnabled { line += ", refresh off" }
                if app.penaltyLevel > 0 { line += ", penalty level \(app.penaltyLevel) until \(dateText(app.penaltyUntil))" }
                print(line)
                print("  \(app.path)")
                print("  permitted: \(app.permittedIdentifiers.joined(separator: ", "))")
            }
            for bad in invalid { print("invalid: \(bad.error)") }
        }
    }

    struct Submit: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Submit a task request for an app, as BGTaskScheduler.submit would.")
        @Argument(help: "The app's bundle identifier.") var app: String
        @Argument(help: "The task identifier.") var identifier: String
        @Option(name: .long, help: "refresh, processing, health-research or continued-processing.") var type: TaskKind = .refresh
        @Option(name: .long, help: ArgumentHelp("earliestBeginDate: +DURATION from the host's clock (+15m, +1h30m, +1d) or an ISO 8601 date (2026-11-22T04:53:21Z).", valueName: "when"), transform: EarliestArgument.parse)
        var earliest: EarliestArgument?
        @Flag(name: .customLong("requires-power"), help: "requiresExternalPower: run only while the device is on external power (processing).")
        var requiresPower = false
        @Flag(name: .customLong("requires-network"), help: "requiresNetworkConnectivity: run only while the network is up (processing).")
        var requiresNetwork = false
        @Option(name: .long, help: ArgumentHelp("health-research: protectionTypeOfRequiredData (default: until-first-auth).", valueName: "class"))
        var protection: ProtectionClass = .untilFirstAuth
        @OptionGroup var host: HostOptions

        func run() throws {
            var earliestDate: Double?
            var delay: Double?
            switch earliest?.value {
            case .absolute(let date): earliestDate = date.timeIntervalSince1970
            case .relative(let seconds): delay = seconds // from the host's clock, which may be virtual
            case nil: break
            }
            let request = TaskRequest(kind: type, identifier: identifier, earliestBeginDate: earliestDate,
                                          requiresNetworkConnectivity: requiresNetwork, requiresExternalPower: requiresPower,
                                          protectionType: type == .healthResearch ? protection.code : 0)
            try host.call(.submit(app: app, request: request, delay: delay))
            let stored = try host.call(.pending(app: app)).first { $0.request.identifier == identifier }
            if host.json { return try host.printJSON(["submitted": identifier]) }
            print("submitted \(type.rawValue) \(identifier) for \(app)\(stored?.earliest.map { ", not before \(dateText($0))" } ?? "")")
        }
    }

    struct Pending: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List pending requests (of one app, or all).")
        @Argument(help: "An app's bundle identifier.") var app: String?
        @OptionGroup var host: HostOptions

        func run() throws {
            let pending = try host.call(.pending(app: app))
            if host.json { return try host.printJSON(pending) }
            if pending.isEmpty { print("no pending requests") }
            for stored in pending {
                var flags: [String] = []
                if stored.request.requiresExternalPower { flags.append("requires power") }
                if stored.request.requiresNetworkConnectivity { flags.append("requires network") }
                print("\(stored.app)  \(stored.request.identifier)  \(stored.request.kind.rawValue)  earliest \(dateText(stored.earliest))\(flags.isEmpty ? "" : "  " + flags.joined(separator: ", "))")
            }
        }
    }

    struct Cancel: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Cancel an app's pending request.")
        @Argument(help: "The app's bundle identifier.") var app: String
        @Argument(help: "The task identifier whose pending request to cancel.") var identifier: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let removed = try host.call(.cancel(app: app, identifier: identifier))
            if host.json { return try host.printJSON(["removed": removed]) }
            print(removed > 0 ? "cancelled \(identifier)" : "\(identifier) had no pending request")
        }
    }

    struct CancelAll: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "cancel-all", abstract: "Cancel every pending request of an app.")
        @Argument(help: "The app's bundle identifier.") var app: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let removed = try host.call(.cancelAll(app: app))
            if host.json { return try host.printJSON(["removed": removed]) }
            print("cancelled \(removed) request(s) of \(app)")
        }
    }

    struct SimulateLaunch: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "simulate-launch",
            abstract: "Launch the app for a task now, as the debugger's _simulateLaunchForTaskWithIdentifier.",
            discussion: "Needs a pending request for the identifier, as on iOS, unless --force. Waits for the launch and prints its record (exit status 0 when every task succeeded).")
        @Argument(help: "The task identifier to launch the app for.") var identifier: String
        @Option(name: .long, help: "The app, when several could run the identifier.") var app: String?
        @Option(name: .long, help: "The task type with --force (default: from the bundle).") var type: TaskKind?
        @Flag(name: .long, help: "Launch even without a pending request.") var force = false
        @Flag(name: .customLong("no-wait"), help: "Print the launch id and return at once.") var noWait = false
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.simulateLaunch(identifier: identifier, app: app, force: force, kind: type, wait: !noWait)) { failure in
                failure.code == .notFound && !force ? "(bgtask simulate-launch --force \(identifier) launches it without one)" : nil
            }
            guard let record = response.record else {
                if host.json { return try host.printJSON(["launch_id": response.launchID ?? ""]) }
                print("launched \(response.launchID ?? "?")")
                return
            }
            if host.json {
                FileHandle.standardOutput.write(try record.jsonData() + Data("\n".utf8))
            } else {
                print(record)
            }
            if !record.succeeded { throw ExitCode.failure }
        }
    }

    struct SimulateExpire: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "simulate-expire",
            abstract: "Expire a running task now, as the debugger's _simulateExpirationForTaskWithIdentifier.")
        @Argument(help: "The identifier of the running task to expire.") var identifier: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.simulateExpire(identifier: identifier))
            if host.json { return try host.printJSON(["launch_id": response.launchID ?? ""]) }
            print("expiration delivered to \(identifier) in launch \(response.launchID ?? "?")")
        }
    }

    struct Evict: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "End an app's suspended process now, as memory pressure would: its next launch starts a new process.")
        @Argument(help: "The app's bundle identifier.") var app: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.evict(app: app))
            if host.json { return try host.printJSON(["evicted": (response.removed ?? 0) > 0]) }
            print((response.removed ?? 0) > 0 ? "\(app): its suspended process was ended" : "\(app) had no suspended process")
        }
    }

    struct History: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show run records, newest first.")
        @Argument(help: "An app's bundle identifier (default: every app).") var app: String?
        @Option(name: .long, help: "The most records to show.") var limit = 20
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.history(app: app, limit: limit))
            let records = response.records ?? []
            if let omitted = response.omitted {
                printError("history: \(omitted) record(s) left out to fit the answer's size limit (ask for fewer with --limit, or one app)")
            }
            if host.json {
                let objects = try records.map { try JSONSerialization.jsonObject(with: $0.jsonData()) }
                FileHandle.standardOutput.write(try JSONSerialization.data(withJSONObject: objects, options: [.sortedKeys]) + Data("\n".utf8))
                return
            }
            if records.isEmpty { print("no launches yet") }
            for record in records { print(record) }
        }
    }

    struct Why: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Explain why a request has not run: every condition holding it back (or, given a push's or a transfer's id, where it stands).")
        @Argument(help: "The task identifier of the request, or a push's or a transfer's id.") var identifier: String
        @Option(name: .long, help: "The app, when several submitted the identifier.") var app: String?
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.why(identifier: identifier, app: app))
            if let push = response.pushes?.first {
                if host.json { return try host.printJSON(push) }
                return print(push.text)
            }
            if let transfer = response.transfers?.first {
                if host.json { return try host.printJSON(transfer) }
                return print(transfer.explanation)
            }
            guard let report = response.why else { return }
            if host.json { return try host.printJSON(report) }
            print(report.text)
        }
    }

    struct Device: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show or override the device conditions scheduling depends on.",
            discussion: "Each of --power, --network, --idle, --low-power, --refresh, --locked, --gpu takes on, off or auto (back to the machine's value or the default); --thermal takes a state or auto. --app ID --refresh on|off sets an app's own Background App Refresh switch.")
        @Option(name: .long, help: ArgumentHelp("External power, for requests with requiresExternalPower. auto: the machine's (AC or USB supply online, or no battery).", valueName: "on|off|auto"))
        var power: DeviceSetting?
        @Option(name: .long, help: ArgumentHelp("A usable network, for requests with requiresNetworkConnectivity. auto: the machine's (a default route on an interface that is up).", valueName: "on|off|auto"))
        var network: DeviceSetting?
        @Option(name: .long, help: ArgumentHelp("The device is idle: processing tasks run only then. auto: on (Linux has no such signal).", valueName: "on|off|auto"))
        var idle: DeviceSetting?
        @Option(name: .customLong("low-power"), help: ArgumentHelp("Low Power Mode: refresh is unavailable while it is on. auto: off.", valueName: "on|off|auto"))
        var lowPower: DeviceSetting?
        @Option(name: .long, help: ArgumentHelp("The Background App Refresh switch: off stops refresh launches. With --app, that app's own switch (on or off). auto: on.", valueName: "on|off|auto"))
        var refresh: DeviceSetting?
        @Option(name: .long, help: ArgumentHelp("The device is locked, for health-research data protection (--protection of submit). auto: off (unlocked).", valueName: "on|off|auto"))
        var locked: DeviceSetting?
        @Option(name: .long, help: ArgumentHelp("A GPU, for continued-processing requests that require one. auto: the machine's (/dev/dri/renderD* or /dev/nvidia*).", valueName: "on|off|auto"))
        var gpu: DeviceSetting?
        @Option(name: .long, help: ArgumentHelp("The thermal state (ProcessInfo.thermalState): processing work waits at serious, nothing is launched at critical and running background launches are expired when it turns critical. auto: the machine's (its thermal zones and their trip points; nominal without any).", valueName: "nominal|fair|serious|critical|auto"))
        var thermal: ThermalSetting?
        @Option(name: .long, help: ArgumentHelp("With --app: the app's local notifications, authorized (on) or denied (off), as the user decides in Settings; auto: the host's default (--allow-notifications, else denied once the app asks).", valueName: "on|off|auto"))
        var notifications: DeviceSetting?
        @Option(name: .long, help: "With --refresh or --notifications: the app whose switch to set.") var app: String?
        @OptionGroup var host: HostOptions

        func validate() throws {
            if notifications != nil && app == nil { throw ValidationError("--notifications goes with --app (bgtask host --allow-notifications allows every app)") }
            if app != nil && notifications == nil && (refresh == nil || refresh == .auto) { throw ValidationError("--app goes with --refresh on|off or --notifications on|off|auto") }
            if app != nil && refresh == .auto { throw ValidationError("--app --refresh takes on or off") }
        }

        func run() throws {
            var changes = DeviceChanges()
            let settings: [(DeviceCondition, DeviceSetting?)] = [(.power, power), (.network, network), (.idle, idle), (.lowPower, lowPower),
                                                                   (.locked, locked), (.gpu, gpu)] + (app == nil ? [(.refresh, refresh)] : [])
            for case let (condition, setting?) in settings { changes.conditions[condition] = setting }
            changes.thermal = thermal
            if let app { changes.app = DeviceChanges.AppSwitches(app: app, refresh: refresh?.override, notifications: notifications) }
            let conditions = try host.call(.device(changes))
            if host.json { return try host.printJSON(conditions) }
            func line(_ name: String, _ value: Bool, _ key: String) {
                print("\(name.padding(toLength: 20, withPad: " ", startingAt: 0)) \(value ? "yes" : "no")  (\(conditions.sources[key] ?? "?"))")
            }
            line("external power", conditions.externalPower, "externalPower")
            line("network", conditions.network, "network")
            line("idle", conditions.idle, "idle")
            line("low power mode", conditions.lowPowerMode, "lowPowerMode")
            line("background refresh", conditions.backgroundRefresh, "backgroundRefresh")
            line("locked", conditions.locked, "locked")
            line("gpu", conditions.supportedResources & 1 != 0, "supportedResources")
            print("\("thermal state".padding(toLength: 20, withPad: " ", startingAt: 0)) \(conditions.thermalState.name)  (\(conditions.sources["thermalState"] ?? "?"))")
            if let app, notifications != nil,
               let report = try host.send(.pendingNotifications(app: app)).notificationApps?.first {
                print("\("notifications".padding(toLength: 20, withPad: " ", startingAt: 0)) \(report.authorization)  (\(app))")
            }
        }
    }

    struct Clock: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the host's clock, or advance a virtual one.",
            discussion: "bgtask clock advance 15m moves a host started with --clock virtual forward and runs whatever became due.")
        @Argument(help: ArgumentHelp("advance (with a duration), or nothing to show the clock.", valueName: "advance"), completion: .list(["advance"]))
        var action: String?
        @Argument(help: ArgumentHelp("With advance: how far, e.g. 15m, 1h30m, 1d.", valueName: "duration"), transform: DurationArgument.parse)
        var amount: DurationArgument?
        @OptionGroup var host: HostOptions

        func validate() throws {
            if let action, action != "advance" { throw ValidationError("unknown clock action '\(action)' (known: advance)") }
            if action == "advance" && amount == nil { throw ValidationError("clock advance needs a duration, e.g. 15m") }
        }

        func run() throws {
            let seconds = amount?.duration.timeInterval
            let clock = try host.call(.clock(advance: seconds))
            if host.json { return try host.printJSON(clock) }
            print("\(clock.mode.rawValue) clock: \(dateText(clock.now))\(clock.nextDue.map { "; next request due \(dateText($0))" } ?? "")")
        }
    }
}

extension BGTaskCommand {
    struct Extension: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "extension",
            abstract: "Drive app extensions (.appex bundles inside an app's PlugIns/).",
            subcommands: [RunExtension.self])
    }

    struct RunExtension: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "run",
            abstract: "Start an extension in its own supervised process with an event, print its record.",
            discussion: """
                The host starts the extension (reason: extension) with its own budget and \
                memory limit and calls its entry with the event. It cannot register handlers; \
                what it submits is checked against its containing app's Info.plist and queued \
                for the app, which is launched to run it when due.
                """)
        @Argument(help: "The extension's bundle identifier.") var identifier: String
        @Option(name: .long, help: ArgumentHelp("The event, as JSON, the extension's entry receives.", valueName: "json"))
        var event: String?
        @OptionGroup var host: HostOptions

        func validate() throws {
            if let event, (try? JSONSerialization.jsonObject(with: Data(event.utf8), options: [.fragmentsAllowed])) == nil {
                throw ValidationError("--event is not valid JSON: \(event)")
            }
        }

        func run() throws {
            let response = try host.send(.extensionRun(identifier: identifier, event: event, wait: true))
            guard let record = response.record else { return }
            if host.json {
                FileHandle.standardOutput.write(try record.jsonData() + Data("\n".utf8))
            } else {
                print(record)
            }
            if !record.succeeded { throw ExitCode.failure }
        }
    }
}

extension BGTaskCommand {
    struct Open: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Open an app in the foreground, as a user would (it may start continued-processing tasks).",
            discussion: """
                The app's launch entry is told it is in the foreground (BGTaskLaunch.role). It may \
                register continued-processing identifiers (matching a wildcard permitted \
                identifier) and submit BGContinuedProcessingTaskRequests, which run in this \
                process. It leaves the foreground after the host's --foreground-stay, and its \
                process ends when its continued tasks have.
                """)
        @Argument(help: "The app's bundle identifier.") var app: String
        @Option(name: .long, help: ArgumentHelp("An event, as JSON, for the launch entry.", valueName: "json")) var event: String?
        @Flag(name: .long, help: "Wait for the launch to end and print its record.") var wait = false
        @OptionGroup var host: HostOptions

        func run() throws {
            try host.printLaunch(try host.send(.open(app: app, event: event, wait: wait)), started: "opened \(app)")
        }
    }

    struct Progress: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Watch running continued-processing tasks: a live progress bar each.",
            discussion: "On a terminal the bars redraw in place; otherwise (or with --json) one line per change. Returns when no task is running (with --wait, after waiting up to that long for one to start).")
        @Flag(name: .long, help: "Print the current state once and return.") var once = false
        @Option(name: .long, help: ArgumentHelp("Wait this long for a first task to appear (e.g. 10s).", valueName: "duration"), transform: DurationArgument.parse)
        var wait: DurationArgument?
        @OptionGroup var host: HostOptions

        func run() throws {
            let interactive = isatty(1) == 1 && !host.json
            let deadline = Date().addingTimeInterval(wait?.duration.timeInterval ?? 0)
            var shown: [String: ContinuedTaskStatus] = [:]
            var drawnLines = 0
            var seenAny = false
            while true {
                let tasks = try host.call(.progress)
                seenAny = seenAny || !tasks.isEmpty
                if interactive {
                    if drawnLines > 0 { print("\u{1B}[\(drawnLines)A", terminator: "") }
                    for task in tasks { print("\u{1B}[2K" + Self.bar(task)) }
                    for _ in tasks.count..<max(drawnLines, tasks.count) { print("\u{1B}[2K") }
                    drawnLines = max(drawnLines, tasks.count)
                } else {
                    for task in tasks where shown["\(task.launchID)/\(task.task)"] != task {
                        // Unbuffered, so a reader at the other end of a pipe sees each update as it happens.
                        if host.json { try host.printJSON(task) } else { FileHandle.standardOutput.write(Data((Self.line(task) + "\n").utf8)) }
                    }
                }
                for task in tasks { shown["\(task.launchID)/\(task.task)"] = task }
                if once { return }
                if tasks.allSatisfy(\.ended) && (seenAny || Date() >= deadline) {
                    if !seenAny && !host.json { print("no continued-processing task is running") }
                    return
                }
                usleep(100_000)
            }
        }

        static func percent(_ task: ContinuedTaskStatus) -> String {
            task.fraction.map { String(format: "%3.0f%%", $0 * 100) } ?? "  ?%"
        }

        static func bar(_ task: ContinuedTaskStatus) -> String {
            let width = 30
            let filled = Int((task.fraction ?? 0) * Double(width))
            let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
            return "\(task.title) — \(task.subtitle)  \(bar) \(percent(task)) (\(task.completed)/\(task.total))\(state(task))"
        }

        static func line(_ task: ContinuedTaskStatus) -> String {
            "\(task.identifier) \(percent(task)) \(task.completed)/\(task.total) \(task.title) — \(task.subtitle)\(state(task))"
        }

        static func state(_ task: ContinuedTaskStatus) -> String {
            task.ended ? " (ended)" : task.expiring ? " (expiring)" : ""
        }
    }

    struct Notifications: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show apps' local notifications: delivered (newest last), or pending with --pending.",
            discussion: """
                Delivered notifications are the ones the host delivered when their trigger came \
                due (whether or not the app was running), the newest 100 per app. --follow prints \
                those delivered from then on, as they are, until interrupted. Each app's \
                authorization (bgtask device --app A --notifications on|off) heads the list.
                """)
        @Argument(help: "An app's bundle identifier (default: every app).") var app: String?
        @Flag(name: .long, help: "Pending requests instead, soonest first, with their next delivery date.") var pending = false
        @Flag(name: .long, help: "Keep printing notifications as they are delivered.") var follow = false
        @Option(name: .long, help: "The most delivered notifications to show (the newest).") var limit = 100
        @OptionGroup var host: HostOptions

        func validate() throws {
            if pending && follow { throw ValidationError("--follow follows deliveries; it does not go with --pending") }
            if limit < 1 { throw ValidationError("--limit must be at least 1") }
        }

        func run() throws {
            let response = try host.send(pending ? .pendingNotifications(app: app) : .notifications(app: app, limit: limit))
            let shown = response.notifications ?? []
            if host.json && !follow {
                struct Body: Encodable { var apps: [NotificationAppReport]; var notifications: [StoredNotification] }
                return try host.printJSON(Body(apps: response.notificationApps ?? [], notifications: shown))
            }
            if !host.json {
                for report in response.notificationApps ?? [] where app != nil || report.allowed != nil || report.askedAt != nil || shown.contains(where: { $0.app == report.app }) {
                    let switchText = report.allowed.map { $0 ? "switch on" : "switch off" } ?? "no switch"
                    write("\(report.app): notifications \(report.authorization) (\(switchText)\(report.askedAt.map { ", asked \(dateText($0))" } ?? ""))")
                }
                if shown.isEmpty && !follow { write(pending ? "no pending notifications" : "no delivered notifications") }
            }
            for notification in shown { try emit(notification) }
            guard follow else { return }
            var cursor = shown.map(\.id).max() ?? 0
            while true {
                usleep(200_000)
                let more = try host.send(.notifications(app: app, after: cursor, limit: 1000)).notifications ?? []
                for notification in more { try emit(notification) }
                cursor = more.map(\.id).max() ?? cursor
            }
        }

        /// A line, unbuffered (in order with `emit`'s).
        private func write(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

        /// One notification: a JSON line, or a line and its text.
        private func emit(_ notification: StoredNotification) throws {
            if host.json { return try host.printJSON(notification) }
            let content = notification.request.content
            let when = notification.state == "pending" ? "due \(dateText(notification.fireDate))" : "delivered \(dateText(notification.deliveredAt))"
            var line = "\(notification.app)  \(notification.request.identifier)  \(when)"
            if let trigger = notification.request.trigger { line += "  \(Self.describe(trigger))" }
            line += "\n  \(content.title.isEmpty ? "(no title)" : content.title)"
            if !content.subtitle.isEmpty { line += " — \(content.subtitle)" }
            if !content.body.isEmpty { line += "\n  \(content.body.replacingOccurrences(of: "\n", with: "\n  "))" }
            // Unbuffered, so a reader at the other end of a pipe sees each one as it comes.
            FileHandle.standardOutput.write(Data((line + "\n").utf8))
        }

        static func describe(_ trigger: NotificationTrigger) -> String {
            switch trigger {
            case let .timeInterval(interval, repeats): "\(repeats ? "every" : "after") \(DurationText.format(seconds: interval))"
            case let .calendar(match, repeats):
                (repeats ? "repeating " : "") + "at " + match.fields.compactMap { field in field.value.map { "\(field.name)=\($0)" } }.joined(separator: " ")
            }
        }
    }

    struct CancelTask: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "cancel-task",
            abstract: "Cancel a running continued-processing task, as the user does: its expiration handler runs.")
        @Argument(help: "The identifier of the running continued-processing task.") var identifier: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let response = try host.send(.cancelTask(identifier: identifier))
            if host.json { return try host.printJSON(["launch_id": response.launchID ?? ""]) }
            print("cancelled \(identifier) (launch \(response.launchID ?? "?"))")
        }
    }
}

import BGTaskControl
import BGTaskLaunch
import BGTaskTransfers
import BGTaskStore
import BGTaskModel
import Dispatch
import Foundation

/// The control protocol's verbs: each turns a `ControlCommand` into calls on the host's parts
/// and their answer into a `ControlResponse`. It owns no state; what it reads of the parts
/// on the host queue (`@HostActor`) it reads there (`core.sync`), and it reads the store off it.
/// Runs on control connections' threads.
final class ControlVerbs: @unchecked Sendable {
    private let core: HostCore
    private let catalog: AppCatalog
    private let device: DeviceState
    private let launches: LaunchCoordinator
    private let scheduling: SchedulingLoop
    private let submissions: Submissions
    private let pushes: PushDelivery
    private let notifications: LocalNotifications
    /// Background transfers (set when the host is wired).
    var transfers: BackgroundTransfers?

    init(core: HostCore, catalog: AppCatalog, device: DeviceState, launches: LaunchCoordinator,
         scheduling: SchedulingLoop, submissions: Submissions, pushes: PushDelivery, notifications: LocalNotifications) {
        self.pushes = pushes
        self.notifications = notifications
        self.core = core
        self.catalog = catalog
        self.device = device
        self.launches = launches
        self.scheduling = scheduling
        self.submissions = submissions
    }

    private var store: PendingRequestStore { core.store }

    /// The answer to one command that is not a launch by hand waiting for its record (those are
    /// `launchByHand`'s).
    private func answer(_ command: ControlCommand) -> ControlResponse {
        switch command {
        case .status: return ControlResponse()
        case let .apps(limit, after): return apps(limit: limit, after: after)
        case .submit: return submit([command])[0]
        case .pending(let app):
            return respond { var r = ControlResponse(); r.pending = try store.pending(app: app); return r }
        case let .cancel(app, identifier):
            return respond { var r = ControlResponse(); r.removed = try store.cancel(app: app, identifier: identifier); return r }
        case .cancelAll(let app):
            return respond { var r = ControlResponse(); r.removed = try store.cancel(app: app, identifier: nil); return r }
        case let .history(app, limit):
            return respond {
                var r = ControlResponse()
                let (records, omitted) = Self.fitting(try store.history(app: app, limit: limit ?? 50))
                r.records = records
                if omitted > 0 { (r.truncated, r.omitted) = (true, omitted) }
                return r
            }
        case let .why(identifier, app): return why(identifier, app: app)
        case .evict(let app):
            guard let apps = launches.suspendedApps else {
                return .failure(.badRequest, "evict: this host keeps no app's process (its app lifecycle is fresh)")
            }
            var response = ControlResponse()
            response.removed = apps.evict(app, reason: "evicted by the operator (bgtask evict)") ? 1 : 0
            return response
        case .device(let changes): return device(changes)
        case .clock(let advance): return clock(advance: advance)
        case .simulateLaunch, .extensionRun, .open, .respond:
            // Launches by hand are `launchByHand`'s (see `handle(_:peer:reply:)`).
            return .failure(.internalError, "\(command.verb.rawValue) reached the wrong handler")
        case .simulateExpire(let identifier): return simulateExpire(identifier)
        case .cancelTask(let identifier): return cancelTask(identifier)
        case .progress:
            return core.sync {
                var response = ControlResponse()
                response.continued = launches.continuedStatuses()
                return response
            }
        case let .push(app, body): return push(app, body)
        case let .pushes(app, limit):
            return core.sync {
                var response = ControlResponse()
                let list = (try? store.pushes(app: app, limit: limit ?? 50)) ?? []
                response.pushes = list.map(pushes.report)
                return response
            }
        case .deviceToken(let app):
            guard core.sync({ catalog.apps[app] != nil }) else { return notInCatalog(app) }
            return respond { var r = ControlResponse(); r.deviceToken = try store.deviceToken(app: app); return r }
        case let .notifications(app, after, limit): return notifications(app: app, after: after, limit: limit, pending: false)
        case .pendingNotifications(let app): return notifications(app: app, after: nil, limit: nil, pending: true)
        case .running:
            var response = ControlResponse()
            response.running = LaunchCoordinator.withMemory(core.sync { launches.runningReports() })
            return response
        case let .metrics(app):
            guard core.sync({ catalog.apps[app] != nil }) else { return notInCatalog(app) }
            return respond {
                var response = ControlResponse()
                response.metrics = try store.metricDays(app: app).map {
                    MetricReport(day: $0.day, diagnostics: $0.diagnostics, delivered: $0.delivered, excess: $0.excess)
                }
                return response
            }
        case let .transfers(app, limit):
            guard let transfers else { return .failure(.unavailable, "this host carries no background transfers") }
            return respond {
                var response = ControlResponse()
                var reports = try store.transfers(app: app, limit: min(limit ?? 100, 1000)).map(transfers.report)
                // Listed without what a launch is told (bodies stay out of the control socket).
                var (fitting, omitted) = (reports, 0)
                while fitting.count > 1, ((try? JSONEncoder.control.encode(fitting).count) ?? 0) > ControlFrame.maximumPayload / 2 {
                    fitting.removeLast()
                    omitted += 1
                }
                reports = fitting
                response.transfers = reports
                if omitted > 0 { (response.truncated, response.omitted) = (true, omitted) }
                return response
            }
        }
    }

    // MARK: Notifications

    /// Delivered notifications (with `after`, those delivered since that id, oldest first, at
    /// most `limit`; without, the newest `limit`, default 100 a page) or pending ones, of one
    /// app or all, with the authorization of the apps concerned.
    private func notifications(app: String?, after: Int64?, limit: Int?, pending: Bool) -> ControlResponse {
        let limit = limit ?? NotificationLimits.deliveredPerApp
        return respond {
            var response = ControlResponse()
            response.notifications = pending ? try store.pendingNotifications(app: app)
                                             : try store.deliveredNotifications(app: app, after: after, limit: min(limit, 1000))
            let apps = app.map { [$0] } ?? core.sync { catalog.apps.keys.sorted() }
            let states = try store.notificationAppStates()
            response.notificationApps = apps.map { app in
                let state = states[app] ?? NotificationAppState(app: app)
                let status = NotificationAuthorization.decide(appSwitch: state.allowed, hostDefault: core.configuration.allowNotifications,
                                                              asked: state.askedAt != nil)
                return NotificationAppReport(app: app, authorization: status.name, allowed: state.allowed,
                                             askedAt: state.askedAt, askedOptions: state.askedOptions)
            }
            return response
        }
    }

    /// `push`: a payload for an app, as `xcrun simctl push` sends one; the answer says what
    /// became of it (delivered in a launch, waiting and why, dropped and why) or APNs's refusal.
    private func push(_ app: String, _ body: PushBody) -> ControlResponse {
        let submission = PushSubmission(
            app: app, payload: Data(body.payload.utf8), pushType: body.pushType, priority: body.priority,
            expiration: body.expiration, collapseID: body.collapseID, id: body.id)
        switch pushes.receive(submission, evaluate: scheduling.evaluate) {
        case .success(let report):
            var response = ControlResponse()
            response.push = report
            return response
        case .failure(let refusal):
            var response = ControlResponse.failure(refusal.status == 410 ? .notFound : refusal.status == 413 ? .tooLarge : .badRequest,
                                                   "\(refusal.reason): \(refusal.message)")
            response.apnsReason = refusal.reason
            return response
        }
    }

    /// Pipelined commands, answered in order through `reply`, once: runs of consecutive
    /// submissions share one commit; every other command is handled on its own. A launch by
    /// hand that answers with its record does not hold a thread while it runs: the commands
    /// after it are handled once it has ended, on a control worker.
    func handle(_ commands: [ControlCommand], peer: PeerCredentials, reply: @escaping @Sendable ([ControlResponse]) -> Void) {
        handle(commands[...], answered: [], reply: reply)
    }

    private func handle(_ commands: ArraySlice<ControlCommand>, answered: [ControlResponse],
                        reply: @escaping @Sendable ([ControlResponse]) -> Void) {
        var responses = answered
        var index = commands.startIndex
        while index < commands.endIndex {
            var end = index
            while end < commands.endIndex, case .submit = commands[end] { end += 1 }
            if end > index {
                responses += submit(Array(commands[index..<end]))
                index = end
                continue
            }
            let command = commands[index]
            index += 1
            switch command {
            case .simulateLaunch, .extensionRun, .open, .respond:
                let rest = commands[index...]
                let before = responses
                let now = launchByHand(command) { [self] record in
                    ControlServer.workers.run { self.handle(rest, answered: before + [record], reply: reply) }
                }
                // Otherwise answered when the launch ends: the rest of the batch goes on from there.
                guard let now else { return }
                responses.append(now)
            default:
                responses.append(answer(command))
            }
        }
        reply(responses)
    }

    private func respond(_ body: () throws -> ControlResponse) -> ControlResponse {
        do { return try body() } catch { return .failure(.internalError, "\(error)") }
    }

    private func notInCatalog(_ app: String) -> ControlResponse {
        .failure(.notFound, "no valid bundle with identifier \(app.prefix(255)) is in \(core.configuration.pluginsDirectory.path)")
    }

    // MARK: Submissions

    /// `submit` requests, pipelined ones together: one answer each, in order.
    private func submit(_ commands: [ControlCommand]) -> [ControlResponse] {
        let submitted = commands.map { command -> (app: String, request: TaskRequest, delay: Double?) in
            guard case let .submit(app, request, delay) = command else { preconditionFailure("submit(_:) is given submissions only") }
            return (app, request, delay)
        }
        let apps = core.sync { submitted.map { catalog.apps[$0.app] } }
        var responses: [ControlResponse?] = Array(repeating: nil, count: commands.count)
        var items: [(request: TaskRequest, app: PluginBundle)] = []
        var positions: [Int] = []
        for (position, (app, request, delay)) in submitted.enumerated() {
            var task = request
            if let delay {
                guard delay.isFinite, abs(delay) <= HostClock.maximumOffset else {
                    responses[position] = .failure(.outOfRange, "submit: delay \(delay) s is outside the bound of \(HostClock.maximumOffsetText) from the host's clock")
                    continue
                }
                task.earliestBeginDate = core.clock.now.addingTimeInterval(delay).timeIntervalSince1970
            }
            guard let bundle = apps[position] else {
                responses[position] = notInCatalog(app)
                continue
            }
            if task.kind == .continuedProcessing {
                responses[position] = Self.response(submissions.submitContinued(task, app: bundle, fromLaunch: nil))
            } else {
                items.append((task, bundle))
                positions.append(position)
            }
        }
        for (position, rejection) in zip(positions, submissions.submitAll(items)) { responses[position] = Self.response(rejection) }
        return responses.map { $0 ?? .failure(.internalError, "no answer") }
    }

    /// The catalog sorted by identifier, with per-app state: every app, or (with `limit` or
    /// `after`) one page of at most `limit` apps after `after`, with `next` set when more
    /// follow. Two indexed store queries whatever the number of requests; invalid bundles come
    /// with the first page.
    private func apps(limit: Int?, after: String?) -> ControlResponse {
        let paged = limit != nil || after != nil
        var omittedInvalid = 0
        // The catalog and the running launches are the queue's; the store is read off it.
        let processes = Dictionary(launches.processStates.map { ($0.app, $0) }) { first, _ in first }
        let keepsProcesses = launches.suspendedApps != nil
        let (page, runningByApp, invalid, next) = core.sync { () -> ([PluginBundle], [String: String], [InvalidBundle]?, String?) in
            var runningByApp: [String: String] = [:]
            for launch in launches.running.values where runningByApp[launch.app] == nil { runningByApp[launch.app] = launch.id }
            // The identifiers are sorted, not the bundles: moving a bundle (a dozen reference-
            // counted fields) at each of a sort's swaps cost a dashboard's overview of 1,001 apps
            // most of its time, on the host's queue (perf, the bench's dashboard section).
            let apps = catalog.apps
            var keys = Array(apps.keys)
            if let after { keys.removeAll { $0 <= after } }
            keys.sort()
            let bundles = keys.map { apps[$0]! }
            // Invalid bundles (with the first page) take half a page at most; the rest are
            // counted (`omitted`).
            var invalid: [InvalidBundle]?
            var bytes = 0
            if after == nil {
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
            while count < min(bundles.count, limit ?? .max) {
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
            var summary = AppSummary(
                identifier: bundle.identifier, path: bundle.url.path, permittedIdentifiers: bundle.permittedIdentifiers,
                backgroundModes: bundle.backgroundModes.sorted(), extensions: bundle.extensions.map(\.identifier),
                running: runningByApp[bundle.identifier],
                refreshEnabled: state.refreshEnabled, penaltyLevel: state.penaltyLevel, penaltyUntil: state.penaltyUntil,
                pending: pendingCounts[bundle.identifier] ?? 0)
            (summary.entitlements, summary.appGroups) = (bundle.entitlements.filter(\.value).keys.sorted(), bundle.appGroups)
            if keepsProcesses {
                let process = processes[bundle.identifier]
                summary.process = runningByApp[bundle.identifier] != nil ? AppProcessState.State.running.rawValue
                    : (process?.state ?? .notRunning).rawValue
                if process?.state == .suspended {
                    (summary.processID, summary.processBytes, summary.suspendedSince, summary.processLaunches) =
                        (process?.pid, process?.residentBytes, process?.suspendedSince, process?.launches)
                }
                (summary.lastEviction, summary.lastEvictionAt) = (process?.lastEviction?.reason, process?.lastEviction?.at)
            }
            return summary
        }
        response.invalid = invalid
        response.next = next
        if omittedInvalid > 0 { (response.truncated, response.omitted) = (true, omittedInvalid) }
        return response
    }

    private func why(_ identifier: String, app: String?) -> ControlResponse {
        return core.sync {
            let now = core.clock.now
            var response = ControlResponse()
            // A push's apns-id: what became of it.
            if let id = UUID(uuidString: identifier), let report = pushes.report(id: id.uuidString) {
                response.pushes = [report]
                return response
            }
            // A transfer's id: where it stands.
            if let id = UUID(uuidString: identifier), let report = transfers?.report(id: id.uuidString) {
                response.transfers = [report]
                return response
            }
            if let launch = launches.launch(running: identifier, app: app) {
                response.why = WhyReport(app: launch.app, identifier: identifier, state: .running, runningLaunch: launch.id,
                                         request: launch.requests[identifier], blockers: [], now: now)
                return response
            }
            let stored: StoredRequest?
            if let app {
                stored = (try? store.pending(app: app))?.first { $0.request.identifier == identifier }
            } else {
                stored = try? store.pendingRequest(identifier: identifier)
            }
            guard let stored else {
                response.why = WhyReport(app: app ?? catalog.app(permitting: identifier)?.identifier ?? "", identifier: identifier,
                                         state: .notSubmitted, runningLaunch: nil, request: nil, blockers: [], now: now)
                return response
            }
            let state = (try? store.appState(stored.app)) ?? AppState(app: stored.app)
            let appRunning = launches.launch(of: stored.app) != nil
            var blockers = scheduling.eligibility(device.conditions()).blockers(for: stored, app: catalog.apps[stored.app], state: state, appRunning: appRunning)
            // The app's last launch was not started (over its disk quota, or the host's failure):
            // the scheduler passes it by until its pause ends.
            if let failure = launches.startFailure(of: stored.app) {
                blockers.append(Blocker(failure.diskQuota ? .diskQuota : .startFailed, failure.message, until: failure.until))
            }
            if core.clock.mode == .virtual, let index = blockers.firstIndex(where: { $0.knownCode == .notDue }), let until = blockers[index].until {
                blockers[index].message += " (virtual clock: bgtask clock advance \(Eligibility.format(until.timeIntervalSince(now))))"
            }
            response.why = WhyReport(app: stored.app, identifier: identifier, state: .pending, runningLaunch: nil,
                                     request: stored.request, blockers: blockers, now: now)
            return response
        }
    }

    // MARK: Device and clock

    private func device(_ changes: DeviceChanges) -> ControlResponse {
        device.invalidate()
        defer { device.invalidate() }
        if let switches = changes.app {
            // A switch of an installed app, as iOS's Settings shows: a row per name would let a
            // client grow the database without bound.
            guard core.sync({ catalog.apps[switches.app] != nil }) else { return notInCatalog(switches.app) }
            do {
                if let refresh = switches.refresh { try device.setAppRefresh(switches.app, on: refresh) }
                if let notifications = switches.notifications {
                    try store.setNotificationsAllowed(app: switches.app, notifications.override)
                }
            } catch {
                return .failure(.internalError, "\(error)")
            }
        }
        for (condition, setting) in changes.conditions.sorted(by: { $0.key < $1.key }) {
            do { try device.setOverride(condition, setting.override) } catch {
                return .failure(.internalError, "\(error)")
            }
        }
        if let thermal = changes.thermal {
            do { try device.setThermalOverride(thermal.override) } catch {
                return .failure(.internalError, "\(error)")
            }
        }
        return core.sync {
            device.note(device.conditions())
            if !changes.isEmpty { scheduling.evaluate() }
            var response = ControlResponse()
            response.device = device.conditions()
            return response
        }
    }

    private func clock(advance: Double?) -> ControlResponse {
        let response = clockOnQueue(advance: advance)
        // Notifications that became due are delivered before the answer (off the host's queue).
        if advance != nil && response.ok { notifications.evaluateNow() }
        return response
    }

    private func clockOnQueue(advance: Double?) -> ControlResponse {
        core.sync { () -> ControlResponse in
            let clock = core.clock
            if let seconds = advance {
                do { _ = try clock.advance(by: seconds) } catch {
                    let error = error as? BGTaskError
                    return .failure(error?.code == .outOfRange ? .outOfRange : .badRequest, error?.description ?? "clock advance failed")
                }
                scheduling.evaluate()
            }
            var response = ControlResponse()
            response.clock = ClockReport(mode: clock.mode, now: clock.now, nextDue: try? store.nextDueDate(after: clock.now))
            return response
        }
    }

    // MARK: Launches by hand

    /// Launches a client may start by hand (`open`, `extension-run`) running at once: past it,
    /// `too-many-launches`. Each is a process; without a cap any client could start any number.
    var maximumClientLaunches: Int { max(8, 4 * core.configuration.maximumConcurrentLaunches) }

    /// The refusal of one more client-started launch, or nil. On the queue.
    @HostActor private func clientLaunchRefusal() -> ControlResponse? {
        let started = launches.clientStartedCount
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

    /// A launch started by hand, or the answer refusing it.
    private enum Started {
        case success(String)
        case failure(ControlResponse)
    }

    /// `open`, `extension-run` or `simulate-launch`: starts the launch. Returns the answer (its
    /// id, or a refusal), or nil when the command waits for the record: then `ended` is called
    /// with it when the launch ends (on the host's queue: it must not block).
    private func launchByHand(_ command: ControlCommand, ended: @escaping @Sendable (ControlResponse) -> Void) -> ControlResponse? {
        let refusal: ControlResponse?
        let wait: Bool
        let start: @HostActor () -> Started
        switch command {
        case let .open(app, event, waits):
            (refusal, wait) = (Self.eventRefusal(event), waits)
            start = { self.open(app, event: event) }
        case let .respond(notification, action, waits):
            (refusal, wait) = (nil, waits)
            let found: StoredNotification?
            do { found = try store.deliveredNotification(id: notification) } catch { return .failure(.internalError, "\(error)") }
            guard let found else {
                return .failure(.notFound, "no delivered notification has id \(notification) (bgtask notifications lists them; the newest 100 per app are kept)")
            }
            start = { self.respond(to: found, action: action ?? NotificationResponseEvent.defaultAction) }
        case let .extensionRun(identifier, event, waits):
            (refusal, wait) = (Self.eventRefusal(event), waits)
            start = { self.runExtension(identifier, event: event) }
        case let .simulateLaunch(identifier, app, force, kind, waits):
            (refusal, wait) = (nil, waits)
            start = { self.simulateLaunch(identifier, app: app, force: force, kind: kind) }
        default:
            return .failure(.internalError, "\(command.verb.rawValue) is not a launch by hand")
        }
        if let refusal { return refusal }
        enum Outcome { case answered(ControlResponse), waiting }
        let outcome = core.sync { () -> Outcome in
            guard !launches.isShuttingDown else { return .answered(.failure(.unavailable, "the host is shutting down")) }
            switch start() {
            case .failure(let response): return .answered(response)
            case .success(let id):
                var response = ControlResponse()
                response.launchID = id
                guard wait, launches.whenEnded(id, { record in
                    var answer = ControlResponse()
                    (answer.launchID, answer.record) = (id, record)
                    ended(answer)
                }) else { return .answered(response) }
                return .waiting
            }
        }
        guard case .answered(let response) = outcome else { return nil }
        return response
    }

    /// Opens `app` in the foreground. On the queue.
    @HostActor private func open(_ app: String, event: String?) -> Started {
        guard let bundle = catalog.apps[app] else { return .failure(notInCatalog(app)) }
        if let refusal = clientLaunchRefusal() { return .failure(refusal) }
        return .success(launches.start(bundle, requests: [], reason: .foreground, role: .foreground, eventJSON: event))
    }

    /// The user opened a delivered notification: its app comes to the foreground, with the
    /// notification and the action as its launch's event. On the queue.
    @HostActor private func respond(to notification: StoredNotification, action: String) -> Started {
        guard let bundle = catalog.apps[notification.app] else { return .failure(notInCatalog(notification.app)) }
        if let refusal = clientLaunchRefusal() { return .failure(refusal) }
        // On the app's clock, as every date that crosses to it (see HostRequestBroker).
        let offset = core.clock.appOffset
        let entry = NotificationEntry(request: notification.request, date: (notification.deliveredAt ?? notification.fireDate).map { $0.timeIntervalSince1970 - offset })
        let event: String
        do { event = String(decoding: try JSONEncoder().encode(NotificationResponseEvent(notification: entry, action: action)), as: UTF8.self) } catch {
            return .failure(.failure(.internalError, "\(error)"))
        }
        return .success(launches.start(bundle, requests: [], reason: .notificationResponse, role: .foreground, eventJSON: event))
    }

    /// Starts an extension in its own supervised process with `event`. On the queue.
    @HostActor private func runExtension(_ identifier: String, event: String?) -> Started {
        guard let app = catalog.app(containingBundle: identifier),
              let appex = app.extensions.first(where: { $0.identifier == identifier }) else {
            return .failure(.failure(.notFound, "no app in \(core.configuration.pluginsDirectory.path) contains a valid extension \(identifier) (see bgtask apps)"))
        }
        if let refusal = clientLaunchRefusal() { return .failure(refusal) }
        return .success(launches.start(appex, requests: [], reason: .appExtension, role: .extension, eventJSON: event))
    }

    /// Launches the app holding `identifier`'s request, or with `force` one that permits it.
    /// On the queue.
    @HostActor private func simulateLaunch(_ identifier: String, app: String?, force: Bool, kind: TaskKind?) -> Started {
        do {
            var stored = (try? store.pendingRequest(identifier: identifier)) ?? nil
            if let app, stored?.app != app { stored = (try? store.pending(app: app))?.first { $0.request.identifier == identifier } }
            let bundle: PluginBundle
            var forced: [TaskAssignment] = []
            if let stored {
                guard let found = catalog.apps[stored.app] else { return .failure(.failure(.notFound, "the app \(stored.app) is not in the plugin directory")) }
                bundle = found
            } else {
                guard force else {
                    return .failure(.failure(.notFound, "no pending request for \(identifier): as on iOS, simulating a launch needs one (submit it, or force the launch)"))
                }
                guard let found = app.flatMap({ catalog.apps[$0] }) ?? catalog.app(permitting: identifier) else {
                    return .failure(.failure(.notFound, "no app in the plugin directory permits \(identifier)"))
                }
                bundle = found
                let forcedKind: TaskKind
                if let kind { forcedKind = kind } else {
                    do { forcedKind = try bundle.inferredKind(of: identifier) } catch { return .failure(.failure(.badRequest, error.description)) }
                }
                forced = [TaskAssignment(task: 1, identifier: identifier, kind: forcedKind)]
            }
            if let busy = launches.launch(of: bundle.identifier) {
                return .failure(.failure(.unavailable, "\(bundle.identifier) is running launch \(busy.id); try again when it ends"))
            }
            return .success(launches.start(bundle, requests: stored.map { [$0] } ?? [], forced: forced, reason: .simulated))
        }
    }

    private func simulateExpire(_ identifier: String) -> ControlResponse {
        return core.sync {
            guard let id = launches.expire(identifier: identifier, reason: "simulated") else {
                return .failure(.notFound, "\(identifier) is not running in any launch")
            }
            var response = ControlResponse()
            response.launchID = id
            return response
        }
    }

    private func cancelTask(_ identifier: String) -> ControlResponse {
        return core.sync {
            guard let id = launches.cancelContinued(identifier) else {
                return .failure(.notFound, "no continued-processing task \(identifier) is running or queued")
            }
            var response = ControlResponse()
            response.launchID = id
            return response
        }
    }
}

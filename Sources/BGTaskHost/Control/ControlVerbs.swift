import BGTaskModel
import Dispatch
import Foundation

/// The control protocol's verbs: each turns a `ControlRequest` into calls on the host's parts
/// and their answer into a `ControlResponse`. It owns no state; what it reads of the parts
/// confined to the host queue it reads there (`queue.sync`), and it reads the store off it.
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
    private var queue: DispatchQueue { core.queue }

    func handle(_ request: ControlRequest, peer: PeerCredentials) -> ControlResponse {
        guard let verb = request.knownVerb else {
            return .failure(.unknownVerb, "unknown verb '\(ControlServer.quoted(request.verb))'")
        }
        switch verb {
        case .status: return ControlResponse()
        case .apps: return apps(request)
        case .submit: return submit([request])[0]
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
        case .evict:
            guard let app = request.app else { return .failure(.badRequest, "evict needs an app") }
            guard let apps = launches.suspendedApps else {
                return .failure(.badRequest, "evict: this host keeps no app's process (--app-lifecycle fresh)")
            }
            var response = ControlResponse()
            response.removed = apps.evict(app, reason: "evicted by the operator (bgtask evict)") ? 1 : 0
            return response
        case .device: return device(request)
        case .clock: return clock(request)
        case .simulateLaunch: return simulateLaunch(request)
        case .simulateExpire: return simulateExpire(request)
        case .extensionRun: return runExtension(request)
        case .open: return open(request)
        case .cancelTask: return cancelTask(request)
        case .progress:
            return queue.sync {
                var response = ControlResponse()
                response.continued = launches.continuedStatuses()
                return response
            }
        case .push: return push(request)
        case .pushes:
            return queue.sync {
                var response = ControlResponse()
                let list = (try? store.pushes(app: request.app, limit: request.limit ?? 50)) ?? []
                response.pushes = list.map(pushes.report)
                return response
            }
        case .deviceToken:
            guard let app = request.app else { return .failure(.badRequest, "device-token needs an app") }
            guard queue.sync(execute: { catalog.apps[app] != nil }) else { return notInCatalog(app) }
            return respond { var r = ControlResponse(); r.deviceToken = try store.deviceToken(app: app); return r }
        case .notifications, .pendingNotifications: return notifications(request, pending: verb == .pendingNotifications)
        case .transfers:
            guard let transfers else { return .failure(.unavailable, "this host carries no background transfers") }
            let limit = request.limit ?? 100
            guard limit >= 1 else { return .failure(.badRequest, "transfers: limit must be at least 1, not \(limit)") }
            return respond {
                var response = ControlResponse()
                var reports = try store.transfers(app: request.app, limit: min(limit, 1000)).map(transfers.report)
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
    private func notifications(_ request: ControlRequest, pending: Bool) -> ControlResponse {
        let limit = request.limit ?? NotificationLimits.deliveredPerApp
        guard limit >= 1 else { return .failure(.badRequest, "notifications: limit must be at least 1, not \(limit)") }
        var after: Int64?
        if let text = request.after {
            guard let cursor = Int64(text), cursor >= 0 else {
                return .failure(.badRequest, "notifications: after must be a notification id (a non-negative integer), not '\(ControlServer.quoted(String(text.prefix(64))))'")
            }
            after = cursor
        }
        if let app = request.app, app.utf8.count > InputLimits.identifierBytes {
            return .failure(.badRequest, "notifications: the app identifier is \(app.utf8.count) bytes, over the limit of \(InputLimits.identifierBytes)")
        }
        return respond {
            var response = ControlResponse()
            response.notifications = pending ? try store.pendingNotifications(app: request.app)
                                             : try store.deliveredNotifications(app: request.app, after: after, limit: min(limit, 1000))
            let apps = request.app.map { [$0] } ?? queue.sync { catalog.apps.keys.sorted() }
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
    private func push(_ request: ControlRequest) -> ControlResponse {
        guard let app = request.app, let body = request.push else { return .failure(.badRequest, "push needs an app and a payload") }
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

    /// Pipelined requests: runs of consecutive submissions share one commit; every other request
    /// is handled on its own, in order.
    func handle(_ requests: [ControlRequest], peer: PeerCredentials) -> [ControlResponse] {
        var responses: [ControlResponse] = []
        var index = requests.startIndex
        while index < requests.endIndex {
            var end = index
            while end < requests.endIndex, requests[end].knownVerb == .submit { end += 1 }
            if end > index {
                responses += submit(Array(requests[index..<end]))
                index = end
            } else {
                responses.append(handle(requests[index], peer: peer))
                index += 1
            }
        }
        return responses
    }

    private func respond(_ body: () throws -> ControlResponse) -> ControlResponse {
        do { return try body() } catch { return .failure(.internalError, "\(error)") }
    }

    private func notInCatalog(_ app: String) -> ControlResponse {
        .failure(.notFound, "no valid bundle with identifier \(app.prefix(255)) is in \(core.configuration.pluginsDirectory.path)")
    }

    // MARK: Submissions

    /// `submit` requests, pipelined ones together: one answer each, in order.
    private func submit(_ requests: [ControlRequest]) -> [ControlResponse] {
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

    static func response(_ rejection: SubmissionRules.Rejection?) -> ControlResponse {
        rejection.map { .failure(code($0.status), $0.message) } ?? ControlResponse()
    }

    static func code(_ status: SubmissionRules.Status) -> ControlErrorCode {
        switch status {
        case .unavailable: .unavailable
        case .tooManyPendingTaskRequests: .tooManyPendingTaskRequests
        case .notPermitted: .notPermitted
        case .immediateRunIneligible: .immediateRunIneligible
        }
    }

    // MARK: Reading

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
        let processes = Dictionary(launches.processStates.map { ($0.app, $0) }) { first, _ in first }
        let keepsProcesses = launches.suspendedApps != nil
        let (page, runningByApp, invalid, next) = queue.sync { () -> ([PluginBundle], [String: String], [InvalidBundle]?, String?) in
            var runningByApp: [String: String] = [:]
            for launch in launches.running.values where runningByApp[launch.app] == nil { runningByApp[launch.app] = launch.id }
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
            var summary = AppSummary(
                identifier: bundle.identifier, path: bundle.url.path, permittedIdentifiers: bundle.permittedIdentifiers,
                backgroundModes: bundle.backgroundModes.sorted(), extensions: bundle.extensions.map(\.identifier),
                running: runningByApp[bundle.identifier],
                refreshEnabled: state.refreshEnabled, penaltyLevel: state.penaltyLevel, penaltyUntil: state.penaltyUntil,
                pending: pendingCounts[bundle.identifier] ?? 0)
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

    private func why(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "why needs a task identifier") }
        return queue.sync {
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
            if let launch = launches.launch(running: identifier, app: request.app) {
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
                response.why = WhyReport(app: request.app ?? catalog.app(permitting: identifier)?.identifier ?? "", identifier: identifier,
                                         state: "not-submitted", runningLaunch: nil, request: nil, blockers: [], now: now)
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
            response.why = WhyReport(app: stored.app, identifier: identifier, state: "pending", runningLaunch: nil,
                                     request: stored.request, blockers: blockers, now: now)
            return response
        }
    }

    // MARK: Device and clock

    private func device(_ request: ControlRequest) -> ControlResponse {
        device.invalidate()
        defer { device.invalidate() }
        if var changes = request.device {
            if let app = changes.removeValue(forKey: "app") {
                let refresh = changes.removeValue(forKey: "refresh")
                let notifications = changes.removeValue(forKey: "notifications")
                guard refresh != nil || notifications != nil else {
                    return .failure(.badRequest, "--app goes with --refresh on|off or --notifications on|off|auto")
                }
                if let refresh, !["on", "off"].contains(refresh) {
                    return .failure(.badRequest, "device --app --refresh: expected on or off, got '\(ControlServer.quoted(String(refresh.prefix(64))))'")
                }
                if let notifications, !["on", "off", "auto"].contains(notifications) {
                    return .failure(.badRequest, "device --app --notifications: expected on, off or auto, got '\(ControlServer.quoted(String(notifications.prefix(64))))'")
                }
                // A switch of an installed app, as iOS's Settings shows: a row per name would
                // let a client grow the database without bound.
                guard queue.sync(execute: { catalog.apps[app] != nil }) else { return notInCatalog(app) }
                do {
                    if let refresh { try device.setAppRefresh(app, on: refresh == "on") }
                    if let notifications {
                        try store.setNotificationsAllowed(app: app, notifications == "auto" ? nil : notifications == "on")
                    }
                } catch {
                    return .failure(.internalError, "\(error)")
                }
            } else if changes["notifications"] != nil {
                return .failure(.badRequest, "--notifications is a per-app switch: it goes with --app (bgtask host --allow-notifications allows every app)")
            }
            for (key, value) in changes {
                guard DeviceOverrides.keys.contains(key) else {
                    return .failure(.badRequest, "unknown device condition '\(key)' (known: \(DeviceOverrides.keys.joined(separator: ", ")))")
                }
                guard ["on", "off", "auto"].contains(value) else {
                    return .failure(.badRequest, "device \(key): expected on, off or auto, got '\(value)'")
                }
                do { try device.setOverride(key, value == "auto" ? nil : value) } catch {
                    return .failure(.internalError, "\(error)")
                }
            }
        }
        return queue.sync {
            device.note(device.conditions())
            if request.device != nil { scheduling.evaluate() }
            var response = ControlResponse()
            response.device = device.conditions()
            return response
        }
    }

    private func clock(_ request: ControlRequest) -> ControlResponse {
        let response = clockOnQueue(request)
        // Notifications that became due are delivered before the answer (off the host's queue).
        if request.advance != nil && response.ok { notifications.evaluateNow() }
        return response
    }

    private func clockOnQueue(_ request: ControlRequest) -> ControlResponse {
        queue.sync { () -> ControlResponse in
            let clock = core.clock
            if let seconds = request.advance {
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

    /// The response for a started launch: its id, and with `wait` its record once it ends
    /// (blocking the calling control thread, never the queue).
    private func launched(_ id: String, _ semaphore: DispatchSemaphore, wait: Bool) -> ControlResponse {
        var response = ControlResponse()
        response.launchID = id
        guard wait else { return response }
        semaphore.wait()
        response.record = queue.sync { launches.takeRecord(of: id) }
        return response
    }

    /// Launches a client may start by hand (`open`, `extension-run`) running at once: past it,
    /// `too-many-launches`. Each is a process; without a cap any client could start any number.
    var maximumClientLaunches: Int { max(8, 4 * core.configuration.maximumConcurrentLaunches) }

    /// The refusal of one more client-started launch, or nil. On the queue.
    private func clientLaunchRefusal() -> ControlResponse? {
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

    /// Starts a launch by hand on the queue with `start`, then answers with its id and, with
    /// `wait`, its record.
    private func startByHand(wait: Bool, _ start: () -> Started) -> ControlResponse {
        enum Outcome { case started(String, DispatchSemaphore), refused(ControlResponse) }
        let started = queue.sync { () -> Outcome in
            guard !launches.isShuttingDown else { return .refused(.failure(.unavailable, "the host is shutting down")) }
            switch start() {
            case .success(let id): return .started(id, launches.waiter(for: id))
            case .failure(let response): return .refused(response)
            }
        }
        switch started {
        case .refused(let response): return response
        case let .started(id, semaphore): return launched(id, semaphore, wait: wait)
        }
    }

    private func open(_ request: ControlRequest) -> ControlResponse {
        guard let app = request.app else { return .failure(.badRequest, "open needs an app") }
        if let refusal = Self.eventRefusal(request.event) { return refusal }
        return startByHand(wait: request.wait == true) {
            guard let bundle = catalog.apps[app] else { return .failure(notInCatalog(app)) }
            if let refusal = clientLaunchRefusal() { return .failure(refusal) }
            return .success(launches.start(bundle, requests: [], reason: .foreground, role: .foreground, eventJSON: request.event))
        }
    }

    /// Starts an extension in its own supervised process with `event`, waits for its record.
    private func runExtension(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "extension-run needs an extension identifier") }
        if let refusal = Self.eventRefusal(request.event) { return refusal }
        return startByHand(wait: request.wait != false) {
            guard let app = catalog.app(containingBundle: identifier),
                  let appex = app.extensions.first(where: { $0.identifier == identifier }) else {
                return .failure(.failure(.notFound, "no app in \(core.configuration.pluginsDirectory.path) contains a valid extension \(identifier) (see bgtask apps)"))
            }
            if let refusal = clientLaunchRefusal() { return .failure(refusal) }
            return .success(launches.start(appex, requests: [], reason: .appExtension, role: .extension, eventJSON: request.event))
        }
    }

    private func simulateLaunch(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "simulate-launch needs a task identifier") }
        return startByHand(wait: request.wait != false) {
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
            if let busy = launches.launch(of: bundle.identifier) {
                return .failure(.failure(.unavailable, "\(bundle.identifier) is running launch \(busy.id); try again when it ends"))
            }
            return .success(launches.start(bundle, requests: stored.map { [$0] } ?? [], forced: forced, reason: .simulated))
        }
    }

    private func simulateExpire(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "simulate-expire needs a task identifier") }
        return queue.sync {
            guard let id = launches.expire(identifier: identifier, reason: "simulated") else {
                return .failure(.notFound, "\(identifier) is not running in any launch")
            }
            var response = ControlResponse()
            response.launchID = id
            return response
        }
    }

    private func cancelTask(_ request: ControlRequest) -> ControlResponse {
        guard let identifier = request.identifier else { return .failure(.badRequest, "cancel-task needs a task identifier") }
        return queue.sync {
            guard let id = launches.cancelContinued(identifier) else {
                return .failure(.notFound, "no continued-processing task \(identifier) is running or queued")
            }
            var response = ControlResponse()
            response.launchID = id
            return response
        }
    }
}

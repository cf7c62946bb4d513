import BGTaskModel
import BGTaskSystem
import BGTaskWire
import Dispatch
import Foundation
import Glibc
import Logging

/// The launch a transfer call came from: who asks (the bundle, and the app that owns its
/// transfers) and how to reach it with events.
struct TransferCaller: Sendable {
    /// The owner of the transfers: the app (an extension's transfers are its containing app's).
    var app: String
    /// The bundle whose launch calls (its container and app groups hold upload bodies).
    var bundle: PluginBundle
    var launchID: String
    /// Sends a `TransferEvent`'s JSON to the launch (through its supervising thread). Nil: the
    /// launch cannot receive events.
    var send: (@Sendable (String) -> Void)?
}

/// What a scheduling pass lets the part do about launches, and does for it (on the host queue).
struct TransferLauncher {
    /// The launches running now (sessions attached to others are detached).
    var runningLaunches: Set<String>
    /// Whether a launch of the app runs (its events wait until it attaches the session).
    var isAppRunning: (String) -> Bool
    /// Launch slots free now.
    var freeSlots: Int
    /// Starts a `background-transfer` launch of the app with this eventJSON: its id, or nil when
    /// the app is not installed.
    var start: (_ app: String, _ eventJSON: String) -> String?
}

/// Background URL sessions' transfers, carried by the host (`nsurlsessiond`'s part): kept in the
/// store, held while their conditions do not hold (`heldBy`), run by the `TransferEngine` with
/// retries and resumes, their events routed to the launch attached to their session, and the
/// app launched (`background-transfer`) when they end and it is not running.
///
/// Its state is confined to its own serial queue: engine callbacks and launches' calls hop
/// onto it. It never waits for the host queue; the host queue may wait for it (`evaluate`).
final class BackgroundTransfers: HostPart, @unchecked Sendable {
    struct Environment: Sendable {
        var store: PendingRequestStore
        var clock: HostClock
        var stateDirectory: URL
        /// Apps' own uids (a root host confining launches): a delivered file is given to the app.
        var identities: AppIdentities?
        var conditions: @Sendable () -> DeviceConditions
        var logger: Logger
        /// Retries after a failed attempt: the first delay, doubling, capped.
        var firstRetryDelay: TimeInterval = 1
        var maximumRetryDelay: TimeInterval = 60
        /// Running transfers' bytes are written to the store at most this often.
        var progressSaveInterval: TimeInterval = 2
        /// What transfers may cost the host, per app and together (the disk reserve is the
        /// host's `--disk-reserve`).
        var bounds = TransferBounds()
    }

    /// Something a scheduling pass should look at (a transfer ended, a hold lifts): called on the
    /// part's queue; must not block.
    var onChange: @Sendable () -> Void = {}
    /// `store.transferWrites` when the last look for finished transfers found none to launch
    /// for (on the host queue).
    private var nothingDueAt: UInt64?

    private let environment: Environment
    private let queue = DispatchQueue(label: "bgtask.transfers")
    private let copyQueue = DispatchQueue(label: "bgtask.transfers.copy")
    private var engine: TransferEngine?
    private var stopping = false

    /// Transfers that may still move bytes (waiting, running), by id.
    private var live: [String: StoredTransfer] = [:]
    private struct Attempt {
        /// The app it runs for (kept here: a cancelled transfer leaves `live` before its
        /// attempt's end arrives, and the attempt still holds its connection until then).
        var app: String
        var handle: TransferAttemptHandle
        var generation: Int
        var stop: StopReason?
        var lastSaved = Date()
    }
    enum StopReason { case cancel, resourceTimeout, pause, shutdown }
    private var attempts: [String: Attempt] = [:]
    private var generation = 0
    /// After a failed attempt: when the next may start, and why it waits.
    private var retries: [String: (at: Date, why: String, failures: Int)] = [:]
    /// Upload bodies being copied into the spool.
    private var copying: Set<String> = []
    private var timers: [String: DispatchWorkItem] = [:]
    private struct SessionKey: Hashable { var app: String; var session: String }
    private var attached: [SessionKey: (launchID: String, send: @Sendable (String) -> Void)] = [:]
    /// A look at the queued transfers is due (the host's descriptors held them back).
    private var queuedLookArmed = false
    /// What each app's transfers hold in the spool directory.
    let staging: StagingLedger

    init(_ environment: Environment) {
        self.environment = environment
        staging = StagingLedger(bounds: environment.bounds,
                                directory: environment.stateDirectory.appendingPathComponent("transfers").path)
    }

    /// Bytes and inodes `app`'s transfers hold in the host's staging now (partial downloads,
    /// copied upload bodies; a delivered download is in the app's container, and no longer
    /// here): what per-app disk quotas add to the container's use. Any thread.
    func stagingUsage(app: String) -> (bytes: UInt64, inodes: Int) {
        staging.usage(app: app)
    }

    var partName: String { "background transfers" }

    private var store: PendingRequestStore { environment.store }
    private var logger: Logger { environment.logger }
    var spoolDirectory: String { environment.stateDirectory.appendingPathComponent("transfers").path }

    /// Makes the spool directory, starts the engine, and takes up the transfers a previous host
    /// left unfinished (a running one resumes where its spool file ends).
    func start() throws(BGTaskError) {
        if mkdir(spoolDirectory, 0o700) != 0 && errno != EEXIST {
            throw BGTaskError(.system, file: spoolDirectory, errno: errno, "cannot create the transfers' spool directory")
        }
        chmod(spoolDirectory, 0o700)
        let unfinished = try store.unfinishedTransfers()
        engine = TransferEngine(logger: logger)
        queue.sync {
            for var transfer in unfinished {
                var info = stat()
                if let spool = transfer.spool, stat(spool, &info) == 0 {
                    staging.set(transfer.id, app: transfer.app, UInt64(max(0, info.st_blocks)) * 512)
                }
                if transfer.info.state == .running {
                    transfer.info.state = .waiting
                    transfer.info.heldBy = "resuming after the host restarted"
                }
                live[transfer.id] = transfer
                armResourceTimeout(transfer)
            }
            if !unfinished.isEmpty { logger.info("transfers taken up", metadata: ["count": "\(unfinished.count)"]) }
            considerAll()
        }
    }

    /// Stops every attempt (their state stays as stored: the next host resumes them) and the engine.
    func stop() {
        let handles: [TransferAttemptHandle] = queue.sync {
            stopping = true
            for (id, _) in attempts { attempts[id]?.stop = .shutdown }
            timers.values.forEach { $0.cancel() }
            timers.removeAll()
            return attempts.values.map(\.handle)
        }
        handles.forEach { $0.stop() }
        engine?.shutdown()
        queue.sync {}
    }

    // MARK: Calls from launches

    /// Answers a launch's call (on its supervising thread).
    func answer(_ call: TransferCall, from caller: TransferCaller) -> TransferCallAnswer {
        if let problem = call.problem { return .failure(TransferCallAnswer.invalidArgument, problem) }
        switch call {
        case .create(let request): return create(request, from: caller)
        case .cancel(let id): return queue.sync { cancel(id: id, caller: caller) }
        case .attach(let session): return queue.sync { attach(session: session, caller: caller) }
        case .delivered(let id): return queue.sync { delivered(id: id, caller: caller) }
        case .eventsHandled(let session):
            logger.info("background session events handled", metadata: ["bundle.id": "\(caller.app)", "session": "\(session)", "launch.id": "\(caller.launchID)"])
            return TransferCallAnswer(reply: TransferReply())
        }
    }

    private func create(_ request: TransferRequest, from caller: TransferCaller) -> TransferCallAnswer {
        let id = RandomIdentifier.uuidString()
        let now = Date()
        var body: (fd: Int32, size: Int64)?
        if request.kind == .upload, let path = request.bodyFile {
            switch UploadBodyFile.open(path, roots: allowedRoots(caller.bundle), owner: try? environment.identities?.uid(forApp: caller.app)) {
            case .success(let opened): body = opened
            case .failure(let refusal): return .failure(TransferCallAnswer.invalidArgument, "bodyFile: \(refusal.message)")
            }
            // Staged as it is: its data, holes kept holes. Charged before a byte is copied:
            // a body the app's cap or the disk reserve has no room for is refused here.
            if let opened = body {
                let data = UInt64(UploadBodyFile.dataBytes(opened.fd, size: opened.size))
                if let refusal = staging.grow(id, app: caller.app, to: data) ?? staging.checkDisk(adding: data) {
                    staging.release(id)
                    close(opened.fd)
                    return .failure(TransferCallAnswer.unavailable, "bodyFile: '\(path.prefix(300))' (\(opened.size) bytes, \(data) of data) cannot be staged: \(refusal)")
                }
            }
        }
        var info = TransferInfo(id: id, app: caller.app, request: request, createdAt: now.timeIntervalSince1970)
        info.bytesExpectedToSend = body?.size ?? 0
        // An app's dates are on the real clock; the host's may be virtual (as submissions).
        let offset = environment.clock.mode == .virtual ? environment.clock.now.timeIntervalSince(now) : 0
        var transfer = StoredTransfer(info: info, request: request, bundle: caller.bundle.identifier,
                                      notBefore: request.earliestBeginDate.map { $0 + offset })
        switch request.kind {
        case .download: transfer.spool = spoolDirectory + "/\(id).part"
        case .upload: transfer.spool = spoolDirectory + "/\(id).body"
        case .data: break
        }
        let created: Bool
        let queuedLimit = environment.bounds.queuedPerApp
        do { created = try store.createTransfer(transfer, activeLimit: queuedLimit) } catch {
            if let body { close(body.fd) }
            staging.release(id)
            return .failure(TransferCallAnswer.failed, "the host could not keep the transfer: \(error)")
        }
        guard created else {
            if let body { close(body.fd) }
            staging.release(id)
            return .failure(TransferCallAnswer.unavailable, "\(TransferBounds.tooManyQueuedName): \(caller.app) has \(queuedLimit) transfers not yet delivered, the most the host keeps for an app (deliver or cancel some first)")
        }
        logger.info("transfer created", metadata: ["transfer.id": "\(id)", "bundle.id": "\(caller.app)", "session": "\(request.session)",
                                                  "kind": "\(request.kind.rawValue)", "launch.id": "\(caller.launchID)"])
        return queue.sync {
            live[id] = transfer
            armResourceTimeout(transfer)
            if let body, let spool = transfer.spool { copyBody(id: id, app: caller.app, from: body.fd, size: body.size, to: spool) }
            if let send = caller.send {
                // Creating a task in a session attaches the launch to it, as attach does.
                attached[SessionKey(app: caller.app, session: request.session)] = (caller.launchID, send)
            }
            consider(id)
            return TransferCallAnswer(reply: TransferReply(transfer: live[id]?.info ?? transfer.info))
        }
    }

    /// Directories an upload's body may be in: the calling bundle's container and the app
    /// groups the host grants it (`AppGroupOwners`; not every group its bundle names: a group
    /// refused to its launches is refused to what the host carries for it too).
    private func allowedRoots(_ bundle: PluginBundle) -> [String] {
        let state = environment.stateDirectory.path
        let granted = bundle.appGroups.isEmpty ? [] : ((try? AppGroupOwners(stateDirectory: environment.stateDirectory)
            .decide(app: bundle.containingApp ?? bundle.identifier, groups: bundle.appGroups, claim: false))?.granted ?? [])
        return [state + "/containers/" + bundle.identifier] + granted.map { AppContainer.groupDirectory(root: state + "/groups", identifier: $0) }
    }

    /// Copies an upload's body into the spool (off the part's queue), so that the upload survives
    /// the app deleting or changing its file; then the transfer may start.
    private func copyBody(id: String, app: String, from fd: Int32, size: Int64, to spool: String) {
        copying.insert(id)
        let staging = self.staging
        copyQueue.async { [self] in
            // Each part charged (the app may have written data into its holes since) and the
            // disk reserve asked, before it is written.
            let result = UploadBodyFile.copy(fd, size: size, to: spool) { copied, adding in
                staging.grow(id, app: app, to: UInt64(copied + adding)) ?? staging.checkDisk(adding: UInt64(adding))
            }
            close(fd)
            queue.async { [self] in
                copying.remove(id)
                if case .failure(let error) = result {
                    let code = error.refusal != nil ? TransferError.cannotWriteToFileCode : TransferError.fileDoesNotExistCode
                    finish(id, state: .failed, error: TransferError(code: code, message: error.description))
                } else {
                    consider(id)
                }
            }
        }
    }

    private func owned(_ id: String, by caller: TransferCaller) -> StoredTransfer? {
        if let transfer = live[id] { return transfer.app == caller.app ? transfer : nil }
        guard let transfer = try? store.transfer(id: id), transfer.app == caller.app else { return nil }
        return transfer
    }

    private func cancel(id: String, caller: TransferCaller) -> TransferCallAnswer {
        guard let transfer = owned(id, by: caller) else { return .failure(TransferCallAnswer.invalidArgument, "id: no transfer \(id) of \(caller.app)") }
        guard !transfer.info.state.isFinished else { return TransferCallAnswer(reply: TransferReply(transfer: transfer.info)) }
        attempts[id]?.stop = .cancel
        attempts[id]?.handle.stop()
        // The app asked: it is told by its own task, not by an event.
        let info = finish(id, state: .cancelled, error: TransferError(code: TransferError.cancelledCode, message: "cancelled by the app"), announce: false)
        return TransferCallAnswer(reply: TransferReply(transfer: info ?? transfer.info))
    }

    private func attach(session: String, caller: TransferCaller) -> TransferCallAnswer {
        if let send = caller.send { attached[SessionKey(app: caller.app, session: session)] = (caller.launchID, send) }
        var transfers: [TransferInfo]
        do {
            transfers = try store.undeliveredTransfers(app: caller.app, session: session).map { live[$0.id]?.info ?? $0.info }
        } catch {
            return .failure(TransferCallAnswer.failed, "the host could not read the session's transfers: \(error)")
        }
        // What is told here is announced to this launch: no background-transfer launch for it.
        let finished = transfers.filter(\.state.isFinished).map(\.id)
        if !finished.isEmpty { try? store.markTransfersLaunched(finished, launchID: caller.launchID) }
        Self.fit(&transfers, logger: logger)
        logger.info("background session attached", metadata: ["bundle.id": "\(caller.app)", "session": "\(session)",
                                                              "launch.id": "\(caller.launchID)", "transfers": "\(transfers.count)"])
        return TransferCallAnswer(reply: TransferReply(transfers: transfers))
    }

    /// The channel carries one message of 256 KiB: an attach answer too large loses response
    /// bodies first (the largest), then its newest transfers (logged; they come with the next attach).
    static func fit(_ transfers: inout [TransferInfo], logger: Logger) {
        let limit = LaunchChannel.maximumMessageBytes - 4096
        func size() -> Int { (try? JSONEncoder.transferJSON.encode(TransferReply(transfers: transfers)).count) ?? Int.max }
        guard size() > limit else { return }
        for index in transfers.indices.sorted(by: { (transfers[$0].body?.count ?? 0) > (transfers[$1].body?.count ?? 0) }) {
            guard transfers[index].body != nil, size() > limit else { break }
            transfers[index].body = nil
        }
        var dropped = 0
        while size() > limit, !transfers.isEmpty {
            transfers.removeLast()
            dropped += 1
        }
        logger.warning("an attach answer was cut to fit the launch channel", metadata: ["left-out": "\(dropped)"])
    }

    private func delivered(id: String, caller: TransferCaller) -> TransferCallAnswer {
        guard var transfer = owned(id, by: caller) else { return .failure(TransferCallAnswer.invalidArgument, "id: no transfer \(id) of \(caller.app)") }
        if transfer.info.state == .delivered { return TransferCallAnswer(reply: TransferReply(transfer: transfer.info), delivered: id) }
        if !transfer.info.state.isFinished {
            attempts[id]?.stop = .cancel
            attempts[id]?.handle.stop()
            transfer = StoredTransfer(info: finish(id, state: .cancelled, error: TransferError(code: TransferError.cancelledCode, message: "delivered before it ended"), announce: false) ?? transfer.info,
                                      request: transfer.request, bundle: transfer.bundle)
            transfer = (try? store.transfer(id: id)) ?? transfer
        }
        if let file = transfer.info.file { DownloadDelivery.remove(file, app: caller.app, stateDirectory: environment.stateDirectory) }
        transfer.info.state = .delivered
        transfer.info.body = nil
        transfer.deliveredInLaunch = caller.launchID
        transfer.deliveredAt = Date().timeIntervalSince1970
        do { try store.saveTransfer(transfer) } catch {
            return .failure(TransferCallAnswer.failed, "the host could not record the delivery: \(error)")
        }
        return TransferCallAnswer(reply: TransferReply(transfer: transfer.info), delivered: id)
    }

    // MARK: Holding and starting

    /// What holds a waiting transfer back now, or nil.
    private func hold(_ transfer: StoredTransfer, _ conditions: DeviceConditions, now: Date) -> String? {
        if copying.contains(transfer.id) { return "copying the upload's body" }
        if let notBefore = transfer.notBefore, environment.clock.now.timeIntervalSince1970 < notBefore {
            return "earliestBeginDate: not before \(ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: notBefore)))"
        }
        if !conditions.network { return "no network: waits for connectivity" }
        if transfer.request.discretionary && !conditions.externalPower {
            return "discretionary: the device is on battery (waits for external power)"
        }
        if let retry = retries[transfer.id], retry.at > now {
            return "retrying: \(retry.why); next attempt at \(ISO8601DateFormatter().string(from: retry.at))"
        }
        return nil
    }

    private func considerAll() {
        let conditions = environment.conditions()
        for id in live.keys.sorted() { consider(id, conditions) }
    }

    /// Starts, holds or pauses one transfer as its conditions say. On the queue.
    private func consider(_ id: String, _ conditions: DeviceConditions? = nil) {
        guard !stopping, var transfer = live[id] else { return }
        let now = Date()
        let held = hold(transfer, conditions ?? environment.conditions(), now: now)
        if transfer.info.state == .running {
            // A running transfer whose conditions went away (network, power) waits again.
            guard let held, !held.hasPrefix("retrying"), !held.hasPrefix("copying"), attempts[id] != nil else { return }
            attempts[id]?.stop = .pause
            attempts[id]?.handle.stop()
            transfer.info.state = .waiting
            transfer.info.heldBy = held
            live[id] = transfer
            try? store.saveTransfer(transfer)
            logger.info("transfer paused", metadata: ["transfer.id": "\(id)", "why": "\(held)"])
            return
        }
        if let held {
            if transfer.info.heldBy != held {
                transfer.info.heldBy = held
                live[id] = transfer
                try? store.saveTransfer(transfer)
            }
            if let retry = retries[id], retry.at > now {
                queue.asyncAfter(deadline: .now() + retry.at.timeIntervalSince(now) + 0.001) { [weak self] in self?.consider(id) }
            }
            return
        }
        guard attempts[id] == nil, let engine else { return }
        // Bounded: the app's running attempts, then the host's descriptors. Not written to the
        // store (a queued transfer is a waiting one; the hold is recomputed on every look).
        let appRunning = attempts.values.reduce(0) { $0 + ($1.app == transfer.app ? 1 : 0) }
        if let queued = environment.bounds.queuedHold(app: transfer.app, running: appRunning)
            ?? environment.bounds.descriptorHold(running: attempts.count) {
            transfer.info.heldBy = queued
            live[id] = transfer
            if appRunning < environment.bounds.runningPerApp { armQueuedLook() }
            return
        }
        transfer.info.state = .running
        transfer.info.heldBy = nil
        transfer.info.attempts += 1
        live[id] = transfer
        do { try store.saveTransfer(transfer) } catch {
            logger.error("cannot record a transfer's attempt", metadata: ["transfer.id": "\(id)", "error": "\(error)"])
        }
        generation += 1
        let mine = generation
        let attempt = TransferAttempt(
            id: id, kind: transfer.info.kind, url: transfer.request.url, method: transfer.request.method, headers: transfer.request.headers,
            requestTimeout: transfer.request.requestTimeout, spool: transfer.info.kind == .download ? transfer.spool : nil,
            validator: transfer.validator, body: transfer.info.kind == .upload ? transfer.spool : nil,
            bodyLength: transfer.info.bytesExpectedToSend, inlineLimit: TransferLimits.inlineBodyBytes,
            app: transfer.app, staging: staging)
        logger.debug("transfer attempt", metadata: ["transfer.id": "\(id)", "attempt": "\(transfer.info.attempts)"])
        let handle = engine.start(attempt) { [weak self] event in
            guard let self else { return }
            self.queue.async { self.handle(event, of: id, generation: mine) }
        }
        // Its events hop onto this queue: none is handled before the attempt is kept.
        attempts[id] = Attempt(app: transfer.app, handle: handle, generation: mine)
    }

    /// Starts the queued transfers that may start now, oldest first: after an attempt ended
    /// (its app's slot and its descriptors are free). On the queue.
    private func startQueued() {
        let queued = live.values.filter { $0.info.state == .waiting && $0.info.heldBy?.hasPrefix("queued") == true && attempts[$0.id] == nil }
        guard !queued.isEmpty else { return }
        let conditions = environment.conditions()
        for transfer in queued.sorted(by: { ($0.info.createdAt, $0.id) < ($1.info.createdAt, $1.id) }) {
            consider(transfer.id, conditions)
            // Held for the host's descriptors: so is every other one now (one count of
            // /proc/self/fd a pass, not one a queued transfer).
            if let held = live[transfer.id]?.info.heldBy, held.hasPrefix("queued: transfers of all apps") || held.hasPrefix("queued: the host has") { break }
        }
    }

    /// Looks at the queued transfers again in a second: nothing else says when the host's
    /// descriptors are free again.
    private func armQueuedLook() {
        guard !queuedLookArmed else { return }
        queuedLookArmed = true
        queue.asyncAfter(deadline: .now() + 1) { [weak self] in
            guard let self else { return }
            self.queuedLookArmed = false
            self.startQueued()
        }
    }

    // MARK: Attempts' events

    private func handle(_ event: TransferAttemptEvent, of id: String, generation mine: Int) {
        guard attempts[id]?.generation == mine else { return }
        if case let .finished(result) = event {
            let stop = attempts.removeValue(forKey: id)?.stop
            finished(id, result, stop: stop)
            startQueued()
            return
        }
        guard var transfer = live[id] else { return }
        switch event {
        case let .response(response, validator, offset, expected):
            transfer.info.response = response
            if transfer.info.kind == .download { transfer.validator = validator }
            if offset > 0 { transfer.info.resumed = true }
            transfer.info.bytesReceived = offset
            transfer.info.bytesExpectedToReceive = expected
            live[id] = transfer
            // Durable: a resume after a crash needs the validator.
            try? store.saveTransfer(transfer)
        case let .progress(received, expected, sent):
            transfer.info.bytesReceived = received
            transfer.info.bytesExpectedToReceive = expected
            transfer.info.bytesSent = sent
            live[id] = transfer
            if let saved = attempts[id]?.lastSaved, Date().timeIntervalSince(saved) >= environment.progressSaveInterval {
                attempts[id]?.lastSaved = Date()
                try? store.saveTransferProgress(id: id, received: received, expected: expected, sent: sent)
            }
            announce(transfer.info, event: "progress")
        case .finished:
            break
        }
    }

    private func finished(_ id: String, _ result: TransferAttemptResult, stop: StopReason?) {
        guard var transfer = live[id] else { return }
        switch (stop, result) {
        case (.shutdown?, _):
            return
        case (.cancel?, _):
            return
        case (.resourceTimeout?, _):
            finish(id, state: .failed, error: Self.resourceTimeoutError(transfer))
        case (.pause?, _):
            consider(id)
        case (nil, .stopped):
            return
        case (nil, let .completed(received, body)):
            transfer.info.bytesReceived = received
            if transfer.info.bytesExpectedToReceive < 0 { transfer.info.bytesExpectedToReceive = received }
            transfer.info.bytesSent = transfer.info.bytesExpectedToSend
            live[id] = transfer
            if transfer.info.kind == .download, let spool = transfer.spool {
                switch DownloadDelivery.deliver(spool, app: transfer.app, stateDirectory: environment.stateDirectory, identities: environment.identities) {
                case .success(let file):
                    transfer.info.file = file
                    live[id] = transfer
                case .failure(let error):
                    finish(id, state: .failed, error: TransferError(code: TransferError.cannotWriteToFileCode, message: error.description))
                    return
                }
            }
            if let body {
                var probe = transfer.info
                probe.body = body
                probe.state = .completed
                let size = (try? JSONEncoder.transferJSON.encode(TransferEvent(event: "finished", transfer: probe)).count) ?? Int.max
                guard size <= LaunchChannel.maximumMessageBytes - 1024 else {
                    finish(id, state: .failed, error: TransferError(code: -1103, message: "the response body (\(body.count) bytes) is too large to carry back through the launch channel (use a download task)"))
                    return
                }
                transfer.info.body = body
                live[id] = transfer
            }
            finish(id, state: .completed, error: nil)
        case (nil, let .failed(error, retry, restart)):
            if restart {
                if let spool = transfer.spool, transfer.info.kind == .download {
                    truncate(spool, 0)
                    staging.set(id, app: transfer.app, 0)
                }
                transfer.validator = nil
                transfer.info.bytesReceived = 0
            }
            let deadline = transfer.info.createdAt + transfer.request.resourceTimeout
            let failures = (retries[id]?.failures ?? 0) + 1
            let delay = restart ? 0 : min(environment.maximumRetryDelay, environment.firstRetryDelay * pow(2, Double(failures - 1)))
            let at = Date().addingTimeInterval(delay)
            guard retry, at.timeIntervalSince1970 < deadline else {
                finish(id, state: .failed, error: retry ? Self.resourceTimeoutError(transfer, after: error) : error)
                return
            }
            retries[id] = (at, "\(error.message) (\(error.code))", failures)
            transfer.info.state = .waiting
            live[id] = transfer
            logger.info("transfer attempt failed; retrying", metadata: ["transfer.id": "\(id)", "error": "\(error.message)", "delay": "\(delay)"])
            consider(id)
        }
    }

    static func resourceTimeoutError(_ transfer: StoredTransfer, after error: TransferError? = nil) -> TransferError {
        TransferError(code: TransferError.timedOutCode, message: "the resource timeout (\(transfer.request.resourceTimeout) s from creation) passed"
            + (error.map { "; the last attempt: \($0.message)" } ?? ""))
    }

    /// Ends a transfer: the state written (durably) before anyone is told, the spool removed,
    /// the session's launch told (`announce`), and the host asked to look at launches. On the queue.
    @discardableResult
    private func finish(_ id: String, state: TransferState, error: TransferError?, announce: Bool = true) -> TransferInfo? {
        guard var transfer = live.removeValue(forKey: id) ?? (try? store.transfer(id: id)) else { return nil }
        timers.removeValue(forKey: id)?.cancel()
        retries[id] = nil
        transfer.info.state = state
        transfer.info.heldBy = nil
        transfer.info.error = error
        transfer.info.finishedAt = Date().timeIntervalSince1970
        if let spool = transfer.spool { unlink(spool) }
        staging.release(id)
        transfer.spool = nil
        transfer.validator = nil
        let route = attached[SessionKey(app: transfer.app, session: transfer.info.session)]
        if announce, let route { transfer.launchedFor = route.launchID }
        do { try store.saveTransfer(transfer) } catch {
            logger.error("cannot record a transfer's end", metadata: ["transfer.id": "\(id)", "error": "\(error)"])
        }
        logger.info("transfer ended", metadata: ["transfer.id": "\(id)", "bundle.id": "\(transfer.app)", "state": "\(state.rawValue)",
                                                "status": "\(transfer.info.response?.status ?? 0)", "error": "\(error?.message ?? "")"])
        if announce {
            self.announce(transfer.info, event: "finished")
            onChange()
        }
        return transfer.info
    }

    /// Sends an event to the launch attached to the transfer's session, if any.
    private func announce(_ info: TransferInfo, event: String) {
        guard let route = attached[SessionKey(app: info.app, session: info.session)],
              let json = try? JSONEncoder.transferJSON.encode(TransferEvent(event: event, transfer: info)) else { return }
        route.send(String(decoding: json, as: UTF8.self))
    }

    private func armResourceTimeout(_ transfer: StoredTransfer) {
        let id = transfer.id
        let deadline = transfer.info.createdAt + transfer.request.resourceTimeout
        let item = DispatchWorkItem { [weak self] in
            guard let self, let transfer = self.live[id] else { return }
            if self.attempts[id] != nil {
                self.attempts[id]?.stop = .resourceTimeout
                self.attempts[id]?.handle.stop()
            } else {
                self.finish(id, state: .failed, error: Self.resourceTimeoutError(transfer))
            }
        }
        timers[id]?.cancel()
        timers[id] = item
        queue.asyncAfter(wallDeadline: .now() + max(0, deadline - Date().timeIntervalSince1970), execute: item)
    }

    // MARK: The scheduling pass

    /// Re-evaluates holds (device conditions, the clock) and starts the launches finished
    /// transfers wait for. On the host queue: what to wake for next, and whether device
    /// conditions must be watched.
    func evaluate(_ conditions: DeviceConditions, launcher: TransferLauncher) -> (wakeAt: Date?, watchConditions: Bool) {
        let (wakeAt, watch) = queue.sync { () -> (Date?, Bool) in
            attached = attached.filter { launcher.runningLaunches.contains($0.value.launchID) }
            for id in live.keys.sorted() { consider(id, conditions) }
            var wakeAt: Date?
            var watch = false
            for transfer in live.values {
                if let notBefore = transfer.notBefore, environment.clock.now.timeIntervalSince1970 < notBefore {
                    let date = Date(timeIntervalSince1970: notBefore - (environment.clock.mode == .virtual ? environment.clock.now.timeIntervalSince(Date()) : 0))
                    wakeAt = min(wakeAt ?? date, date)
                }
                // Network and power holds, and running transfers that depend on them.
                if transfer.info.state == .running || transfer.info.heldBy?.hasPrefix("no network") == true
                    || transfer.info.heldBy?.hasPrefix("discretionary") == true { watch = true }
            }
            return (wakeAt, watch)
        }
        launchForEvents(launcher)
        return (wakeAt, watch)
    }

    /// Launches apps whose finished transfers (of sessions that send launch events) nobody was
    /// told of: one `background-transfer` launch per app, naming its sessions, when the app is
    /// not running and a slot is free. On the host queue.
    private func launchForEvents(_ launcher: TransferLauncher) {
        // Nothing was due at the last look and no transfer was written since: no read (every
        // scheduling pass comes here, once per submission and per launch's end).
        let writes = store.transferWrites.withLock { $0 }
        guard launcher.freeSlots > 0, writes != nothingDueAt, let waiting = try? store.undeliveredTransfers() else { return }
        let due = waiting.filter { $0.info.state.isFinished && $0.launchedFor == nil && $0.request.sendsLaunchEvents }
        guard !due.isEmpty else {
            nothingDueAt = writes
            return
        }
        nothingDueAt = nil
        var slots = launcher.freeSlots
        let attachedNow = queue.sync { Set(attached.keys) }
        for (app, transfers) in Dictionary(grouping: due, by: \.app).sorted(by: { $0.key < $1.key }) {
            guard slots > 0, !launcher.isAppRunning(app) else { continue }
            let pending = transfers.filter { !attachedNow.contains(SessionKey(app: app, session: $0.info.session)) }
            guard !pending.isEmpty else { continue }
            // Every session of the app with finished, undelivered transfers.
            let sessions = Array(Set(waiting.filter { $0.app == app && $0.info.state.isFinished }.map(\.info.session))).sorted()
            guard let json = try? JSONEncoder.transferJSON.encode(TransferLaunchEvent(sessions: sessions)),
                  let launchID = launcher.start(app, String(decoding: json, as: UTF8.self)) else { continue }
            slots -= 1
            let ids = waiting.filter { $0.app == app && $0.info.state.isFinished && $0.launchedFor == nil }.map(\.id)
            try? store.markTransfersLaunched(ids, launchID: launchID)
            logger.info("launching for background transfers", metadata: ["bundle.id": "\(app)", "launch.id": "\(launchID)", "sessions": "\(sessions.joined(separator: ","))"])
        }
    }

    // MARK: Reports

    /// A transfer and where it stands, for `transfers` and `why`.
    func report(_ transfer: StoredTransfer) -> TransferReport {
        let current = queue.sync { live[transfer.id] } ?? transfer
        return TransferReport(current)
    }

    func report(id: String) -> TransferReport? {
        guard let stored = try? store.transfer(id: id) else { return nil }
        return report(stored)
    }
}

/// A transfer as `bgtask transfers` lists it and `bgtask why TRANSFER_ID` explains it.
public struct TransferReport: Codable, Sendable, Equatable {
    public var id: String
    public var app: String
    public var bundle: String
    public var session: String
    public var taskIdentifier: Int
    public var taskDescription: String?
    public var kind: TransferKind
    public var url: String
    public var state: TransferState
    public var heldBy: String?
    public var bytesReceived: Int64
    public var bytesExpectedToReceive: Int64
    public var bytesSent: Int64
    public var bytesExpectedToSend: Int64
    public var status: Int?
    public var error: TransferError?
    public var file: String?
    public var createdAt: Date
    public var finishedAt: Date?
    public var attempts: Int
    public var resumed: Bool
    public var discretionary: Bool
    public var sendsLaunchEvents: Bool
    public var launchedFor: String?
    public var deliveredInLaunch: String?

    enum CodingKeys: String, CodingKey {
        case id, app, bundle, session, kind, url, state, status, error, file, attempts, resumed, discretionary
        case taskIdentifier = "task_identifier", taskDescription = "task_description", heldBy = "held_by"
        case bytesReceived = "bytes_received", bytesExpectedToReceive = "bytes_expected_to_receive"
        case bytesSent = "bytes_sent", bytesExpectedToSend = "bytes_expected_to_send"
        case createdAt = "created_at", finishedAt = "finished_at", sendsLaunchEvents = "sends_launch_events"
        case launchedFor = "launched_for", deliveredInLaunch = "delivered_in_launch"
    }

    init(_ transfer: StoredTransfer) {
        let info = transfer.info
        id = info.id
        app = info.app
        bundle = transfer.bundle
        session = info.session
        taskIdentifier = info.taskIdentifier
        taskDescription = info.taskDescription
        kind = info.kind
        url = info.url
        state = info.state
        heldBy = info.heldBy
        bytesReceived = info.bytesReceived
        bytesExpectedToReceive = info.bytesExpectedToReceive
        bytesSent = info.bytesSent
        bytesExpectedToSend = info.bytesExpectedToSend
        status = info.response?.status
        error = info.error
        file = info.file
        createdAt = Date(timeIntervalSince1970: info.createdAt)
        finishedAt = info.finishedAt.map(Date.init(timeIntervalSince1970:))
        attempts = info.attempts
        resumed = info.resumed
        discretionary = transfer.request.discretionary
        sendsLaunchEvents = transfer.request.sendsLaunchEvents
        launchedFor = transfer.launchedFor
        deliveredInLaunch = transfer.deliveredInLaunch
    }

    /// One line for people.
    public var text: String {
        var line = "transfer \(id) \(app) \(session)#\(taskIdentifier) \(kind.rawValue): \(state.rawValue)"
        if kind == .upload { line += ", sent \(bytesSent)/\(bytesExpectedToSend)" }
        line += ", received \(bytesReceived)/\(bytesExpectedToReceive < 0 ? "?" : String(bytesExpectedToReceive))"
        if let status { line += ", HTTP \(status)" }
        if let heldBy { line += ": held: \(heldBy)" }
        if let error { line += ": error \(error.code): \(error.message)" }
        return line
    }

    /// Several lines for `why`.
    public var explanation: String {
        var lines = [text, "  \(url)"]
        lines.append("  attempts: \(attempts)" + (resumed ? ", resumed from a partial download" : ""))
        if discretionary { lines.append("  discretionary: runs only on external power with a network") }
        if let file { lines.append("  file: \(file)") }
        if let launchedFor { lines.append("  its end was announced to launch \(launchedFor)") }
        if let deliveredInLaunch { lines.append("  delivered in launch \(deliveredInLaunch)") }
        else if state.isFinished { lines.append(sendsLaunchEvents ? "  waiting for the app to be told (a background-transfer launch, or its next launch that makes the session)"
                                                                   : "  waiting for the app's next launch that makes the session (sessionSendsLaunchEvents is off)") }
        return lines.joined(separator: "\n")
    }
}

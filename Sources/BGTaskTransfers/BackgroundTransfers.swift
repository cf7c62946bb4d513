import BGTaskControl
import BGTaskLaunch
import BGTaskStore
import BGTaskModel
import BGTaskSystem
import BGTaskWire
import Dispatch
import Foundation
import Glibc
import Logging

/// The launch a transfer call came from: who asks (the bundle, and the app that owns its
/// transfers) and how to reach it with events.
package struct TransferCaller: Sendable {
    /// The owner of the transfers: the app (an extension's transfers are its containing app's).
    package var app: String
    /// The bundle whose launch calls (its container and app groups hold upload bodies).
    package var bundle: PluginBundle
    package var launchID: String
    /// Sends a `TransferEvent`'s JSON to the launch (through its supervising thread). Nil: the
    /// launch cannot receive events.
    package var send: (@Sendable (String) -> Void)?

    /// The memberwise initializer, for the modules above this one.
    package init(app: String, bundle: PluginBundle, launchID: String, send: (@Sendable (String) -> Void)? = nil) {
        self.app = app
        self.bundle = bundle
        self.launchID = launchID
        self.send = send
    }
}

/// What a scheduling pass lets the part do about launches, and does for it (on the host queue).
package struct TransferLauncher {
    /// The launches running now (sessions attached to others are detached).
    package var runningLaunches: Set<String>
    /// Whether a launch of the app runs (its events wait until it attaches the session).
    package var isAppRunning: (String) -> Bool
    /// Launch slots free now.
    package var freeSlots: Int
    /// Starts a `background-transfer` launch of the app with this eventJSON: its id, or nil when
    /// the app is not installed.
    package var start: (_ app: String, _ eventJSON: String) -> String?

    /// The memberwise initializer, for the modules above this one.
    package init(runningLaunches: Set<String>, isAppRunning: @escaping (String) -> Bool, freeSlots: Int, start: @escaping (_ app: String, _ eventJSON: String) -> String?) {
        self.runningLaunches = runningLaunches
        self.isAppRunning = isAppRunning
        self.freeSlots = freeSlots
        self.start = start
    }
}

/// Background URL sessions' transfers, carried by the host (`nsurlsessiond`'s part): kept in the
/// store, held while their conditions do not hold (`heldBy`), run by the `TransferEngine` with
/// retries and resumes, their events routed to the launch attached to their session, and the
/// app launched (`background-transfer`) when they end and it is not running.
///
/// Its state is confined to its own serial queue: engine callbacks and launches' calls hop
/// onto it. It never waits for the host queue; the host queue may wait for it (`evaluate`).
package final class BackgroundTransfers: @unchecked Sendable {
    package struct Environment: Sendable {
        package var store: PendingRequestStore
        package var clock: HostClock
        package var stateDirectory: URL
        /// Apps' own uids (a root host confining launches): a delivered file is given to the app.
        package var identities: AppIdentities?
        package var conditions: @Sendable () -> DeviceConditions
        package var logger: Logger
        /// Retries after a failed attempt: the first delay, doubling, capped.
        package var firstRetryDelay: TimeInterval = 1
        package var maximumRetryDelay: TimeInterval = 60
        /// Running transfers' bytes are written to the store at most this often.
        package var progressSaveInterval: TimeInterval = 2
        /// What transfers may cost the host, per app and together (the disk reserve is the
        /// host's `--disk-reserve`).
        package var bounds = TransferBounds()

        package init(store: PendingRequestStore, clock: HostClock, stateDirectory: URL, identities: AppIdentities?,
                     conditions: @escaping @Sendable () -> DeviceConditions, logger: Logger,
                     firstRetryDelay: TimeInterval = 1, maximumRetryDelay: TimeInterval = 60,
                     progressSaveInterval: TimeInterval = 2, bounds: TransferBounds = TransferBounds()) {
            self.store = store
            self.clock = clock
            self.stateDirectory = stateDirectory
            self.identities = identities
            self.conditions = conditions
            self.logger = logger
            self.firstRetryDelay = firstRetryDelay
            self.maximumRetryDelay = maximumRetryDelay
            self.progressSaveInterval = progressSaveInterval
            self.bounds = bounds
        }
    }

    /// Something a scheduling pass should look at (a transfer ended, a hold lifts): called on the
    /// part's queue; must not block.
    package var onChange: @Sendable () -> Void = {}
    /// `store.transferWrites` when the last look for finished transfers found none to launch
    /// for (on the host queue).
    package var nothingDueAt: UInt64?

    package let environment: Environment
    package let queue = DispatchQueue(label: "bgtask.transfers")
    package let copyQueue = DispatchQueue(label: "bgtask.transfers.copy")
    package var engine: TransferEngine?
    package var stopping = false

    /// Transfers that may still move bytes (waiting, running), by id.
    package var live: [String: StoredTransfer] = [:]
    package struct Attempt {
        /// The app it runs for (kept here: a cancelled transfer leaves `live` before its
        /// attempt's end arrives, and the attempt still holds its connection until then).
        package var app: String
        package var handle: TransferAttemptHandle
        package var generation: Int
        package var stop: StopReason?
        package var lastSaved = Date()
    }
    package enum StopReason { case cancel, resourceTimeout, pause, shutdown }
    package var attempts: [String: Attempt] = [:]
    package var generation = 0
    /// After a failed attempt: when the next may start, and why it waits.
    package var retries: [String: (at: Date, why: String, failures: Int)] = [:]
    /// Upload bodies being copied into the spool.
    package var copying: Set<String> = []
    package var timers: [String: DispatchWorkItem] = [:]

    package struct SessionKey: Hashable { var app: String; var session: String }
    package var attached: [SessionKey: (launchID: String, send: @Sendable (String) -> Void)] = [:]
    /// A look at the queued transfers is due (the host's descriptors held them back).
    package var queuedLookArmed = false
    /// What each app's transfers hold in the spool directory.
    package let staging: StagingLedger

    package init(_ environment: Environment) {
        self.environment = environment
        staging = StagingLedger(bounds: environment.bounds,
                                directory: environment.stateDirectory.appendingPathComponent("transfers").path)
    }

    /// Bytes and inodes `app`'s transfers hold in the host's staging now (partial downloads,
    /// copied upload bodies; a delivered download is in the app's container, and no longer
    /// here): what per-app disk quotas add to the container's use. Any thread.
    package func stagingUsage(app: String) -> (bytes: UInt64, inodes: Int) {
        staging.usage(app: app)
    }

    package var partName: String { "background transfers" }

    package var store: PendingRequestStore { environment.store }
    package var logger: Logger { environment.logger }
    package var spoolDirectory: String { environment.stateDirectory.appendingPathComponent("transfers").path }

    /// Makes the spool directory, starts the engine, and takes up the transfers a previous host
    /// left unfinished (a running one resumes where its spool file ends).
    package func start() throws(BGTaskError) {
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
    package func stop() {
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
    package func answer(_ call: TransferCall, from caller: TransferCaller) -> TransferCallAnswer {
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

    package func create(_ request: TransferRequest, from caller: TransferCaller) -> TransferCallAnswer {
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
    package func allowedRoots(_ bundle: PluginBundle) -> [String] {
        let state = environment.stateDirectory.path
        let granted = bundle.appGroups.isEmpty ? [] : ((try? AppGroupOwners(stateDirectory: environment.stateDirectory)
            .decide(app: bundle.containingApp ?? bundle.identifier, groups: bundle.appGroups, claim: false))?.granted ?? [])
        return [state + "/containers/" + bundle.identifier] + granted.map { AppContainer.groupDirectory(root: state + "/groups", identifier: $0) }
    }

    /// Copies an upload's body into the spool (off the part's queue), so that the upload survives
    /// the app deleting or changing its file; then the transfer may start.
    package func copyBody(id: String, app: String, from fd: Int32, size: Int64, to spool: String) {
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

    package func owned(_ id: String, by caller: TransferCaller) -> StoredTransfer? {
        if let transfer = live[id] { return transfer.app == caller.app ? transfer : nil }
        guard let transfer = try? store.transfer(id: id), transfer.app == caller.app else { return nil }
        return transfer
    }

    package func cancel(id: String, caller: TransferCaller) -> TransferCallAnswer {
        guard let transfer = owned(id, by: caller) else { return .failure(TransferCallAnswer.invalidArgument, "id: no transfer \(id) of \(caller.app)") }
        guard !transfer.info.state.isFinished else { return TransferCallAnswer(reply: TransferReply(transfer: transfer.info)) }
        attempts[id]?.stop = .cancel
        attempts[id]?.handle.stop()
        // The app asked: it is told by its own task, not by an event.
        let info = finish(id, state: .cancelled, error: TransferError(code: TransferError.cancelledCode, message: "cancelled by the app"), announce: false)
        return TransferCallAnswer(reply: TransferReply(transfer: info ?? transfer.info))
    }

    package func attach(session: String, caller: TransferCaller) -> TransferCallAnswer {
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
    package static func fit(_ transfers: inout [TransferInfo], logger: Logger) {
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

    package func delivered(id: String, caller: TransferCaller) -> TransferCallAnswer {
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
    package func hold(_ transfer: StoredTransfer, _ conditions: DeviceConditions, now: Date) -> String? {
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

    package func considerAll() {
        let conditions = environment.conditions()
        for id in live.keys.sorted() { consider(id, conditions) }
    }

    /// Starts, holds or pauses one transfer as its conditions say. On the queue.
    package func consider(_ id: String, _ conditions: DeviceConditions? = nil) {
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
    package func startQueued() {
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
    package func armQueuedLook() {
        guard !queuedLookArmed else { return }
        queuedLookArmed = true
        queue.asyncAfter(deadline: .now() + 1) { [weak self] in
            guard let self else { return }
            self.queuedLookArmed = false
            self.startQueued()
        }
    }

}

import BGTaskControl
import BGTaskModel
import BGTaskSystem
import BGTaskWire
import Dispatch
import Foundation
import Glibc
import Logging

extension BackgroundTransfers {
    // MARK: Attempts' events

    package func handle(_ event: TransferAttemptEvent, of id: String, generation mine: Int) {
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

    package func finished(_ id: String, _ result: TransferAttemptResult, stop: StopReason?) {
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

    package static func resourceTimeoutError(_ transfer: StoredTransfer, after error: TransferError? = nil) -> TransferError {
        TransferError(code: TransferError.timedOutCode, message: "the resource timeout (\(transfer.request.resourceTimeout) s from creation) passed"
            + (error.map { "; the last attempt: \($0.message)" } ?? ""))
    }

    /// Ends a transfer: the state written (durably) before anyone is told, the spool removed,
    /// the session's launch told (`announce`), and the host asked to look at launches. On the queue.
    @discardableResult
    package func finish(_ id: String, state: TransferState, error: TransferError?, announce: Bool = true) -> TransferInfo? {
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
    package func announce(_ info: TransferInfo, event: String) {
        guard let route = attached[SessionKey(app: info.app, session: info.session)],
              let json = try? JSONEncoder.transferJSON.encode(TransferEvent(event: event, transfer: info)) else { return }
        route.send(String(decoding: json, as: UTF8.self))
    }

    package func armResourceTimeout(_ transfer: StoredTransfer) {
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
    package func evaluate(_ conditions: DeviceConditions, launcher: TransferLauncher) -> (wakeAt: Date?, watchConditions: Bool) {
        let (wakeAt, watch) = queue.sync { () -> (Date?, Bool) in
            attached = attached.filter { launcher.runningLaunches.contains($0.value.launchID) }
            for id in live.keys.sorted() { consider(id, conditions) }
            var wakeAt: Date?
            var watch = false
            for transfer in live.values {
                if let notBefore = transfer.notBefore, environment.clock.now.timeIntervalSince1970 < notBefore {
                    let date = Date(timeIntervalSince1970: notBefore - environment.clock.appOffset)
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
    package func launchForEvents(_ launcher: TransferLauncher) {
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
    package func report(_ transfer: StoredTransfer) -> TransferReport {
        let current = queue.sync { live[transfer.id] } ?? transfer
        return TransferReport(current)
    }

    package func report(id: String) -> TransferReport? {
        guard let stored = try? store.transfer(id: id) else { return nil }
        return report(stored)
    }
}

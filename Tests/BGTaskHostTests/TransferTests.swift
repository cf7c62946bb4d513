import Crypto
@testable import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskLaunch
import BGTaskTransfers
import BGTaskModel
import BGTaskSystem
import Foundation
import Glibc
import Logging
import Testing

/// Background URL sessions, the host's side: the `BackgroundTransfers` part with a real store
/// (SQLite in a scratch directory) and a real HTTP server of the suite's own
/// (TransferTestServer), driven as launches drive it (`TransferCall`s), and a real host process
/// killed mid-download.
@Suite(.serialized) struct TransferTests {
    static let app = "com.example.downloader"

    /// One part over one store, with the device conditions and the launch's events in hand.
    final class Harness: @unchecked Sendable {
        let scratch: Scratch
        let server = TransferTestServer()
        let conditions = LockedValue(DeviceConditions(externalPower: true, network: true))
        let events = LockedValue<[TransferEvent]>([])
        let launched = LockedValue<[(app: String, eventJSON: String)]>([])
        private(set) var store: PendingRequestStore
        private(set) var part: BackgroundTransfers
        let bundle = PluginBundle(
            kind: .app, url: URL(fileURLWithPath: "/nonexistent/Downloader.app"), identifier: TransferTests.app, executableName: "libDownloader.so",
            permittedIdentifiers: [], backgroundModes: [], mappedHandlers: [], entitlements: [:], extensionPoint: nil, extensions: [], invalidExtensions: [])

        let bounds: TransferBounds
        /// The state directory is a tmpfs of this many MiB (mounted by `init`, unmounted by `finish`).
        let tmpfsMiB: Int?

        /// `tmpfsMiB`: the state directory on a tmpfs of that size, private (no propagation):
        /// root only (`SmallFilesystem.mount`).
        init(bounds: TransferBounds = TransferBounds(), tmpfsMiB: Int? = nil) throws {
            scratch = try Scratch()
            self.bounds = bounds
            self.tmpfsMiB = tmpfsMiB
            if let tmpfsMiB { try SmallFilesystem.mount(scratch.state, mebibytes: tmpfsMiB) }
            try FileManager.default.createDirectory(at: scratch.state.appendingPathComponent("containers/\(TransferTests.app)/tmp"), withIntermediateDirectories: true)
            try server.start()
            (store, part) = try Self.makePart(scratch.state, conditions: conditions, bounds: bounds)
        }

        static func makePart(_ state: URL, conditions: LockedValue<DeviceConditions>, bounds: TransferBounds = TransferBounds()) throws -> (PendingRequestStore, BackgroundTransfers) {
            let store = try PendingRequestStore(directory: state)
            var environment = BackgroundTransfers.Environment(
                store: store, clock: try HostClock(mode: .real, store: store), stateDirectory: state, identities: nil,
                conditions: { conditions.withLock { $0 } }, logger: Logger(label: "transfers-test"))
            environment.firstRetryDelay = 0.2
            environment.maximumRetryDelay = 0.5
            environment.bounds = bounds
            let part = BackgroundTransfers(environment)
            try part.start()
            return (store, part)
        }

        /// A new part (and store) over the same state directory: a host restarted.
        func restart() throws {
            part.stop()
            (store, part) = try Self.makePart(scratch.state, conditions: conditions, bounds: bounds)
        }

        var container: URL { scratch.state.appendingPathComponent("containers/\(TransferTests.app)") }

        func caller(launchID: String = "launch-1", receivesEvents: Bool = true) -> TransferCaller {
            let events = self.events
            var send: (@Sendable (String) -> Void)?
            if receivesEvents {
                send = { json in
                    if let event = try? JSONDecoder().decode(TransferEvent.self, from: Data(json.utf8)) { events.withLock { $0.append(event) } }
                }
            }
            return TransferCaller(app: TransferTests.app, bundle: bundle, launchID: launchID, send: send)
        }

        func call(_ call: TransferCall, launchID: String = "launch-1", receivesEvents: Bool = true) -> TransferCallAnswer {
            part.answer(call, from: caller(launchID: launchID, receivesEvents: receivesEvents))
        }

        func create(_ request: TransferRequest, receivesEvents: Bool = true) throws -> TransferInfo {
            let answer = call(.create(request), receivesEvents: receivesEvents)
            try #require(answer.status == 0, "create: \(answer.message ?? "")")
            return try #require(answer.reply?.transfer)
        }

        func stored(_ id: String) throws -> StoredTransfer { try #require(try store.transfer(id: id)) }

        /// Waits (bounded) until `condition` holds of the stored transfer.
        @discardableResult
        func wait(_ id: String, timeout: TimeInterval = 30, until condition: (StoredTransfer) -> Bool) throws -> StoredTransfer {
            let deadline = Date().addingTimeInterval(timeout)
            while true {
                let transfer = try stored(id)
                if condition(transfer) { return transfer }
                guard Date() < deadline else { throw HostTestError("transfer \(id) did not get there in \(timeout) s: \(TransferReport(transfer).text)") }
                usleep(20_000)
            }
        }

        func evaluate(running: Set<String> = []) -> (wakeAt: Date?, watchConditions: Bool) {
            let launched = self.launched
            return part.evaluate(conditions.withLock { $0 }, launcher: TransferLauncher(
                runningLaunches: running, isAppRunning: { _ in false }, freeSlots: 2,
                start: { app, json in launched.withLock { $0.append((app, json)) }; return "bt-launch-1" }))
        }

        func finish() {
            part.stop()
            server.stop()
            if tmpfsMiB != nil { SmallFilesystem.unmount(scratch.state) }
            scratch.remove()
        }

        func download(_ size: Int, session: String = "s", sendsLaunchEvents: Bool = true, discretionary: Bool = false,
                      resourceTimeout: Double = 600) -> TransferRequest {
            TransferRequest(session: session, taskIdentifier: 1, kind: .download, url: server.url("/bytes/\(size)"),
                            discretionary: discretionary, sendsLaunchEvents: sendsLaunchEvents, requestTimeout: 10, resourceTimeout: resourceTimeout)
        }
    }

    @Test func aDownloadLandsInTheAppsContainerWithItsBytes() throws {
        let h = try Harness()
        defer { h.finish() }
        let size = 3 * 1024 * 1024 + 17
        let created = try h.create(h.download(size))
        #expect(created.kind == .download)
        let done = try h.wait(created.id) { $0.info.state == .completed }
        let file = try #require(done.info.file)
        #expect(file.hasPrefix(h.container.path + "/Library/Caches/com.apple.nsurlsessiond/Downloads/\(Self.app)/CFNetworkDownload_"))
        #expect(file.hasSuffix(".tmp"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: file)) == TransferTestServer.bytes(size))
        var info = stat()
        #expect(stat(file, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(done.info.bytesReceived == Int64(size) && done.info.bytesExpectedToReceive == Int64(size))
        #expect(done.info.response?.status == 200)
        #expect(done.spool == nil && access(h.part.spoolDirectory + "/\(created.id).part", F_OK) != 0)
        // The launch that created it was told: progress, then finished with the file.
        let events = h.events.withLock { $0 }
        #expect(events.last?.event == "finished" && events.last?.transfer.file == file)
        // Delivered: the record stays, the file the app left there goes.
        let delivered = h.call(.delivered(id: created.id))
        #expect(delivered.status == 0 && delivered.delivered == created.id)
        #expect(access(file, F_OK) != 0)
        #expect(try h.stored(created.id).info.state == .delivered && h.stored(created.id).deliveredInLaunch == "launch-1")
    }

    /// The spool's writes, slower than the network (as a slow disk): the body's parts gather
    /// while a write is out and go in the next one; past the buffer's limit the connection waits
    /// (backpressure); the last parts are written after the response has ended, and every byte
    /// lands in order. (The first version of the batched writes wrote those last ones through a
    /// descriptor the attempt's end had already given up: EBADF, retried forever.)
    @Test func slowWritesGatherTheBodyWithinItsBufferAndLoseNothing() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let server = TransferTestServer()
        try server.start()
        defer { server.stop() }
        let engine = TransferEngine(logger: Logger(label: "test"))
        defer { engine.shutdown() }
        engine.writeDelayForTests = .milliseconds(100)
        engine.bufferLimitForTests = 32 * 1024
        let size = 1024 * 1024 + 4097
        let spool = scratch.url.appendingPathComponent("spool.part").path
        let finished = DispatchSemaphore(value: 0)
        let result = LockedValue<TransferAttemptResult?>(nil)
        _ = engine.start(TransferAttempt(id: "t", kind: .download, url: server.url("/bytes/\(size)"), method: "GET", headers: [],
                                         requestTimeout: 30, spool: spool)) { event in
            if case let .finished(outcome) = event {
                result.withLock { $0 = outcome }
                finished.signal()
            }
        }
        #expect(finished.wait(timeout: .now() + 60) == .success)
        #expect(result.withLock { $0 } == .completed(received: Int64(size), body: nil))
        #expect(try Data(contentsOf: URL(fileURLWithPath: spool)) == TransferTestServer.bytes(size))
        let statistics = engine.writeStatistics.withLock { $0 }
        #expect(statistics.waitsForRoom > 0, "the connection waited for the writes: \(statistics)")
        #expect(statistics.mostBuffered < 32 * 1024 + 64 * 1024, "at most a part over the limit waited: \(statistics)")
    }

    @Test func anInterruptedDownloadResumesWithARangeRequestAndEndsByteIdentical() throws {
        let h = try Harness()
        defer { h.finish() }
        let size = 4 * 1024 * 1024
        h.server.throttle = 2 * 1024 * 1024
        let created = try h.create(h.download(size))
        let spool = h.part.spoolDirectory + "/\(created.id).part"
        try h.wait(created.id) { $0.validator != nil }
        let deadline = Date().addingTimeInterval(20)
        var partial = stat()
        while Date() < deadline, stat(spool, &partial) != 0 || partial.st_size < 512 * 1024 { usleep(20_000) }
        #expect(partial.st_size >= 512 * 1024 && partial.st_size < Int64(size))
        // The host goes away mid-transfer; another takes it up from the store.
        h.server.throttle = nil
        try h.restart()
        let done = try h.wait(created.id) { $0.info.state == .completed }
        let resume = try #require(h.server.requests.last)
        let range = try #require(resume.header("Range"))
        #expect(range.hasPrefix("bytes=") && (Int64(range.dropFirst(6).dropLast()) ?? 0) > 0)
        #expect(resume.header("If-Range") == h.server.etag)
        #expect(done.info.resumed && done.info.attempts == 2)
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(done.info.file))) == TransferTestServer.bytes(size))
    }

    @Test func aChangedFileAnswersTheResumeWith200AndTheDownloadStartsOver() throws {
        let h = try Harness()
        defer { h.finish() }
        let size = 2 * 1024 * 1024
        h.server.throttle = 1024 * 1024
        let created = try h.create(h.download(size))
        let spool = h.part.spoolDirectory + "/\(created.id).part"
        try h.wait(created.id) { $0.validator != nil }
        var partial = stat()
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline, stat(spool, &partial) != 0 || partial.st_size < 256 * 1024 { usleep(20_000) }
        h.server.throttle = nil
        h.server.etag = "\"v2\""
        try h.restart()
        let done = try h.wait(created.id) { $0.info.state == .completed }
        let resume = try #require(h.server.requests.last)
        #expect(resume.header("If-Range") == "\"v1\"")
        #expect(!done.info.resumed && done.info.response?.status == 200)
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(done.info.file))) == TransferTestServer.bytes(size))
    }

    @Test func anUploadSendsTheContainersFileEvenOnceTheAppDeletedIt() throws {
        let h = try Harness()
        defer { h.finish() }
        let body = TransferTestServer.bytes(300 * 1024 + 5)
        let file = h.container.appendingPathComponent("tmp/upload.bin")
        try body.write(to: file)
        let request = TransferRequest(session: "s", taskIdentifier: 2, kind: .upload, url: h.server.url("/upload"), method: "POST",
                                      headers: [TransferHeader(name: "Content-Type", value: "application/octet-stream")], bodyFile: file.path)
        let created = try h.create(request)
        unlink(file.path)
        #expect(created.bytesExpectedToSend == Int64(body.count))
        let done = try h.wait(created.id) { $0.info.state.isFinished }
        #expect(done.info.state == .completed && done.info.response?.status == 200)
        let answer = try JSONDecoder().decode([String: AnyCodableValue].self, from: try #require(done.info.body))
        #expect(answer["length"] == .int(body.count))
        #expect(answer["sha256"] == .string(SHA256.hex(body)))
        #expect(done.info.bytesSent == Int64(body.count))
        #expect(h.server.requests.last?.header("Content-Length") == "\(body.count)")
    }

    @Test func bodyFilesOutsideTheContainerOrThroughLinksAreRefusedByName() throws {
        let h = try Harness()
        defer { h.finish() }
        let tmp = h.container.appendingPathComponent("tmp")
        symlink("/etc/passwd", tmp.appendingPathComponent("passwd-link").path)
        symlink("/etc", tmp.appendingPathComponent("etc-link").path)
        for (path, words) in [("/etc/shadow", "outside the app's container"),
                              (tmp.appendingPathComponent("passwd-link").path, "symbolic link"),
                              (tmp.appendingPathComponent("etc-link/passwd").path, "symbolic link"),
                              (tmp.path + "/../../../../../etc/passwd", "'..'"),
                              (tmp.appendingPathComponent("missing").path, "cannot be opened")] {
            let request = TransferRequest(session: "s", taskIdentifier: 3, kind: .upload, url: h.server.url("/upload"), method: "PUT", bodyFile: path)
            let answer = h.call(.create(request))
            #expect(answer.status == TransferCallAnswer.invalidArgument, "\(path)")
            #expect(answer.message?.contains(path) == true && answer.message?.contains(words) == true, "\(answer.message ?? "")")
        }
        #expect(try h.store.transfers(app: Self.app, limit: 10).isEmpty)
        #expect(h.server.requests.isEmpty)
    }

    @Test func aServerErrorIsACompletedTransferWithItsStatus() throws {
        let h = try Harness()
        defer { h.finish() }
        let request = TransferRequest(session: "s", taskIdentifier: 4, kind: .data, url: h.server.url("/status/500"))
        let created = try h.create(request)
        let done = try h.wait(created.id) { $0.info.state.isFinished }
        #expect(done.info.state == .completed && done.info.response?.status == 500 && done.info.error == nil)
        #expect(done.info.body == Data("status 500\n".utf8))
        #expect(done.info.attempts == 1)
    }

    @Test func aDiscretionaryTransferWaitsForExternalPower() throws {
        let h = try Harness()
        defer { h.finish() }
        h.conditions.withLock { $0.externalPower = false }
        let created = try h.create(h.download(64 * 1024, discretionary: true))
        usleep(300_000)
        let held = try h.stored(created.id)
        #expect(held.info.state == .waiting)
        #expect(held.info.heldBy?.hasPrefix("discretionary") == true && held.info.heldBy?.contains("battery") == true)
        #expect(h.server.requests.isEmpty)
        #expect(h.evaluate().watchConditions, "a transfer held on power: the conditions are watched")
        #expect(h.part.report(id: created.id)?.explanation.contains("discretionary") == true)
        // No network holds it too, whatever the power.
        h.conditions.withLock { $0 = DeviceConditions(externalPower: true, network: false) }
        _ = h.evaluate()
        #expect(try h.stored(created.id).info.heldBy?.hasPrefix("no network") == true)
        h.conditions.withLock { $0.network = true }
        _ = h.evaluate()
        let done = try h.wait(created.id) { $0.info.state == .completed }
        #expect(done.info.heldBy == nil)
    }

    @Test func aCancelledTransferEndsCancelled() throws {
        let h = try Harness()
        defer { h.finish() }
        h.server.throttle = 256 * 1024
        let created = try h.create(h.download(8 * 1024 * 1024))
        try h.wait(created.id) { $0.info.state == .running && $0.validator != nil }
        let answer = h.call(.cancel(id: created.id))
        #expect(answer.status == 0 && answer.reply?.transfer?.state == .cancelled)
        #expect(answer.reply?.transfer?.error?.code == TransferError.cancelledCode)
        usleep(300_000)
        let stored = try h.stored(created.id)
        #expect(stored.info.state == .cancelled && stored.spool == nil)
        #expect(access(h.part.spoolDirectory + "/\(created.id).part", F_OK) != 0)
        // Another app cannot cancel it.
        #expect(h.part.answer(.cancel(id: created.id), from: TransferCaller(app: "com.example.other", bundle: h.bundle, launchID: "x")).status == TransferCallAnswer.invalidArgument)
    }

    @Test func theResourceTimeoutFailsTheTransferWithTimedOut() throws {
        let h = try Harness()
        defer { h.finish() }
        var hanging = TransferRequest(session: "s", taskIdentifier: 5, kind: .data, url: h.server.url("/hang"))
        hanging.resourceTimeout = 1
        let created = try h.create(hanging)
        let done = try h.wait(created.id, timeout: 10) { $0.info.state.isFinished }
        #expect(done.info.state == .failed && done.info.error?.code == TransferError.timedOutCode)
        // A refused connection is retried with backoff until the resource timeout.
        let closed = try unusedLoopbackPort()
        var refused = TransferRequest(session: "s", taskIdentifier: 6, kind: .download, url: "http://127.0.0.1:\(closed)/bytes/10")
        refused.resourceTimeout = 2
        let second = try h.create(refused)
        let waiting = try h.wait(second.id, timeout: 5) { $0.info.heldBy?.hasPrefix("retrying") == true }
        #expect(waiting.info.state == .waiting)
        let failed = try h.wait(second.id, timeout: 10) { $0.info.state.isFinished }
        #expect(failed.info.state == .failed && failed.info.error?.code == TransferError.timedOutCode)
        #expect(failed.info.attempts >= 2)
        #expect(failed.info.error?.message.contains("cannot connect") == true)
    }

    @Test func aFinishedTransferLaunchesTheAppAndAttachHandsItOver() throws {
        let h = try Harness()
        defer { h.finish() }
        let created = try h.create(h.download(10_000, session: "com.example.bg"), receivesEvents: false)
        try h.wait(created.id) { $0.info.state == .completed }
        _ = h.evaluate()
        let launched = h.launched.withLock { $0 }
        #expect(launched.count == 1 && launched.first?.app == Self.app)
        let event = try JSONDecoder().decode(TransferLaunchEvent.self, from: Data(try #require(launched.first?.eventJSON).utf8))
        #expect(event.sessions == ["com.example.bg"])
        #expect(try h.stored(created.id).launchedFor == "bt-launch-1")
        // Once per transfer.
        _ = h.evaluate()
        #expect(h.launched.withLock { $0.count } == 1)
        // The launched app makes its session: the finished transfer comes back.
        let attach = h.call(.attach(session: "com.example.bg"), launchID: "bt-launch-1")
        #expect(attach.reply?.transfers?.map(\.id) == [created.id])
        #expect(attach.reply?.transfers?.first?.file != nil)
        // A session that does not send launch events waits for the app.
        let quiet = try h.create(h.download(10_000, session: "quiet", sendsLaunchEvents: false), receivesEvents: false)
        try h.wait(quiet.id) { $0.info.state == .completed }
        _ = h.evaluate()
        #expect(h.launched.withLock { $0.count } == 1)
    }

    @Test func invalidCallsAreRefusedWithTheFieldNamed() throws {
        let h = try Harness()
        defer { h.finish() }
        let answer = h.call(.create(TransferRequest(session: "s", taskIdentifier: 1, kind: .download, url: "ftp://example.com/x")))
        #expect(answer.status == TransferCallAnswer.invalidArgument && answer.message?.contains("url") == true)
        // As a launch's channel carries them: JSON, whatever a hostile child writes.
        for (json, says) in [(#"{"op":"frobnicate"}"#, "op: 'frobnicate' is not one of create, cancel"),
                             (#"{"op":"cancel"}"#, "cancel: no transfer id"), (#"{"op":"attach","session":""}"#, "attach: no session identifier"),
                             (#"{"op":"create","request":{}}"#, "not a TransferCall's JSON"), ("[]", "not a TransferCall's JSON")] {
            guard case .failure(let problem) = TransferCall.decode(Data(json.utf8)) else {
                Issue.record("\(json) was accepted")
                continue
            }
            #expect(problem.message.contains(says), "\(json): \(problem.message)")
        }
        #expect(TransferCall.decode(Data(#"{"op":"events-handled","session":"s"}"#.utf8)) == .success(.eventsHandled(session: "s")))
        #expect(h.call(.delivered(id: "no-such-transfer")).status == TransferCallAnswer.invalidArgument)
    }

    /// A real host, killed (SIGKILL) in the middle of a download it took up from its store,
    /// resumes it with a Range request when it starts again; `bgtask transfers --json` and
    /// `bgtask why TRANSFER_ID` tell about it.
    @Test func aHostKilledMidDownloadResumesItAndTheCLIListsIt() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let server = TransferTestServer()
        try server.start()
        defer { server.stop() }
        let size = 4 * 1024 * 1024
        server.throttle = 1024 * 1024
        // The transfer a launch would have handed over, kept in the host's store before it starts.
        let id = UUID().uuidString
        do {
            try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
            let store = try PendingRequestStore(directory: scratch.state)
            let request = TransferRequest(session: "s", taskIdentifier: 1, kind: .download, url: server.url("/bytes/\(size)"), sendsLaunchEvents: false)
            var transfer = StoredTransfer(info: TransferInfo(id: id, app: Self.app, request: request, createdAt: Date().timeIntervalSince1970),
                                          request: request, bundle: Self.app)
            transfer.spool = scratch.state.appendingPathComponent("transfers/\(id).part").path
            #expect(try store.createTransfer(transfer, activeLimit: 10))
        }
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual"])
        try host.start()
        _ = try host.cli(["device", "--network", "on", "--power", "on"])
        let spool = scratch.state.appendingPathComponent("transfers/\(id).part").path
        var partial = stat()
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, stat(spool, &partial) != 0 || partial.st_size < 512 * 1024 { usleep(20_000) }
        #expect(partial.st_size >= 512 * 1024)
        let listed = try host.cli(["transfers", "--json"])
        #expect(listed.status == 0)
        let reports = try JSONDecoder.iso8601.decode([TransferReport].self, from: Data(listed.stdout.utf8))
        #expect(reports.map(\.id) == [id] && reports.first?.state == .running && reports.first?.app == Self.app)
        host.crash()
        server.throttle = nil
        try host.start()
        let finished = Date().addingTimeInterval(30)
        var report: TransferReport?
        while Date() < finished {
            report = try host.send(.transfers()).transfers?.first
            if report?.state.isFinished == true { break }
            usleep(50_000)
        }
        #expect(report?.state == .completed && report?.resumed == true)
        #expect(server.requests.last?.header("Range")?.hasPrefix("bytes=") == true)
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(report?.file))) == TransferTestServer.bytes(size))
        let why = try host.cli(["why", id])
        #expect(why.status == 0 && why.stdout.contains("completed") && why.stdout.contains("resumed"), "\(why.stdout) \(why.stderr)")
        let text = try host.cli(["transfers"])
        #expect(text.stdout.contains(id) && text.stdout.contains("HTTP 200"), "a resumed download is the whole resource's answer, 200: \(text.stdout)")
        host.stop()
    }
}

/// A JSON value of the upload endpoint's answer.
enum AnyCodableValue: Decodable, Equatable {
    case int(Int), string(String)
    init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let int = try? container.decode(Int.self) { self = .int(int) } else { self = .string(try container.decode(String.self)) }
    }
}

extension JSONDecoder {
    static var iso8601: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

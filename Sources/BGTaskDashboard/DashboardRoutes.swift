import BGTaskControl
import BGTaskModel
import Dispatch
import Foundation
import Hummingbird
import NIOCore

/// The dashboard's addresses (docs/dashboard.md lists them):
/// - `/`, `/dashboard.js`, `/dashboard.css`: the pages, embedded in the binary;
/// - `/api/overview`: the clock, the device, the apps, the running launches, the pending
///   requests each with why it has not run;
/// - `/api/history?app=&limit=`: records, newest first; `/api/launch/ID`: one record and
///   its log; `/api/pushes`, `/api/transfers`, `/api/notifications`;
/// - `/events`: server-sent events, `launch-began` and `launch-ended`;
/// - `/metrics`: Prometheus's text format;
/// - `POST /api/action` (when enabled): a control request (`{"verb": "simulate-launch", ...}`)
///   of the verbs `actionVerbs`, checked as on the control socket.
extension Dashboard {
    static let actionVerbs: Set<ControlVerb> = [.simulateLaunch, .simulateExpire, .push, .device, .clock, .cancel, .submit]
    /// The most of a launch's log a page is sent (its end when longer).
    static let logBytes = 1 << 20

    func routes(_ router: Router<DashboardContext>) {
        router.get("/") { _, _ in Self.asset(PackageResources.index_html, "text/html; charset=utf-8") }
        router.get("/dashboard.js") { _, _ in Self.asset(PackageResources.dashboard_js, "text/javascript; charset=utf-8") }
        router.get("/dashboard.css") { _, _ in Self.asset(PackageResources.dashboard_css, "text/css; charset=utf-8") }
        router.get("/api/overview") { [self] _, _ in
            let data = try await Self.blocking { try self.overview().json() }
            return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
        }
        router.get("/api/history") { [self] request, _ in
            let app = request.uri.queryParameters.get("app")
            let limit = min(max(request.uri.queryParameters.get("limit", as: Int.self) ?? 500, 1), 5000)
            // The stored texts, joined: no decoding and encoding again of each record.
            let texts = try await Self.blocking { [source] in try source.historyJSON(app: app, limit: limit) }
            var body = ByteBuffer()
            body.writeString("[")
            for (index, text) in texts.enumerated() {
                if index > 0 { body.writeString(",") }
                body.writeString(text)
            }
            body.writeString("]")
            return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"], body: .init(byteBuffer: body))
        }
        router.get("/api/launch/{id}") { [self] _, context in
            let id = context.parameters.get("id") ?? ""
            let source = self.source
            return try await json { () -> LaunchPage? in
                // A launch ID names files: letters, digits and dashes only.
                guard !id.isEmpty, id.count <= 64, id.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else { return nil }
                let logs = source.logsDirectory
                let samples = LaunchSamples.read("\(logs)/\(id).samples")
                // By its ID (the store's primary key), however old.
                if let text = try? source.recordJSON(launchID: id), let record = try? RunRecord.decode(Data(text.utf8)), record.launchID == id {
                    return LaunchPage(record: record, log: record.log.flatMap(Self.logTail), samples: samples)
                }
                // Still running: what it has written and sampled so far.
                guard let running = self.answer(.running).running?.first(where: { $0.launchID == id }) else { return nil }
                return LaunchPage(running: running, log: Self.logTail("\(logs)/\(id).log"), samples: samples)
            }
        }
        router.get("/api/pushes") { [self] _, _ in try await json { self.answer(.pushes(limit: 500)).pushes ?? [] } }
        router.get("/api/transfers") { [self] _, _ in try await json { self.answer(.transfers(limit: 500)).transfers ?? [] } }
        router.get("/api/notifications") { [self] _, _ in try await json { self.answer(.notifications(limit: 500)).notifications ?? [] } }
        router.get("/events") { [hub] _, context -> Response in
            guard let (stream, id) = hub.subscribe() else {
                // The server reads nothing while it streams, so a page that went away is found
                // only when a write to it fails (on loopback, the second after its close): full,
                // the watchers are sent two heartbeats, and a page that retries (as
                // EventSource does, after 2 s) takes a place that was held by a gone one.
                hub.heartbeat()
                hub.heartbeat()
                return DashboardAccess.refusal(.serviceUnavailable, "\(DashboardHub.maximumSubscribers) pages are watching already")
            }
            context.channel.closeFuture.whenComplete { _ in hub.unsubscribe(id) }
            return Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-store"], body: .init { writer in
                for await text in stream { try await writer.write(ByteBuffer(string: text)) }
                try await writer.finish(nil)
            })
        }
        router.get("/metrics") { [self] _, _ -> Response in
            let text = await Self.blocking { [self] in
                metrics.refresh(from: source)
                return metrics.text()
            }
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                             body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        router.post("/api/action") { [self] request, _ -> Response in
            let body = try await request.body.collect(upTo: 64 << 10)
            let command: ControlCommand
            do {
                command = try ControlCommand(wire: try JSONDecoder.control.decode(ControlRequest.self, from: Data(buffer: body)))
            } catch let failure as ControlFailure {
                return DashboardAccess.refusal(.badRequest, failure.message)
            } catch {
                return DashboardAccess.refusal(.badRequest, "not a control request: \(error)")
            }
            guard Self.actionVerbs.contains(command.verb) else {
                return DashboardAccess.refusal(.forbidden, "the dashboard does not \(command.verb.rawValue) (its actions: \(Self.actionVerbs.map(\.rawValue).sorted().joined(separator: ", ")))")
            }
            return try await json { self.answer(command) }
        }
    }

    /// What the overview page shows, read at once.
    struct Overview: Encodable {
        var now: Date
        var clock: ClockReport?
        var device: DeviceConditions?
        var apps: [AppSummary]
        var running: [RunningLaunchReport]
        var pending: [PendingEntry]
        var actions: Bool
    }

    struct PendingEntry: Encodable {
        var request: StoredRequest
        var why: WhyReport?
    }

    /// One launch: its record once it has ended, or what is known of it while it runs; its
    /// log (its end), and its memory and CPU over time.
    struct LaunchPage: Encodable {
        var record: RunRecord?
        var running: RunningLaunchReport?
        var log: String?
        var samples: [LaunchSamples.Point]

        init(record: RunRecord? = nil, running: RunningLaunchReport? = nil, log: String?, samples: [LaunchSamples.Point]) {
            (self.record, self.running, self.log, self.samples) = (record, running, log, samples)
        }
    }

    /// The most pending requests the overview asks why of (each is one question to the host).
    static let pendingWithWhy = 200

    func overview() -> Overview {
        let pending = answer(.pending()).pending ?? []
        return Overview(
            now: Date(), clock: answer(.clock()).clock, device: answer(.device()).device, apps: answer(.apps()).apps ?? [],
            running: answer(.running).running ?? [],
            pending: pending.enumerated().map { index, request in
                PendingEntry(request: request, why: index < Self.pendingWithWhy ? answer(.why(identifier: request.request.identifier, app: request.app)).why : nil)
            },
            actions: options.actions)
    }

    func answer(_ command: ControlCommand) -> ControlResponse { source.answer(command) }

    /// `body`'s value as JSON, made off Swift's cooperative threads (the host's answers block
    /// on its queue and its store).
    func json<T: Encodable & Sendable>(_ body: @escaping @Sendable () -> T) async throws -> Response {
        let data = try await Self.blocking { try JSONEncoder.control.encode(body()) }
        return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"],
                        body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static let blockingQueue = DispatchQueue(label: "bgtask.dashboard", attributes: .concurrent)

    static func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            blockingQueue.async { continuation.resume(with: Result { try body() }) }
        }
    }

    static func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            blockingQueue.async { continuation.resume(returning: body()) }
        }
    }

    static func asset(_ bytes: [UInt8], _ type: String) -> Response {
        Response(status: .ok, headers: [.contentType: type, .cacheControl: "no-cache"], body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    /// The end of a launch's log (at most `logBytes`), nil when it cannot be read.
    static func logTail(_ path: String) -> String? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        let size = (try? handle.seekToEnd()) ?? 0
        try? handle.seek(toOffset: size > UInt64(logBytes) ? size - UInt64(logBytes) : 0)
        guard let data = try? handle.readToEnd() else { return nil }
        return String(decoding: data, as: UTF8.self)
    }
}

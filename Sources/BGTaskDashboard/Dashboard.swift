import BGTaskControl
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore

/// The dashboard (issue 32, docs/dashboard.md): pages a person reads without the docs, served
/// by the host, over the host's own answers (`DashboardSource`, the control verbs) and its
/// launch events (`publish`, streamed to the pages as server-sent events); Prometheus's
/// /metrics beside them. Its pages are embedded in the binary: nothing is fetched from anywhere.
///
/// Who may see it: clients on loopback whose `Host` header names loopback (a page of another
/// site that a DNS name was rebound to 127.0.0.1 sends its own name, and is refused); anyone
/// else only with the token. What it may do: read, unless the operator enabled actions, and
/// an action also needs a header no other site's page can send without a preflight this server
/// never grants.
public final class Dashboard: Sendable {
    public let options: DashboardOptions
    let source: any DashboardSource
    let hub = DashboardHub()
    public let metrics = DashboardMetrics()
    private let logger: Logger
    private let task = LockedValue<Task<Void, Never>?>(nil)
    private let heartbeat = LockedValue<(any DispatchSourceTimer)?>(nil)

    public init(options: DashboardOptions, source: any DashboardSource, logger: Logger) {
        self.options = options
        self.source = source
        self.logger = logger
    }

    /// Starts listening; returns the port it listens on. Refuses to listen off loopback
    /// without a token.
    public func start() throws -> Int {
        if !DashboardOptions.isLoopback(options.address) && (options.token ?? "").isEmpty {
            throw DashboardError("the dashboard listens on \(options.address), off loopback: it needs a token (--http-token-file)")
        }
        let router = Router(context: DashboardContext.self)
        router.add(middleware: DashboardAccess(options: options))
        routes(router)
        let bound = LockedValue<Result<Int, any Error>?>(nil)
        let ready = DispatchSemaphore(value: 0)
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(options.address, port: options.port), serverName: "bgtask",
                                 availableConnectionsDelegate: MaximumAvailableConnections(Self.maximumConnections)),
            onServerRunning: { channel in
                bound.withLock { $0 = .success(channel.localAddress?.port ?? 0) }
                ready.signal()
            },
            logger: logger)
        let logger = logger
        task.withLock { $0 = Task {
            do {
                try await app.runService(gracefulShutdownSignals: [])
            } catch {
                logger.error("the dashboard stopped", metadata: ["error": "\(error)"])
                // It never listened: `start` is told why.
                let first = bound.withLock { value -> Bool in
                    guard value == nil else { return false }
                    value = .failure(error)
                    return true
                }
                if first { ready.signal() }
            }
        } }
        if ready.wait(timeout: .now() + 30) == .timedOut { throw DashboardError("the dashboard did not start listening within 30 s") }
        let port = try bound.withLock { $0 }!.get()
        let timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + 15, repeating: 15)
        timer.setEventHandler { [hub] in hub.heartbeat() }
        timer.resume()
        heartbeat.withLock { $0 = timer }
        logger.info("dashboard listening", metadata: ["address": "\(options.address)", "port": "\(port)", "actions": "\(options.actions)"])
        return port
    }

    public func stop() {
        heartbeat.withLock { $0 }?.cancel()
        hub.close()
        task.withLock { $0 }?.cancel()
    }

    /// A launch began or ended: to the pages watching, and (an end) to /metrics. Called on the
    /// host's queue: the encoding and counting happen on the dashboard's own serial queue, in
    /// the order the events came, so the host's queue pays only a hop per launch.
    public func publish(_ event: DashboardEvent) {
        events.async { [metrics, hub] in
            if case .launchEnded(let record) = event { metrics.record(record) }
            hub.publish(event)
        }
    }

    private let events = DispatchQueue(label: "bgtask.dashboard.events")

    /// Connections at once (a page holds one for its events, and a few for its reads).
    static let maximumConnections = 256
}

struct DashboardError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A request's context: Hummingbird's, with the peer's address.
struct DashboardContext: RequestContext, RemoteAddressRequestContext {
    var coreContext: CoreRequestContextStorage
    let remoteAddress: SocketAddress?
    /// The client's connection (an event stream frees its place when it closes).
    let channel: any Channel

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress
        channel = source.channel
    }
}

/// Who may read and who may act (see `Dashboard`).
struct DashboardAccess: RouterMiddleware {
    typealias Context = DashboardContext
    let options: DashboardOptions
    static let cookie = "bgtask_dashboard_token"

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let peer = context.remoteAddress?.ipAddress ?? ""
        let presented = Self.token(in: request)
        let tokenMatches = options.token.map { !$0.isEmpty && Self.equal($0, presented ?? "") } ?? false
        let host = request.head.authority ?? ""
        let hostName = Self.hostName(host)
        guard tokenMatches || (DashboardOptions.isLoopback(peer) && DashboardOptions.isLoopback(hostName)) else {
            let why = DashboardOptions.isLoopback(peer)
                ? "the Host header (\(String(host.prefix(80)))) does not name loopback: a token is needed"
                : "clients off loopback need the dashboard's token (Authorization: Bearer TOKEN)"
            return Self.refusal(.forbidden, why)
        }
        if request.method == .post {
            guard options.actions else { return Self.refusal(.forbidden, "actions are not enabled (bgtask host --http-actions)") }
            guard request.headers[HTTPField.Name("X-Bgtask-Action")!] == "1" else {
                return Self.refusal(.forbidden, "an action needs the header X-Bgtask-Action: 1")
            }
        }
        var response = try await next(request, context)
        // A token given in the address once is kept in a cookie (the page's later requests and
        // its event stream carry it), and the page is reloaded without it by the script.
        if tokenMatches, let token = options.token, Self.queryToken(request) != nil {
            response.headers[.setCookie] = "\(Self.cookie)=\(token); Path=/; HttpOnly; SameSite=Strict"
        }
        response.headers[HTTPField.Name("X-Content-Type-Options")!] = "nosniff"
        response.headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        return response
    }

    static func refusal(_ status: HTTPResponse.Status, _ why: String) -> Response {
        Response(status: status, headers: [.contentType: "text/plain; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(string: why + "\n")))
    }

    static func token(in request: Request) -> String? {
        if let authorization = request.headers[.authorization], authorization.hasPrefix("Bearer ") {
            return String(authorization.dropFirst(7))
        }
        if let cookies = request.headers[.cookie] {
            for part in cookies.split(separator: ";") {
                let pair = part.trimmingCharacters(in: .whitespaces)
                if pair.hasPrefix(cookie + "=") { return String(pair.dropFirst(cookie.count + 1)) }
            }
        }
        return queryToken(request)
    }

    static func queryToken(_ request: Request) -> String? {
        request.uri.queryParameters.get("token")
    }

    /// The host of a Host header (`127.0.0.1:8080`, `[::1]:80`, `localhost`).
    static func hostName(_ host: String) -> String {
        if host.hasPrefix("["), let end = host.firstIndex(of: "]") { return String(host[host.index(after: host.startIndex)..<end]) }
        return String(host.split(separator: ":", maxSplits: 1).first ?? "")
    }

    /// Compared in time that does not depend on where they differ.
    static func equal(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        var difference = UInt8(x.count == y.count ? 0 : 1)
        for index in 0..<max(x.count, y.count) {
            difference |= (index < x.count ? x[index] : 0) ^ (index < y.count ? y[index] : 0)
        }
        return difference == 0
    }
}

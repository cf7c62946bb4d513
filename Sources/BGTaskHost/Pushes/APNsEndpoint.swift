import BGTaskControl
import BGTaskModel
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL

/// What one provider (or anyone who reaches the port) may hold of the host. The host's
/// descriptors are shared with launches and the control socket (a systemd unit gives 1,024):
/// the connection cap keeps most of them for those.
public struct APNsEndpointLimits: Sendable, Equatable {
    /// Connections open at once; one more is closed as soon as it is accepted (logged).
    public var maximumConnections = 256
    /// From accept to the end of the TLS handshake (TLS only).
    public var handshakeTimeout: Duration = .seconds(10)
    /// A connection with no open stream for this long is closed.
    public var idleTimeout: Duration = .seconds(60)
    /// From a stream's first frame to its request's end: a stream left open (headers without
    /// END_STREAM, a body that never ends) is reset, so it cannot hold its connection open.
    public var requestTimeout: Duration = .seconds(10)
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection (more are refused with
    /// RST_STREAM REFUSED_STREAM by the protocol).
    public var maximumStreamsPerConnection = 100

    public init() {}
}

/// An APNs-compatible provider endpoint (opt-in, `bgtask host --apns-port`) on loopback by
/// default: HTTP/2 over TLS with ALPN `h2`, as APNs serves it (with `--apns-tls-certificate` and
/// `--apns-tls-key`), or over cleartext with prior knowledge (`curl --http2-prior-knowledge`). `POST /3/device/DEVICE_TOKEN` with APNs's headers (`apns-topic`, `apns-push-type`,
/// `apns-priority`, `apns-expiration`, `apns-collapse-id`, `apns-id`) and a JSON payload is
/// answered as APNs answers it: 200 with `apns-id` (HEADERS with END_STREAM, no body), or APNs's
/// status and `{"reason": ...}`. A provider's own server code can target a Linux device this way.
/// What became of an accepted push (delivered, waiting and why, dropped and why) rides in
/// `bgtask-push-state` and `bgtask-push-detail`, which APNs clients ignore.
///
/// What Apple's servers accept, this accepts: the authority as `:authority` or as a `host`
/// header (or neither: it is not read), headers in any order, header blocks split over
/// CONTINUATION frames. `apns-id` is echoed byte for byte as the provider sent it (a client
/// matches answers to requests by it); without one, one is made as APNs makes it.
///
/// Bounded (`Limits`, `bgtask host --apns-max-connections` and the timeouts): connections over
/// the cap are closed as they are accepted, a TLS handshake must finish in time, a connection
/// with no open stream is closed when idle, and a connection has a cap on concurrent streams.
/// Every refusal, reset and protocol error is logged with why (`APNsLog`).
///
/// SwiftNIO's HTTP/2 (NIOHTTP2) does the protocol; nothing of HTTP/2 is written here.
final class APNsEndpoint: @unchecked Sendable {
    struct Options: Sendable {
        var host: String
        var port: Int
        /// PEM files of the certificate chain and private key: TLS with ALPN h2 (nil: cleartext).
        var tls: (certificate: String, key: String)?
        /// Provider token keys by key identifier (PEM files), and the team: when there are
        /// keys, every request must carry a valid provider token (`APNsProviderAuth`).
        var providerKeys: [String: String] = [:]
        var teamID: String?
        var limits = Limits()
    }

    typealias Limits = APNsEndpointLimits

    private let options: Options
    private let core: HostCore
    private let pushes: PushDelivery
    private let evaluate: @Sendable @HostActor () -> Void
    private var group: MultiThreadedEventLoopGroup?
    private var auth: APNsProviderAuth?
    private var channel: Channel?
    private let log: APNsLog
    /// Connections open now (accepted and under the cap).
    private let openConnections = LockedValue(0)
    /// A push is handled off the event loop (it writes the store and waits for the host's queue).
    private let work = DispatchQueue(label: "bgtask.apns", attributes: .concurrent)

    init(options: Options, core: HostCore, pushes: PushDelivery, evaluate: @escaping @Sendable @HostActor () -> Void) {
        self.options = options
        self.core = core
        self.pushes = pushes
        self.evaluate = evaluate
        self.log = APNsLog(logger: core.logger)
    }

    var partName: String { "APNs endpoint" }

    /// The port it listens on (the one asked for, or the one the system gave for port 0).
    private(set) var boundPort: Int?

    func start() throws(BGTaskError) {
        let tls = try options.tls.map { (certificate, key) throws(BGTaskError) in try Self.tlsContext(certificate: certificate, key: key) }
        if !options.providerKeys.isEmpty { auth = try APNsProviderAuth(keyFiles: options.providerKeys, teamID: options.teamID) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let handle: @Sendable (APNsRequest) -> EventLoopFuture<APNsResponse> = { [self] request in self.handle(request) }
        let limits = options.limits, log = log, openConnections = openConnections
        var connectionSettings = NIOHTTP2Handler.ConnectionConfiguration()
        connectionSettings.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: limits.maximumStreamsPerConnection),
            HTTP2Setting(parameter: .maxHeaderListSize, value: HPACKDecoderLimits.maximumHeaderListBytes),
        ]
        let connection = connectionSettings
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 64)
            .serverChannelOption(ChannelOptions.socket(SocketOptionLevel(SOL_SOCKET), SO_REUSEADDR), value: 1)
            .childChannelInitializer { channel in
                let peer = channel.remoteAddress.map { "\($0)" } ?? "unknown"
                // Over the cap: closed at once, before any TLS or HTTP/2 state is made for it.
                let admitted = openConnections.withLock { open -> Int? in
                    guard open < limits.maximumConnections else { return nil }
                    open += 1
                    return open
                }
                guard admitted != nil else {
                    log.notice("connection-refused", "APNs connection refused: over the connection cap",
                               ["peer": "\(peer)", "apns.limit": "\(limits.maximumConnections)"])
                    return channel.close()
                }
                channel.closeFuture.whenComplete { _ in openConnections.withLock { $0 -= 1 } }
                do {
                    let sync = channel.pipeline.syncOperations
                    if let tls {
                        try sync.addHandler(NIOSSLServerHandler(context: tls))
                        try sync.addHandler(APNsHandshakeDeadline(timeout: limits.handshakeTimeout, peer: peer, log: log))
                    }
                    let guardHandler = APNsConnectionGuard(idleTimeout: limits.idleTimeout, peer: peer, log: log)
                    _ = try sync.configureHTTP2Pipeline(
                        mode: .server, connectionConfiguration: connection, streamConfiguration: .init(), streamDelegate: guardHandler
                    ) { stream in
                        stream.eventLoop.makeCompletedFuture {
                            try stream.pipeline.syncOperations.addHandler(APNsStreamHandler(handle: handle, timeout: limits.requestTimeout, peer: peer, log: log))
                        }
                    }
                    try sync.addHandler(guardHandler)
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    log.warning("pipeline", "APNs connection could not be set up", ["peer": "\(peer)", "error": "\(error)"])
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
            .childChannelOption(ChannelOptions.socket(IPPROTO_TCP, TCP_NODELAY), value: 1)
        do {
            let channel = try bootstrap.bind(host: options.host, port: options.port).wait()
            self.channel = channel
            self.group = group
            boundPort = channel.localAddress?.port
            core.logger.info("APNs endpoint listening", metadata: [
                "address": "\(options.host):\(boundPort ?? options.port)",
                "protocol": "\(tls == nil ? "HTTP/2 cleartext (prior knowledge)" : "HTTP/2 over TLS (ALPN h2)")",
                "apns.max_connections": "\(limits.maximumConnections)", "apns.max_streams": "\(limits.maximumStreamsPerConnection)",
                "apns.handshake_timeout": "\(limits.handshakeTimeout)", "apns.idle_timeout": "\(limits.idleTimeout)",
                "apns.request_timeout": "\(limits.requestTimeout)",
            ])
        } catch {
            try? group.syncShutdownGracefully()
            throw BGTaskError(.system, "the APNs endpoint cannot listen on \(options.host):\(options.port): \(error)")
        }
    }

    /// The server's TLS: the certificate chain and key from PEM files (errors name the file), ALPN h2.
    static func tlsContext(certificate: String, key: String) throws(BGTaskError) -> NIOSSLContext {
        let chain: [NIOSSLCertificate]
        do { chain = try NIOSSLCertificate.fromPEMFile(certificate) } catch {
            throw BGTaskError(.invalidRequest, file: certificate, "not a PEM certificate chain: \(error)")
        }
        guard !chain.isEmpty else { throw BGTaskError(.invalidRequest, file: certificate, "no certificate in the file") }
        let privateKey: NIOSSLPrivateKey
        do { privateKey = try NIOSSLPrivateKey(file: key, format: .pem) } catch {
            throw BGTaskError(.invalidRequest, file: key, "not a PEM private key: \(error)")
        }
        var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(privateKey))
        configuration.applicationProtocols = ["h2"]
        configuration.minimumTLSVersion = .tlsv12
        do { return try NIOSSLContext(configuration: configuration) } catch {
            throw BGTaskError(.invalidRequest, file: certificate, "the certificate and the key \(key) do not make a TLS context: \(error)")
        }
    }

    func stop() {
        try? channel?.close().wait()
        try? group?.syncShutdownGracefully()
        channel = nil
        group = nil
    }

    /// One request: routed and checked as APNs does, then handed to the host's pushes. Every
    /// refusal is logged with its status and reason.
    private func handle(_ request: APNsRequest) -> EventLoopFuture<APNsResponse> {
        let promise = request.eventLoop.makePromise(of: APNsResponse.self)
        work.async { [self] in
            var response = answer(request)
            // APNs echoes the provider's apns-id as sent; only a made one is the host's.
            if let given = request.apnsID { response.apnsID = given }
            if let reason = response.reason {
                log.notice("refused.\(reason)", "APNs request refused", [
                    "apns.status": "\(response.status)", "apns.reason": "\(reason)", "apns.id": "\(request.apnsID ?? "-")",
                    "apns.topic": "\(request.header("apns-topic")?.prefix(255) ?? "-")", "apns.path": "\(request.path.prefix(200))",
                    "peer": "\(request.peer)", "why": "\(response.detail ?? reason)",
                ])
                response.detail = nil
            }
            promise.succeed(response)
        }
        return promise.futureResult
    }

    private func answer(_ request: APNsRequest) -> APNsResponse {
        guard request.method == "POST" else { return .refused(405, "MethodNotAllowed", "method \(request.method.prefix(16)), not POST") }
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0].isEmpty, parts[1] == "3", parts[2] == "device" else { return .refused(404, "BadPath", "not /3/device/TOKEN") }
        if let auth, let refusal = auth.check(authorization: request.header("authorization")) {
            return .refused(403, refusal.reason.rawValue, refusal.why)
        }
        let token = String(parts[3]).lowercased()
        guard token.count == 64, token.allSatisfy(\.isHexDigit) else { return .refused(400, "BadDeviceToken", "the device token is not 64 hexadecimal digits") }
        if request.bodyTooLarge { return .refused(413, "PayloadTooLarge", "the payload is \(request.bodyBytes) bytes, over \(PushRules.maximumPayloadBytes)") }
        guard let topic = request.header("apns-topic"), !topic.isEmpty else { return .refused(400, "MissingTopic", "no apns-topic") }
        var priority: Int?
        if let text = request.header("apns-priority") {
            guard let value = Int(text) else { return .refused(400, "BadPriority", "apns-priority '\(text.prefix(16))' is not a number") }
            priority = value
        }
        var expiration: Double?
        if let text = request.header("apns-expiration") {
            guard let value = Double(text) else { return .refused(400, "BadExpirationDate", "apns-expiration '\(text.prefix(24))' is not a number") }
            expiration = value
        }
        let app: String?
        do { app = try core.store.app(forDeviceToken: token) } catch { return .refused(500, "InternalServerError", "the store: \(error)") }
        guard let app else { return .refused(400, "BadDeviceToken", "no app has device token \(token)") }
        guard topic == app else { return .refused(400, "DeviceTokenNotForTopic", "the token is \(app)'s, not \(topic.prefix(255))'s") }
        let submission = PushSubmission(
            app: app, payload: request.body, pushType: request.header("apns-push-type"), priority: priority,
            expiration: expiration, collapseID: request.header("apns-collapse-id"), id: request.apnsID)
        switch pushes.receive(submission, evaluate: evaluate) {
        case .success(let report):
            let detail = report.detail ?? report.blockers?.map(\.message).joined(separator: "; ")
            return APNsResponse(status: 200, reason: nil, apnsID: report.id, state: report.state.rawValue, detail: detail)
        case .failure(let refusal):
            return .refused(refusal.status, refusal.reason, refusal.message)
        }
    }
}

/// The HPACK decoder's bound on a request's header list (SETTINGS_MAX_HEADER_LIST_SIZE): APNs
/// requests carry a JWT of a few hundred bytes and a handful of short headers.
enum HPACKDecoderLimits {
    static let maximumHeaderListBytes = 16_384
}

/// A request as the stream handler gathered it.
struct APNsRequest: Sendable {
    var method: String
    var path: String
    /// Regular headers (names lower-case, as HTTP/2 sends them), in order; pseudo-headers apart.
    var headers: [(name: String, value: String)]
    var body: Data
    /// The body's length as sent (the body itself is kept only up to APNs's limit).
    var bodyBytes: Int
    var bodyTooLarge: Bool
    var peer: String
    var eventLoop: EventLoop
    /// The first value of a header, by its lower-case name.
    func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
    var apnsID: String? { header("apns-id") }
}

struct APNsResponse: Sendable {
    var status: Int
    var reason: String?
    var apnsID: String?
    var state: String?
    /// For a 200: what became of the push (`bgtask-push-detail`). For a refusal: why, for the
    /// host's log (APNs's answer carries the reason alone).
    var detail: String?

    static func refused(_ status: Int, _ reason: String, _ why: String) -> APNsResponse {
        APNsResponse(status: status, reason: reason, apnsID: nil, detail: why)
    }
}

/// One HTTP/2 stream, on the frames themselves (no HTTP/1 translation, which insists on
/// `:authority`): gathers the request (the body up to APNs's limit, the rest only counted),
/// hands it over, writes the answer as APNs does (success: HEADERS with END_STREAM).
final class APNsStreamHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let handle: @Sendable (APNsRequest) -> EventLoopFuture<APNsResponse>
    private let timeout: Duration
    private let peer: String
    private let log: APNsLog
    private var deadline = APNsCloseDeadline()
    private var pseudo: [String: String] = [:]
    private var headers: [(name: String, value: String)]?
    private var body = Data()
    private var bodyBytes = 0
    private var complete = false

    init(handle: @escaping @Sendable (APNsRequest) -> EventLoopFuture<APNsResponse>, timeout: Duration, peer: String, log: APNsLog) {
        self.handle = handle
        self.timeout = timeout
        self.peer = peer
        self.log = log
    }

    func handlerAdded(context: ChannelHandlerContext) {
        // Closing a stream channel resets the stream (RST_STREAM CANCEL).
        deadline.arm(context, after: timeout, peer: peer, log: log, kind: "request-timeout",
                     "APNs stream reset: the request did not end in time")
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline.cancel()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !complete else { return }
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            // The first block is the request's; a later one is trailers (read for END_STREAM only).
            if headers == nil {
                var regular: [(name: String, value: String)] = []
                for (name, value, _) in frame.headers {
                    if name.hasPrefix(":") { pseudo[name] = value } else { regular.append((name.lowercased(), value)) }
                }
                headers = regular
            }
            if frame.endStream { finish(context) }
        case .data(let frame):
            if case .byteBuffer(let buffer) = frame.data {
                bodyBytes += buffer.readableBytes
                if bodyBytes <= PushRules.maximumPayloadBytes { body.append(contentsOf: buffer.readableBytesView) }
            }
            if frame.endStream { finish(context) }
        default:
            break
        }
    }

    private func finish(_ context: ChannelHandlerContext) {
        complete = true
        deadline.cancel()
        guard let headers else { return }
        let request = APNsRequest(method: pseudo[":method"] ?? "", path: pseudo[":path"] ?? "", headers: headers, body: body,
                                  bodyBytes: bodyBytes, bodyTooLarge: bodyBytes > PushRules.maximumPayloadBytes, peer: peer,
                                  eventLoop: context.eventLoop)
        body = Data()
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        handle(request).whenComplete { result in
            let response = (try? result.get()) ?? APNsResponse(status: 500, reason: "InternalServerError", apnsID: request.apnsID)
            Self.write(response, to: bound.value)
        }
    }

    private static func write(_ response: APNsResponse, to context: ChannelHandlerContext) {
        var headers: [(String, String)] = [(":status", "\(response.status)")]
        if let id = response.apnsID { headers.append(("apns-id", id)) }
        if let state = response.state { headers.append(("bgtask-push-state", state)) }
        if let detail = response.detail {
            // A header value is one line of visible characters.
            headers.append(("bgtask-push-detail", String(detail.unicodeScalars.map { $0.value >= 0x20 && $0.value < 0x7f ? Character($0) : " " }.prefix(512))))
        }
        guard let reason = response.reason else {
            // APNs's success: the status and apns-id, END_STREAM on the HEADERS frame, no DATA.
            context.writeAndFlush(NIOAny(HTTP2Frame.FramePayload.headers(.init(headers: .init(headers), endStream: true))), promise: nil)
            return
        }
        let json = (try? JSONSerialization.data(withJSONObject: ["reason": reason])) ?? Data()
        var buffer = context.channel.allocator.buffer(capacity: json.count)
        buffer.writeBytes(json)
        headers.append(("content-type", "application/json"))
        headers.append(("content-length", "\(json.count)"))
        context.write(NIOAny(HTTP2Frame.FramePayload.headers(.init(headers: .init(headers)))), promise: nil)
        context.writeAndFlush(NIOAny(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(buffer), endStream: true))), promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let closed = error as? NIOHTTP2Errors.StreamClosed {
            log.notice("stream-reset", "APNs stream reset", ["peer": "\(peer)", "apns.stream": "\(closed.streamID)",
                                                            "apns.error_code": "\(closed.errorCode)", "why": "reset by the peer"])
        } else {
            log.notice("stream-error", "APNs stream error", ["peer": "\(peer)", "error": "\(error)"])
        }
        context.close(promise: nil)
    }
}

extension APNsEndpoint: HostPart {}

import BGTaskModel
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL

/// An APNs-compatible provider endpoint (opt-in, `bgtask host --apns-port`) on loopback by
/// default: HTTP/2 over TLS with ALPN `h2`, as APNs serves it (with `--apns-tls-certificate` and
/// `--apns-tls-key`), or over cleartext with prior knowledge (`curl --http2-prior-knowledge`). `POST /3/device/DEVICE_TOKEN` with APNs's headers (`apns-topic`, `apns-push-type`,
/// `apns-priority`, `apns-expiration`, `apns-collapse-id`, `apns-id`) and a JSON payload is
/// answered as APNs answers it: 200 with `apns-id`, or APNs's status and `{"reason": ...}`. A
/// provider's own server code can target a Linux device this way. What became of an accepted
/// push (delivered, waiting and why, dropped and why) rides in `bgtask-push-state` and
/// `bgtask-push-detail`, which APNs clients ignore.
///
/// SwiftNIO's HTTP/2 (NIOHTTP2) does the protocol; nothing of HTTP/2 is written here.
final class APNsEndpoint: HostPart, @unchecked Sendable {
    struct Options: Sendable {
        var host: String
        var port: Int
        /// PEM files of the certificate chain and private key: TLS with ALPN h2 (nil: cleartext).
        var tls: (certificate: String, key: String)?
        /// Provider token keys by key identifier (PEM files), and the team: when there are
        /// keys, every request must carry a valid provider token (`APNsProviderAuth`).
        var providerKeys: [String: String] = [:]
        var teamID: String?
    }

    private let options: Options
    private let core: HostCore
    private let pushes: PushDelivery
    private let evaluate: @Sendable () -> Void
    private var group: MultiThreadedEventLoopGroup?
    private var auth: APNsProviderAuth?
    private var channel: Channel?
    /// A push is handled off the event loop (it writes the store and waits for the host's queue).
    private let work = DispatchQueue(label: "bgtask.apns", attributes: .concurrent)

    init(options: Options, core: HostCore, pushes: PushDelivery, evaluate: @escaping @Sendable () -> Void) {
        self.options = options
        self.core = core
        self.pushes = pushes
        self.evaluate = evaluate
    }

    var partName: String { "APNs endpoint" }

    /// The port it listens on (the one asked for, or the one the system gave for port 0).
    private(set) var boundPort: Int?

    func start() throws(BGTaskError) {
        let tls = try options.tls.map { (certificate, key) throws(BGTaskError) in try Self.tlsContext(certificate: certificate, key: key) }
        if !options.providerKeys.isEmpty { auth = try APNsProviderAuth(keyFiles: options.providerKeys, teamID: options.teamID) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let handle = { [self] (request: APNsRequest) -> EventLoopFuture<APNsResponse> in self.handle(request) }
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 64)
            .serverChannelOption(ChannelOptions.socket(SocketOptionLevel(SOL_SOCKET), SO_REUSEADDR), value: 1)
            .childChannelInitializer { channel in
                if let tls {
                    do { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) } catch {
                        return channel.eventLoop.makeFailedFuture(error)
                    }
                }
                return channel.configureHTTP2Pipeline(mode: .server) { stream in
                    stream.eventLoop.makeCompletedFuture {
                        let sync = stream.pipeline.syncOperations
                        try sync.addHandler(HTTP2FramePayloadToHTTP1ServerCodec())
                        try sync.addHandler(APNsStreamHandler(handle: handle))
                    }
                }.map { _ in }
            }
            .childChannelOption(ChannelOptions.socket(IPPROTO_TCP, TCP_NODELAY), value: 1)
        do {
            let channel = try bootstrap.bind(host: options.host, port: options.port).wait()
            self.channel = channel
            self.group = group
            boundPort = channel.localAddress?.port
            core.logger.info("APNs endpoint listening", metadata: ["address": "\(options.host):\(boundPort ?? options.port)",
                                                                   "protocol": "\(tls == nil ? "HTTP/2 cleartext (prior knowledge)" : "HTTP/2 over TLS (ALPN h2)")"])
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

    /// One request: routed and checked as APNs does, then handed to the host's pushes.
    private func handle(_ request: APNsRequest) -> EventLoopFuture<APNsResponse> {
        let promise = request.eventLoop.makePromise(of: APNsResponse.self)
        work.async { [self] in promise.succeed(answer(request)) }
        return promise.futureResult
    }

    private func answer(_ request: APNsRequest) -> APNsResponse {
        guard request.method == .POST else { return .refused(405, "MethodNotAllowed", id: request.apnsID) }
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0].isEmpty, parts[1] == "3", parts[2] == "device" else { return .refused(404, "BadPath", id: request.apnsID) }
        if let auth, let refusal = auth.check(authorization: request.headers.first(name: "authorization")) {
            return .refused(403, refusal.rawValue, id: request.apnsID)
        }
        let token = String(parts[3]).lowercased()
        guard token.count == 64, token.allSatisfy(\.isHexDigit) else { return .refused(400, "BadDeviceToken", id: request.apnsID) }
        if request.bodyTooLarge { return .refused(413, "PayloadTooLarge", id: request.apnsID) }
        guard let topic = request.headers.first(name: "apns-topic"), !topic.isEmpty else { return .refused(400, "MissingTopic", id: request.apnsID) }
        var priority: Int?
        if let text = request.headers.first(name: "apns-priority") {
            guard let value = Int(text) else { return .refused(400, "BadPriority", id: request.apnsID) }
            priority = value
        }
        var expiration: Double?
        if let text = request.headers.first(name: "apns-expiration") {
            guard let value = Double(text) else { return .refused(400, "BadExpirationDate", id: request.apnsID) }
            expiration = value
        }
        let app: String?
        do { app = try core.store.app(forDeviceToken: token) } catch { return .refused(500, "InternalServerError", id: request.apnsID) }
        guard let app else { return .refused(400, "BadDeviceToken", id: request.apnsID) }
        guard topic == app else { return .refused(400, "DeviceTokenNotForTopic", id: request.apnsID) }
        let submission = PushSubmission(
            app: app, payload: request.body, pushType: request.headers.first(name: "apns-push-type"), priority: priority,
            expiration: expiration, collapseID: request.headers.first(name: "apns-collapse-id"), id: request.apnsID)
        switch pushes.receive(submission, evaluate: evaluate) {
        case .success(let report):
            let detail = report.detail ?? report.blockers?.map(\.message).joined(separator: "; ")
            return APNsResponse(status: 200, reason: nil, apnsID: report.id, state: report.state.rawValue, detail: detail)
        case .failure(let refusal):
            return .refused(refusal.status, refusal.reason, id: request.apnsID)
        }
    }
}

/// A request as the stream handler gathered it.
struct APNsRequest: Sendable {
    var method: HTTPMethod
    var path: String
    var headers: HTTPHeaders
    var body: Data
    var bodyTooLarge: Bool
    var eventLoop: EventLoop
    var apnsID: String? { headers.first(name: "apns-id") }
}

struct APNsResponse: Sendable {
    var status: Int
    var reason: String?
    var apnsID: String?
    var state: String?
    var detail: String?

    static func refused(_ status: Int, _ reason: String, id: String?) -> APNsResponse {
        APNsResponse(status: status, reason: reason, apnsID: id)
    }
}

/// One HTTP/2 stream: gathers the request (the body up to APNs's limit plus one byte, the rest
/// only counted), hands it over, writes the answer.
final class APNsStreamHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let handle: (APNsRequest) -> EventLoopFuture<APNsResponse>
    private var head: HTTPRequestHead?
    private var body = Data()
    private var tooLarge = false

    init(handle: @escaping (APNsRequest) -> EventLoopFuture<APNsResponse>) { self.handle = handle }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
        case .body(var buffer):
            if body.count + buffer.readableBytes > PushRules.maximumPayloadBytes {
                tooLarge = true
            } else if let bytes = buffer.readBytes(length: buffer.readableBytes) {
                body.append(contentsOf: bytes)
            }
        case .end:
            guard let head else { return }
            let request = APNsRequest(method: head.method, path: head.uri, headers: head.headers, body: body,
                                      bodyTooLarge: tooLarge, eventLoop: context.eventLoop)
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            handle(request).whenComplete { result in
                let response = (try? result.get()) ?? .refused(500, "InternalServerError", id: request.apnsID)
                Self.write(response, to: bound.value)
            }
        }
    }

    private static func write(_ response: APNsResponse, to context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        if let id = response.apnsID { headers.add(name: "apns-id", value: id) }
        if let state = response.state { headers.add(name: "bgtask-push-state", value: state) }
        if let detail = response.detail {
            // A header value is one line of visible characters.
            headers.add(name: "bgtask-push-detail", value: String(detail.unicodeScalars.map { $0.value >= 0x20 && $0.value < 0x7f ? Character($0) : " " }.prefix(512)))
        }
        var body: ByteBuffer?
        if let reason = response.reason {
            let json = (try? JSONSerialization.data(withJSONObject: ["reason": reason])) ?? Data()
            var buffer = context.channel.allocator.buffer(capacity: json.count)
            buffer.writeBytes(json)
            headers.add(name: "content-type", value: "application/json")
            headers.add(name: "content-length", value: "\(json.count)")
            body = buffer
        } else {
            headers.add(name: "content-length", value: "0")
        }
        context.write(NIOAny(HTTPServerResponsePart.head(HTTPResponseHead(
            version: .init(major: 2, minor: 0), status: HTTPResponseStatus(statusCode: response.status), headers: headers))), promise: nil)
        if let body { context.write(NIOAny(HTTPServerResponsePart.body(.byteBuffer(body))), promise: nil) }
        context.writeAndFlush(NIOAny(HTTPServerResponsePart.end(nil)), promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.close(promise: nil)
    }
}

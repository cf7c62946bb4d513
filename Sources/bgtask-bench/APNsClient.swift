import Foundation
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix

/// A provider's connection to the host's APNs-compatible endpoint (`bgtask host --apns-port`):
/// HTTP/2 over cleartext TCP with prior knowledge, one connection kept open as a provider keeps
/// its connection to APNs, one stream per push (SwiftNIO's HTTP/2, as the endpoint itself).
final class APNsBenchClient {
    private let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    private let channel: Channel
    private let multiplexer: HTTP2StreamMultiplexer

    init(port: Int) throws {
        let bootstrap = ClientBootstrap(group: group)
            .channelOption(ChannelOptions.socket(IPPROTO_TCP, TCP_NODELAY), value: 1)
            .channelInitializer { channel in
                channel.configureHTTP2Pipeline(mode: .client, inboundStreamInitializer: nil).map { _ in }
            }
        do {
            channel = try bootstrap.connect(host: "127.0.0.1", port: port).wait()
            multiplexer = try channel.pipeline.handler(type: HTTP2StreamMultiplexer.self).wait()
        } catch {
            try? group.syncShutdownGracefully()
            throw BenchError("cannot connect to the APNs endpoint on 127.0.0.1:\(port): \(error)")
        }
    }

    deinit {
        _ = channel.close()
        try? group.syncShutdownGracefully()
    }

    /// POSTs `body` to `path` with `headers`; the response's status and headers.
    func post(path: String, headers: [(String, String)], body: String) throws -> (status: Int, headers: HTTPHeaders) {
        let promise = channel.eventLoop.makePromise(of: HTTPResponseHead.self)
        let created = channel.eventLoop.makePromise(of: Channel.self)
        multiplexer.createStreamChannel(promise: created) { stream in
            stream.eventLoop.makeCompletedFuture {
                let sync = stream.pipeline.syncOperations
                try sync.addHandler(HTTP2FramePayloadToHTTP1ClientCodec(httpProtocol: .http))
                try sync.addHandler(ResponseHead(promise))
            }
        }
        let stream = try created.futureResult.wait()
        var head = HTTPRequestHead(version: .http2, method: .POST, uri: path)
        head.headers.add(name: "host", value: "127.0.0.1")
        head.headers.add(name: "content-length", value: "\(body.utf8.count)")
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        stream.write(HTTPClientRequestPart.head(head), promise: nil)
        stream.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(string: body))), promise: nil)
        stream.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        let response = try promise.futureResult.wait()
        return (Int(response.status.code), response.headers)
    }

    /// Completes its promise with the response's head (the rest of the response is not needed).
    private final class ResponseHead: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPClientResponsePart
        private let promise: EventLoopPromise<HTTPResponseHead>
        private var done = false

        init(_ promise: EventLoopPromise<HTTPResponseHead>) { self.promise = promise }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            if case let .head(head) = unwrapInboundIn(data), !done {
                done = true
                promise.succeed(head)
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: Error) {
            if !done {
                done = true
                promise.fail(error)
            }
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !done {
                done = true
                promise.fail(BenchError("the stream closed before its response"))
            }
        }
    }
}

import BGTaskControl
import Foundation
import Logging
import NIOCore
import NIOHTTP2
import NIOSSL
import NIOTLS

/// The APNs endpoint's log: why it refused, reset or closed anything, with stable metadata keys
/// (`peer`, `apns.status`, `apns.reason`, `apns.id`, `apns.stream`, `apns.error_code`, `why`,
/// `error`, `apns.suppressed`). Rate-limited per kind of event, so that a flood of bad requests
/// or connections cannot flood the host's log: at most `perSecond` lines of one kind a second;
/// the next line that gets through says how many were left out (`apns.suppressed`). Any thread.
final class APNsLog: @unchecked Sendable {
    private let logger: Logger
    private let perSecond: Int
    private struct Window { var start: Date; var written: Int; var suppressed: Int }
    private let windows = LockedValue([String: Window]())

    init(logger: Logger, perSecond: Int = 20) {
        self.logger = logger
        self.perSecond = perSecond
    }

    func notice(_ kind: String, _ message: String, _ metadata: Logger.Metadata) { write(.notice, kind, message, metadata) }
    func warning(_ kind: String, _ message: String, _ metadata: Logger.Metadata) { write(.warning, kind, message, metadata) }
    func info(_ kind: String, _ message: String, _ metadata: Logger.Metadata) { write(.info, kind, message, metadata) }

    private func write(_ level: Logger.Level, _ kind: String, _ message: String, _ metadata: Logger.Metadata) {
        let now = Date()
        let suppressed = windows.withLock { windows -> Int? in
            // Kinds are few (event kinds and APNs's reasons); keep the table from growing anyway.
            if windows.count > 256 { windows.removeAll() }
            var window = windows[kind] ?? Window(start: now, written: 0, suppressed: 0)
            if now.timeIntervalSince(window.start) >= 1 { window = Window(start: now, written: 0, suppressed: window.suppressed) }
            guard window.written < perSecond else {
                window.suppressed += 1
                windows[kind] = window
                return nil
            }
            window.written += 1
            let left = window.suppressed
            window.suppressed = 0
            windows[kind] = window
            return left
        }
        guard let suppressed else { return }
        var metadata = metadata
        if suppressed > 0 { metadata["apns.suppressed"] = "\(suppressed)" }
        logger.log(level: level, "\(message)", metadata: metadata)
    }
}

extension Duration {
    /// The same span as SwiftNIO's TimeAmount.
    var timeAmount: TimeAmount { .nanoseconds(nanoseconds) }
}

/// A deadline on a channel (a connection or a stream): when it passes before `cancel()`, says
/// why in the log and closes the channel (a stream channel's close resets the stream). Both the
/// handshake's and a request's deadline are one of these. On the channel's event loop only.
struct APNsCloseDeadline {
    private var scheduled: Scheduled<Void>?

    mutating func arm(_ context: ChannelHandlerContext, after timeout: Duration, peer: String, log: APNsLog,
                      kind: String, _ message: String) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        scheduled = context.eventLoop.scheduleTask(in: timeout.timeAmount) {
            log.notice(kind, message, ["peer": "\(peer)", "apns.timeout": "\(timeout)"])
            bound.value.close(promise: nil)
        }
    }

    mutating func cancel() {
        scheduled?.cancel()
        scheduled = nil
    }
}

/// Closes a TLS connection whose handshake has not finished within the deadline (a peer that
/// connects and sends nothing, or trickles a ClientHello), and logs why a handshake failed.
/// Sits right after NIOSSL's handler; removes itself once the handshake is done.
final class APNsHandshakeDeadline: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
    typealias InboundIn = NIOAny

    private let timeout: Duration
    private let peer: String
    private let log: APNsLog
    private var deadline = APNsCloseDeadline()

    init(timeout: Duration, peer: String, log: APNsLog) {
        self.timeout = timeout
        self.peer = peer
        self.log = log
    }

    func handlerAdded(context: ChannelHandlerContext) {
        // The child channel is active by the time its initializer runs; the deadline starts now.
        deadline.arm(context, after: timeout, peer: peer, log: log, kind: "handshake-timeout",
                     "APNs connection closed: TLS handshake not finished in time")
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline.cancel()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted = event {
            deadline.cancel()
            context.fireUserInboundEventTriggered(event)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        log.notice("handshake-failed", "APNs connection closed: TLS handshake failed", ["peer": "\(peer)", "error": "\(error)"])
        context.close(promise: nil)
    }
}

/// One connection's HTTP/2 life: counts its open streams (as NIOHTTP2's stream delegate) and
/// closes it when it has had none for the idle timeout; logs the protocol errors NIOHTTP2
/// reports on the connection (a connection error: GOAWAY; a stream error: RST_STREAM), with
/// the error code and stream. Sits after the HTTP/2 handler. On the connection's event loop.
final class APNsConnectionGuard: ChannelInboundHandler, NIOHTTP2StreamDelegate, @unchecked Sendable {
    typealias InboundIn = NIOAny

    private let idleTimeout: Duration
    private let peer: String
    private let log: APNsLog
    private var openStreams = 0
    private var idleClose: Scheduled<Void>?
    private var context: ChannelHandlerContext?

    init(idleTimeout: Duration, peer: String, log: APNsLog) {
        self.idleTimeout = idleTimeout
        self.peer = peer
        self.log = log
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        armIdleClose()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        idleClose?.cancel()
        idleClose = nil
        self.context = nil
    }

    private func armIdleClose() {
        idleClose?.cancel()
        guard let context else { return }
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        let peer = peer, log = log, timeout = idleTimeout
        idleClose = context.eventLoop.scheduleTask(in: timeout.timeAmount) {
            log.info("idle-timeout", "APNs connection closed: no open stream for the idle timeout", ["peer": "\(peer)", "apns.timeout": "\(timeout)"])
            bound.value.close(promise: nil)
        }
    }

    func streamCreated(_ id: HTTP2StreamID, channel: Channel) {
        openStreams += 1
        idleClose?.cancel()
        idleClose = nil
    }

    func streamClosed(_ id: HTTP2StreamID, channel: Channel) {
        openStreams -= 1
        if openStreams <= 0 {
            openStreams = 0
            armIdleClose()
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let streamError = error as? NIOHTTP2Errors.StreamError {
            log.notice("stream-error", "APNs stream reset: HTTP/2 stream error", [
                "peer": "\(peer)", "apns.stream": "\(streamError.streamID)",
                "why": "\(streamError.baseError)",
            ])
            return
        }
        log.notice("protocol-error", "APNs connection closed: HTTP/2 protocol error", ["peer": "\(peer)", "error": "\(error)"])
        context.close(promise: nil)
    }
}

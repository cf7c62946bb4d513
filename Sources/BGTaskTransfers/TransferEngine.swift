import BGTaskControl
import AsyncHTTPClient
import BGTaskModel
import Foundation
import Glibc
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

/// One attempt at a transfer, as `BackgroundTransfers` asks for it: the request, and where the
/// bytes go or come from.
package struct TransferAttempt: Sendable {
    package var id: String
    package var kind: TransferKind
    package var url: String
    package var method: String
    package var headers: [TransferHeader]
    /// No byte (and no connection) for this long ends the attempt (`NSURLErrorTimedOut`, retried).
    package var requestTimeout: TimeInterval
    /// `download`: the partial body's file (host-private; created if missing).
    package var spool: String?
    /// `download`: the validator of the bytes already in `spool`. With both, the attempt asks for
    /// the rest (`Range: bytes=N-`, `If-Range`); without, it starts from zero.
    package var validator: String?
    /// `upload`: the body (the host's copy of the app's file) and its length.
    package var body: String?
    package var bodyLength: Int64 = 0
    /// `data`, `upload`: the most of the response body kept (more fails the transfer).
    package var inlineLimit: Int = TransferLimits.inlineBodyBytes
    /// Progress events at most this often (and the last one at the end).
    package var progressInterval: TimeInterval = 0.25
    /// The app whose transfer it is, and the staging its spool writes are charged to (the
    /// app's cap, the host's disk reserve) before they are made. Nil: not charged.
    package var app: String = ""
    package var staging: StagingLedger?

    /// The memberwise initializer, for the modules above this one.
    package init(id: String, kind: TransferKind, url: String, method: String, headers: [TransferHeader], requestTimeout: TimeInterval, spool: String? = nil, validator: String? = nil, body: String? = nil, bodyLength: Int64 = 0, inlineLimit: Int = TransferLimits.inlineBodyBytes, progressInterval: TimeInterval = 0.25, app: String = "", staging: StagingLedger? = nil) {
        self.id = id
        self.kind = kind
        self.url = url
        self.method = method
        self.headers = headers
        self.requestTimeout = requestTimeout
        self.spool = spool
        self.validator = validator
        self.body = body
        self.bodyLength = bodyLength
        self.inlineLimit = inlineLimit
        self.progressInterval = progressInterval
        self.app = app
        self.staging = staging
    }
}

/// What an attempt reports, in order, on any thread: at most one `response`, `progress` at most
/// every `progressInterval`, then exactly one `finished`.
package enum TransferAttemptEvent: Sendable {
    /// The response head: the response, the validator worth keeping (a 200 or 206's strong
    /// ETag or Last-Modified), the offset the body continues at (> 0: resumed), and the
    /// expected total (-1: unknown).
    case response(TransferResponse, validator: String?, offset: Int64, expected: Int64)
    case progress(received: Int64, expected: Int64, sent: Int64)
    case finished(TransferAttemptResult)
}

package enum TransferAttemptResult: Sendable, Equatable {
    /// The server answered and the whole body arrived (into the spool file, or `body`).
    case completed(received: Int64, body: Data?)
    /// It failed. `retry`: a later attempt may succeed (connection refused or lost, no byte
    /// within the request timeout). `restart`: the partial body cannot be resumed (the server
    /// refused the range): the next attempt starts from zero.
    case failed(TransferError, retry: Bool, restart: Bool)
    /// `stop()` ended it (cancel, pause, resource timeout, shutdown): the caller knows why.
    case stopped
}

/// Carries out transfer attempts with AsyncHTTPClient on SwiftNIO's event loops: a download's
/// body is streamed to its spool file with backpressure (each part is written on a thread pool
/// before the next is read: memory stays flat whatever the size); an upload's body is read from
/// its file the same way; a data task's body is kept in memory up to its limit. It keeps no
/// state between attempts: `BackgroundTransfers` decides what to try and when.
///
/// Thread-safe. `shutdown()` once, when the part stops.
package final class TransferEngine: @unchecked Sendable {
    package let client: HTTPClient
    package let group: any EventLoopGroup
    package let threadPool: NIOThreadPool
    package let logger: Logger
    /// Each spool write waits this long first: for tests, to make a body's parts gather while a
    /// write is out (the batching and its backpressure), as a slow disk would.
    package var writeDelayForTests: Duration?
    /// The spool's write buffer of each attempt (`TransferDelegate.maximumBuffered`), smaller in tests.
    package var bufferLimitForTests: Int?
    /// Over the attempts that ended: the most body bytes that waited for a write at once, and
    /// how many body parts waited for room (the connection not read meanwhile).
    package let writeStatistics = LockedValue((mostBuffered: 0, waitsForRoom: 0))

    package init(logger: Logger, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
        self.logger = logger
        self.group = group
        threadPool = NIOThreadPool(numberOfThreads: 2)
        threadPool.start()
        var configuration = HTTPClient.Configuration(
            redirectConfiguration: .follow(max: 10, allowCycles: false),
            // The attempt's own idle timer (requestTimeout) covers connecting and reading.
            timeout: .init(connect: .seconds(60)),
            decompression: .disabled)
        // A refused connection fails the attempt at once: the part retries with its own
        // backoff (and says so in `heldBy`), rather than the pool retrying unseen.
        configuration.connectionPool.retryConnectionEstablishment = false
        // Pooled connections are descriptors the transfers' share pays for (TransferBounds):
        // at most 16 to one server (an HTTP/1 request past them waits in the pool: room for
        // two apps' 6 each to one CDN), and not kept idle long.
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = 16
        configuration.connectionPool.idleTimeout = .seconds(10)
        client = HTTPClient(eventLoopGroup: group, configuration: configuration, backgroundActivityLogger: logger)
    }

    /// Ends every attempt still running (each reports `stopped`) and releases the client.
    package func shutdown() {
        do { try client.syncShutdown() } catch { logger.debug("transfer client shutdown: \(error)") }
        try? threadPool.syncShutdownGracefully()
    }

    /// Starts an attempt; `report` gets its events (on an event loop or the thread pool).
    package func start(_ attempt: TransferAttempt, report: @escaping @Sendable (TransferAttemptEvent) -> Void) -> TransferAttemptHandle {
        let loop = group.next()
        let handle = TransferAttemptHandle(loop: loop)
        let delegate: TransferDelegate
        do {
            delegate = try TransferDelegate(attempt, loop: loop, threadPool: threadPool, report: report)
            delegate.writeDelay = writeDelayForTests
            if let bufferLimitForTests { delegate.bufferLimit = bufferLimitForTests }
            delegate.statistics = writeStatistics
        } catch {
            report(.finished(.failed(error.error, retry: false, restart: false)))
            return handle
        }
        var headers = HTTPHeaders()
        for header in attempt.headers { headers.add(name: header.name, value: header.value) }
        if delegate.offset > 0, let validator = attempt.validator {
            headers.replaceOrAdd(name: "Range", value: "bytes=\(delegate.offset)-")
            headers.replaceOrAdd(name: "If-Range", value: validator)
        }
        var body: HTTPClient.Body?
        if attempt.kind == .upload, let path = attempt.body {
            body = Self.uploadBody(path: path, length: attempt.bodyLength, pool: threadPool, loop: loop)
        }
        let request: HTTPClient.Request
        do {
            request = try HTTPClient.Request(url: attempt.url, method: HTTPMethod(rawValue: attempt.method), headers: headers, body: body)
        } catch {
            delegate.close()
            report(.finished(.failed(TransferError(code: -1000, message: "the URL cannot be requested: \(error)"), retry: false, restart: false)))
            return handle
        }
        loop.execute {
            let task = self.client.execute(request: request, delegate: delegate, eventLoop: .delegate(on: loop), logger: self.logger)
            delegate.begin(task)
            handle.attach(task, delegate)
            task.futureResult.whenComplete { result in delegate.end(result) }
        }
        return handle
    }

    /// An upload's body: its file read in 64 KiB parts on the thread pool, each written once the
    /// one before it was taken (AsyncHTTPClient's writer future).
    package static func uploadBody(path: String, length: Int64, pool: NIOThreadPool, loop: any EventLoop) -> HTTPClient.Body {
        .stream(contentLength: length) { writer in
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                return loop.makeFailedFuture(TransferFileError(path: path, errno: errno, action: "open the upload's body"))
            }
            let chunk = 64 * 1024
            @Sendable func send(from offset: Int64) -> EventLoopFuture<Void> {
                guard offset < length else { return loop.makeSucceededVoidFuture() }
                return pool.runIfActive(eventLoop: loop) { () throws -> ByteBuffer in
                    var buffer = ByteBufferAllocator().buffer(capacity: chunk)
                    let count = Int(min(Int64(chunk), length - offset))
                    let read = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { pointer in
                        let n = pread(fd, pointer.baseAddress, count, off_t(offset))
                        if n < 0 { throw TransferFileError(path: path, errno: errno, action: "read the upload's body") }
                        if n == 0 { throw TransferFileError(path: path, errno: nil, action: "read the upload's body: it is shorter than when it was handed over") }
                        return n
                    }
                    _ = read
                    return buffer
                }.flatMap { buffer in
                    let count = Int64(buffer.readableBytes)
                    return writer.write(.byteBuffer(buffer)).flatMap { send(from: offset + count) }
                }
            }
            let sent = send(from: 0)
            sent.whenComplete { _ in Glibc.close(fd) }
            return sent
        }
    }
}

/// A running attempt, to stop it.
package final class TransferAttemptHandle: @unchecked Sendable {
    package let loop: any EventLoop
    package var task: HTTPClient.Task<Void>?
    package var delegate: TransferDelegate?
    package var stopRequested = false

    package init(loop: any EventLoop) { self.loop = loop }

    package func attach(_ task: HTTPClient.Task<Void>, _ delegate: TransferDelegate) {
        self.task = task
        self.delegate = delegate
        if stopRequested { stopNow() }
    }

    /// Ends the attempt; it reports `stopped` (unless it had finished already). Any thread.
    package func stop() {
        loop.execute {
            self.stopRequested = true
            self.stopNow()
        }
    }

    package func stopNow() {
        guard let task, let delegate else { return }
        delegate.stopRequested = true
        task.cancel()
    }
}

/// An error reading or writing one of a transfer's files.
package struct TransferFileError: Error, CustomStringConvertible {
    package var path: String
    package var errno: Int32?
    package var action: String
    /// The staging bound that stopped it (the app's cap, the host's disk reserve), if one did.
    package var refusal: StagingRefusal?
    package var description: String {
        if let refusal { return "cannot \(action) (\(path)): \(refusal)" }
        return "cannot \(action) (\(path))" + (errno.map { ": \(String(cString: strerror($0)))" } ?? "")
    }

    /// The memberwise initializer, for the modules above this one.
    package init(path: String, errno: Int32? = nil, action: String, refusal: StagingRefusal? = nil) {
        self.path = path
        self.errno = errno
        self.action = action
        self.refusal = refusal
    }
}

/// A transfer's failure as a thrown error.
package struct TransferFailure: Error {
    package var error: TransferError
    package init(_ error: TransferError) { self.error = error }
}

/// No byte within the request timeout.
package struct IdleTimeout: Error {}
/// A body over the inline limit.
package struct BodyTooLarge: Error {}
/// A range the partial body cannot continue with.
package struct RangeMismatch: Error { var detail: String }

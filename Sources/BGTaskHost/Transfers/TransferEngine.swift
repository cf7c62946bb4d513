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
struct TransferAttempt: Sendable {
    var id: String
    var kind: TransferKind
    var url: String
    var method: String
    var headers: [TransferHeader]
    /// No byte (and no connection) for this long ends the attempt (`NSURLErrorTimedOut`, retried).
    var requestTimeout: TimeInterval
    /// `download`: the partial body's file (host-private; created if missing).
    var spool: String?
    /// `download`: the validator of the bytes already in `spool`. With both, the attempt asks for
    /// the rest (`Range: bytes=N-`, `If-Range`); without, it starts from zero.
    var validator: String?
    /// `upload`: the body (the host's copy of the app's file) and its length.
    var body: String?
    var bodyLength: Int64 = 0
    /// `data`, `upload`: the most of the response body kept (more fails the transfer).
    var inlineLimit: Int = TransferLimits.inlineBodyBytes
    /// Progress events at most this often (and the last one at the end).
    var progressInterval: TimeInterval = 0.25
    /// The app whose transfer it is, and the staging its spool writes are charged to (the
    /// app's cap, the host's disk reserve) before they are made. Nil: not charged.
    var app: String = ""
    var staging: StagingLedger?
}

/// What an attempt reports, in order, on any thread: at most one `response`, `progress` at most
/// every `progressInterval`, then exactly one `finished`.
enum TransferAttemptEvent: Sendable {
    /// The response head: the response, the validator worth keeping (a 200 or 206's strong
    /// ETag or Last-Modified), the offset the body continues at (> 0: resumed), and the
    /// expected total (-1: unknown).
    case response(TransferResponse, validator: String?, offset: Int64, expected: Int64)
    case progress(received: Int64, expected: Int64, sent: Int64)
    case finished(TransferAttemptResult)
}

enum TransferAttemptResult: Sendable, Equatable {
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
final class TransferEngine: @unchecked Sendable {
    private let client: HTTPClient
    private let group: any EventLoopGroup
    private let threadPool: NIOThreadPool
    private let logger: Logger
    /// Each spool write waits this long first: for tests, to make a body's parts gather while a
    /// write is out (the batching and its backpressure), as a slow disk would.
    var writeDelayForTests: Duration?
    /// The spool's write buffer of each attempt (`TransferDelegate.maximumBuffered`), smaller in tests.
    var bufferLimitForTests: Int?
    /// Over the attempts that ended: the most body bytes that waited for a write at once, and
    /// how many body parts waited for room (the connection not read meanwhile).
    let writeStatistics = LockedValue((mostBuffered: 0, waitsForRoom: 0))

    init(logger: Logger, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
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
    func shutdown() {
        do { try client.syncShutdown() } catch { logger.debug("transfer client shutdown: \(error)") }
        try? threadPool.syncShutdownGracefully()
    }

    /// Starts an attempt; `report` gets its events (on an event loop or the thread pool).
    func start(_ attempt: TransferAttempt, report: @escaping @Sendable (TransferAttemptEvent) -> Void) -> TransferAttemptHandle {
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
    private static func uploadBody(path: String, length: Int64, pool: NIOThreadPool, loop: any EventLoop) -> HTTPClient.Body {
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
final class TransferAttemptHandle: @unchecked Sendable {
    private let loop: any EventLoop
    private var task: HTTPClient.Task<Void>?
    private var delegate: TransferDelegate?
    private var stopRequested = false

    init(loop: any EventLoop) { self.loop = loop }

    fileprivate func attach(_ task: HTTPClient.Task<Void>, _ delegate: TransferDelegate) {
        self.task = task
        self.delegate = delegate
        if stopRequested { stopNow() }
    }

    /// Ends the attempt; it reports `stopped` (unless it had finished already). Any thread.
    func stop() {
        loop.execute {
            self.stopRequested = true
            self.stopNow()
        }
    }

    private func stopNow() {
        guard let task, let delegate else { return }
        delegate.stopRequested = true
        task.cancel()
    }
}

/// An error reading or writing one of a transfer's files.
struct TransferFileError: Error, CustomStringConvertible {
    var path: String
    var errno: Int32?
    var action: String
    /// The staging bound that stopped it (the app's cap, the host's disk reserve), if one did.
    var refusal: StagingRefusal?
    var description: String {
        if let refusal { return "cannot \(action) (\(path)): \(refusal)" }
        return "cannot \(action) (\(path))" + (errno.map { ": \(String(cString: strerror($0)))" } ?? "")
    }
}

/// A transfer's failure as a thrown error.
struct TransferFailure: Error {
    var error: TransferError
    init(_ error: TransferError) { self.error = error }
}

/// No byte within the request timeout.
private struct IdleTimeout: Error {}
/// A body over the inline limit.
private struct BodyTooLarge: Error {}
/// A range the partial body cannot continue with.
private struct RangeMismatch: Error { var detail: String }

/// One attempt's response handling, confined to its event loop (AsyncHTTPClient calls it there;
/// writes hop to the thread pool and back).
final class TransferDelegate: HTTPClientResponseDelegate, @unchecked Sendable {
    typealias Response = Void

    private let attempt: TransferAttempt
    private let loop: any EventLoop
    private let threadPool: NIOThreadPool
    private let report: @Sendable (TransferAttemptEvent) -> Void
    /// `download`: the spool file, and where the next byte of the body goes.
    private var fd: Int32 = -1
    private(set) var offset: Int64 = 0
    private var expected: Int64 = -1
    private var sent: Int64 = 0
    private var inline: ByteBuffer?
    /// Body bytes received for the spool and not yet handed to a write, from file offset `pendingAt`.
    private var pending = ByteBuffer()
    private var pendingAt: Int64 = 0
    /// The spool's descriptor for the writes: `fd` is -1 once the attempt ended, while the
    /// writes of what it received before may still be out (`end` closes it after them).
    private var spoolFD: Int32 = -1
    private var writing = false
    private var writeFailure: (any Error)?
    /// Body parts waiting for `pending` to have room; ends waiting for the last write.
    private var roomWaiters: [EventLoopPromise<Void>] = []
    private var drainWaiters: [EventLoopPromise<Void>] = []
    private var lastActivity = NIODeadline.now()
    private var lastProgress = NIODeadline.uptimeNanoseconds(0)
    private var idleTimer: Scheduled<Void>?
    private var task: HTTPClient.Task<Void>?
    private var failure: TransferAttemptResult?
    private var ended = false
    var stopRequested = false
    var writeDelay: Duration?
    /// Bytes received and not yet in the spool at most (`maximumBuffered`; smaller in tests).
    var bufferLimit = TransferDelegate.maximumBuffered
    /// The most bytes that waited for a write at once, and how often a body part waited for room.
    private(set) var mostBuffered = 0
    private(set) var waitsForRoom = 0
    var statistics: LockedValue<(mostBuffered: Int, waitsForRoom: Int)>?

    init(_ attempt: TransferAttempt, loop: any EventLoop, threadPool: NIOThreadPool,
         report: @escaping @Sendable (TransferAttemptEvent) -> Void) throws(TransferFailure) {
        self.attempt = attempt
        self.loop = loop
        self.threadPool = threadPool
        self.report = report
        if attempt.kind == .download, let spool = attempt.spool {
            fd = open(spool, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard fd >= 0 else {
                throw TransferFailure(TransferError(code: TransferError.cannotWriteToFileCode, message: TransferFileError(path: spool, errno: errno, action: "open the download's spool file").description))
            }
            spoolFD = fd
            var info = stat()
            if attempt.validator != nil, fstat(fd, &info) == 0, info.st_size > 0 {
                offset = Int64(info.st_size)
            } else {
                ftruncate(fd, 0)
            }
        } else {
            inline = ByteBuffer()
        }
    }

    func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    /// On the loop, once the task exists: arms the idle timer.
    func begin(_ task: HTTPClient.Task<Void>) {
        self.task = task
        lastActivity = .now()
        armIdleTimer()
    }

    private func armIdleTimer() {
        let timeout = TimeAmount.nanoseconds(Int64(min(attempt.requestTimeout, 365 * 86_400) * 1e9))
        idleTimer = loop.scheduleTask(deadline: lastActivity + timeout) { [self] in
            guard !ended else { return }
            if NIODeadline.now() >= lastActivity + timeout {
                failure = .failed(TransferError(code: TransferError.timedOutCode, message: "no byte for \(Self.seconds(attempt.requestTimeout)) (the request timeout)"), retry: true, restart: false)
                task?.fail(reason: IdleTimeout())
            } else {
                armIdleTimer()
            }
        }
    }

    private static func seconds(_ value: TimeInterval) -> String {
        value == value.rounded() ? "\(Int(value)) s" : "\(value) s"
    }

    private func touched() { lastActivity = .now() }

    func didSendRequestPart(task: HTTPClient.Task<Void>, _ part: IOData) {
        touched()
        sent += Int64(part.readableBytes)
        progress(final: false)
    }

    func didReceiveHead(task: HTTPClient.Task<Void>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        touched()
        let status = Int(head.status.code)
        let headers = head.headers.prefix(TransferLimits.headers).map { TransferHeader(name: $0.name, value: String($0.value.prefix(TransferLimits.headerBytes / 4))) }
        let response = TransferResponse(status: status, headers: Array(headers))
        let length = head.headers.first(name: "Content-Length").flatMap { Int64($0) } ?? -1
        var validator: String?
        if status == 200 || status == 206 {
            if let etag = head.headers.first(name: "ETag"), !etag.hasPrefix("W/") {
                validator = etag
            } else if let modified = head.headers.first(name: "Last-Modified") {
                validator = modified
            }
        }
        guard fd >= 0 else {
            expected = length
            report(.response(response, validator: validator, offset: 0, expected: expected))
            return loop.makeSucceededVoidFuture()
        }
        if offset > 0 && status == 206 {
            // Continue where the partial body ends, only if the server continues there too.
            let range = head.headers.first(name: "Content-Range").flatMap(Self.contentRange)
            guard let range, range.start == offset else {
                return restart("the server resumed at \(head.headers.first(name: "Content-Range") ?? "an unnamed range"), not at byte \(offset)")
            }
            expected = range.total ?? (length >= 0 ? offset + length : -1)
            if let refusal = stagingRefusal(forTotal: expected) { return refuse(refusal) }
            // The app asked for the whole resource: what it gets is the whole resource's answer
            // (200, its full length, no Content-Range), however many attempts it took.
            var whole = response
            whole.status = 200
            whole.headers.removeAll { ["content-range", "content-length"].contains($0.name.lowercased()) }
            if expected >= 0 { whole.headers.append(TransferHeader(name: "Content-Length", value: String(expected))) }
            report(.response(whole, validator: validator ?? attempt.validator, offset: offset, expected: expected))
            return loop.makeSucceededVoidFuture()
        }
        if offset > 0 && status == 416 {
            return restart("the server refused the range bytes=\(offset)- (416)")
        }
        // A 200 to a resume (the file changed: If-Range), or any other answer: from zero.
        offset = 0
        expected = length
        if let refusal = stagingRefusal(forTotal: length) { return refuse(refusal) }
        report(.response(response, validator: validator, offset: 0, expected: expected))
        let fd = self.fd
        return threadPool.runIfActive(eventLoop: loop) {
            if ftruncate(fd, 0) != 0 { throw TransferFileError(path: self.attempt.spool ?? "", errno: errno, action: "truncate the spool file") }
        }
    }

    /// A download whose announced length the app's staging cap or the disk reserve has no
    /// room for fails at its head, before a byte is written (charged whole: what it will hold).
    private func stagingRefusal(forTotal total: Int64) -> StagingRefusal? {
        guard let staging = attempt.staging, total > 0 else { return nil }
        var info = stat()
        let have = fstat(fd, &info) == 0 ? Int64(info.st_size) : 0
        return staging.grow(attempt.id, app: attempt.app, to: UInt64(total))
            ?? staging.checkDisk(adding: UInt64(max(0, total - min(have, offset))))
    }

    private func refuse(_ refusal: StagingRefusal) -> EventLoopFuture<Void> {
        failure = .failed(refusal.transferError, retry: false, restart: false)
        return loop.makeFailedFuture(refusal)
    }

    private func restart(_ detail: String) -> EventLoopFuture<Void> {
        failure = .failed(TransferError(code: TransferError.networkConnectionLostCode, message: detail), retry: true, restart: true)
        return loop.makeFailedFuture(RangeMismatch(detail: detail))
    }

    /// `bytes START-END/TOTAL` (TOTAL may be `*`).
    static func contentRange(_ value: String) -> (start: Int64, total: Int64?)? {
        guard value.hasPrefix("bytes ") else { return nil }
        let spec = value.dropFirst(6)
        let parts = spec.split(separator: "/", maxSplits: 1)
        guard let range = parts.first, let dash = range.firstIndex(of: "-"), let start = Int64(range[..<dash]) else { return nil }
        let total = parts.count == 2 ? Int64(parts[1]) : nil
        return (start, total)
    }

    func didReceiveBodyPart(task: HTTPClient.Task<Void>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
        touched()
        guard fd >= 0 else {
            if (inline?.readableBytes ?? 0) + buffer.readableBytes > attempt.inlineLimit {
                failure = .failed(TransferError(code: -1103, message: "the response body is over \(attempt.inlineLimit) bytes, the most a background \(attempt.kind.rawValue) task carries back (use a download task)"), retry: false, restart: false)
                return loop.makeFailedFuture(BodyTooLarge())
            }
            var copy = buffer
            inline?.writeBuffer(&copy)
            offset += Int64(buffer.readableBytes)
            progress(final: false)
            return loop.makeSucceededVoidFuture()
        }
        // Into the spool through `pending`: while a write is out on the thread pool, parts
        // gather here and go in the next write, one hop for many parts; the network is read
        // meanwhile, until `maximumBuffered` bytes wait.
        if let writeFailure { return loop.makeFailedFuture(writeFailure) }
        if pending.readableBytes == 0 { pendingAt = offset }
        var part = buffer
        pending.writeBuffer(&part)
        offset += Int64(buffer.readableBytes)
        progress(final: false)
        mostBuffered = max(mostBuffered, pending.readableBytes)
        flush()
        guard pending.readableBytes >= bufferLimit else { return loop.makeSucceededVoidFuture() }
        waitsForRoom += 1
        let room = loop.makePromise(of: Void.self)
        roomWaiters.append(room)
        return room.futureResult
    }

    /// Bytes of the body received and not yet in the spool at most, before the next body part
    /// waits (the connection is not read meanwhile). 8 MiB was no faster and held 58 MiB at
    /// the peak of a 1 GiB download (BENCHMARKS.md).
    static let maximumBuffered = 2 << 20

    /// On the loop: starts the write of what `pending` holds unless one is out.
    private func flush() {
        guard !writing, pending.readableBytes > 0, writeFailure == nil else { return }
        writing = true
        let (buffer, at, fd, path, delay) = (pending, pendingAt, spoolFD, attempt.spool ?? "", writeDelay)
        let (staging, id, app) = (attempt.staging, attempt.id, attempt.app)
        pending = ByteBuffer()
        pending.reserveCapacity(buffer.readableBytes)
        let write = threadPool.runIfActive(eventLoop: loop) {
            if let delay { Thread.sleep(forTimeInterval: delay.timeInterval) }
            // Charged before it is written: past the app's staging cap, or into the host's
            // disk reserve, the download fails (not the host, not the disk).
            if let staging {
                let end = UInt64(at) + UInt64(buffer.readableBytes)
                var info = stat()
                let size = fstat(fd, &info) == 0 ? UInt64(max(0, info.st_size)) : 0
                if let refusal = staging.grow(id, app: app, to: end)
                    ?? staging.checkDisk(adding: end > size ? end - size : 0) { throw refusal }
            }
            try buffer.withUnsafeReadableBytes { bytes in
                var done = 0
                while done < bytes.count {
                    let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(at) + off_t(done))
                    if n < 0 {
                        if errno == EINTR { continue }
                        throw TransferFileError(path: path, errno: errno, action: "write the download's spool file")
                    }
                    done += n
                }
            }
        }
        write.whenComplete { [self] result in
            writing = false
            if case let .failure(error) = result { writeFailure = error }
            flush()
            if writeFailure != nil || pending.readableBytes < bufferLimit {
                let waiting = roomWaiters
                roomWaiters = []
                for room in waiting {
                    if let writeFailure { room.fail(writeFailure) } else { room.succeed(()) }
                }
            }
            if !writing {
                let waiting = drainWaiters
                drainWaiters = []
                for drained in waiting {
                    if let writeFailure { drained.fail(writeFailure) } else { drained.succeed(()) }
                }
            }
        }
    }

    /// On the loop: succeeds once every byte received is in the spool (fails with the write's error).
    private func drained() -> EventLoopFuture<Void> {
        if let writeFailure { return loop.makeFailedFuture(writeFailure) }
        flush()
        guard writing else { return loop.makeSucceededVoidFuture() }
        let promise = loop.makePromise(of: Void.self)
        drainWaiters.append(promise)
        return promise.futureResult
    }

    private func progress(final: Bool) {
        let now = NIODeadline.now()
        guard final || now >= lastProgress + .nanoseconds(Int64(attempt.progressInterval * 1e9)) else { return }
        lastProgress = now
        report(.progress(received: offset, expected: expected, sent: sent))
    }

    func didReceiveError(task: HTTPClient.Task<Void>, _ error: Error) {}

    func didFinishRequest(task: HTTPClient.Task<Void>) throws {}

    /// The task's end (on the loop): once the last write is done, the spool is synced and closed
    /// and the one `finished` event goes out.
    func end(_ result: Result<Void, Error>) {
        guard !ended else { return }
        ended = true
        idleTimer?.cancel()
        statistics?.withLock { [mostBuffered, waitsForRoom] in
            $0 = (max($0.mostBuffered, mostBuffered), $0.waitsForRoom + waitsForRoom)
        }
        let fd = self.fd
        self.fd = -1
        let finish: @Sendable (TransferAttemptResult) -> Void = { [report] outcome in report(.finished(outcome)) }
        let outcome: TransferAttemptResult
        switch result {
        case .success:
            progress(final: true)
            let body = inline.map { Data($0.readableBytesView) }
            outcome = .completed(received: offset, body: fd >= 0 ? nil : body)
        case .failure(let error):
            if stopRequested, failure == nil {
                outcome = .stopped
            } else {
                outcome = failure ?? Self.classify(error)
            }
        }
        guard fd >= 0 else { return finish(outcome) }
        let path = attempt.spool ?? ""
        drained().whenComplete { [threadPool, loop] written in
            threadPool.runIfActive(eventLoop: loop) { () -> TransferAttemptResult in
                defer { Glibc.close(fd) }
                if case .failure(let error) = written, case .completed = outcome {
                    if let refusal = error as? StagingRefusal { return .failed(refusal.transferError, retry: false, restart: false) }
                    return .failed(TransferError(code: TransferError.cannotWriteToFileCode, message: "\(error)"), retry: true, restart: false)
                }
                if case .completed = outcome, fsync(fd) != 0 {
                    return .failed(TransferError(code: TransferError.cannotWriteToFileCode, message: TransferFileError(path: path, errno: errno, action: "sync the spool file").description), retry: true, restart: false)
                }
                return outcome
            }.whenComplete { result in
                switch result {
                case .success(let final): finish(final)
                case .failure:
                    Glibc.close(fd)
                    finish(outcome)
                }
            }
        }
    }

    /// An NSURLError code for what went wrong, and whether another attempt may do better.
    static func classify(_ error: Error) -> TransferAttemptResult {
        let text = String(describing: error)
        func retry(_ code: Int, _ message: String) -> TransferAttemptResult {
            .failed(TransferError(code: code, message: message), retry: true, restart: false)
        }
        if let client = error as? HTTPClientError {
            switch client {
            case .connectTimeout: return retry(TransferError.timedOutCode, "connecting timed out")
            case .readTimeout, .writeTimeout: return retry(TransferError.timedOutCode, "the connection timed out")
            case .remoteConnectionClosed: return retry(TransferError.networkConnectionLostCode, "the server closed the connection before the response ended")
            case .invalidURL, .emptyHost, .emptyScheme:
                return .failed(TransferError(code: -1000, message: "bad URL: \(client)"), retry: false, restart: false)
            case .redirectCycleDetected, .redirectLimitReached:
                return .failed(TransferError(code: -1007, message: "too many redirects (\(client))"), retry: false, restart: false)
            default: break
            }
        }
        if let connection = error as? NIOConnectionError {
            if connection.connectionErrors.isEmpty, connection.dnsAError != nil || connection.dnsAAAAError != nil {
                return retry(-1003, "cannot find host \(connection.host): \(text)")
            }
            return retry(TransferError.cannotConnectToHostCode, "cannot connect to \(connection.host):\(connection.port): \(connection.connectionErrors.map { "\($0.error)" }.first ?? text)")
        }
        if let io = error as? IOError {
            switch io.errnoCode {
            case ECONNREFUSED, EHOSTUNREACH, ENETUNREACH: return retry(TransferError.cannotConnectToHostCode, "cannot connect: \(io)")
            default: return retry(TransferError.networkConnectionLostCode, "the connection was lost: \(io)")
            }
        }
        if let refusal = error as? StagingRefusal {
            return .failed(refusal.transferError, retry: false, restart: false)
        }
        if let file = error as? TransferFileError {
            return .failed(TransferError(code: TransferError.cannotWriteToFileCode, message: file.description), retry: false, restart: false)
        }
        if text.contains("NIOSSL") || text.contains("handshake") || text.contains("certificate") {
            return .failed(TransferError(code: -1200, message: "a secure connection could not be made: \(text)"), retry: false, restart: false)
        }
        return retry(TransferError.networkConnectionLostCode, "the transfer was interrupted: \(text)")
    }
}

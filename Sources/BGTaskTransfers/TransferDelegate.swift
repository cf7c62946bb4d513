import BGTaskControl
import AsyncHTTPClient
import BGTaskModel
import Foundation
import Glibc
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

/// One attempt's response handling, confined to its event loop (AsyncHTTPClient calls it there;
/// writes hop to the thread pool and back).
package final class TransferDelegate: HTTPClientResponseDelegate, @unchecked Sendable {
    package typealias Response = Void

    package let attempt: TransferAttempt
    package let loop: any EventLoop
    package let threadPool: NIOThreadPool
    package let report: @Sendable (TransferAttemptEvent) -> Void
    /// `download`: the spool file, and where the next byte of the body goes.
    package var fd: Int32 = -1
    package private(set) var offset: Int64 = 0
    package var expected: Int64 = -1
    package var sent: Int64 = 0
    package var inline: ByteBuffer?
    /// Body bytes received for the spool and not yet handed to a write, from file offset `pendingAt`.
    package var pending = ByteBuffer()
    package var pendingAt: Int64 = 0
    /// The spool's descriptor for the writes: `fd` is -1 once the attempt ended, while the
    /// writes of what it received before may still be out (`end` closes it after them).
    package var spoolFD: Int32 = -1
    package var writing = false
    package var writeFailure: (any Error)?
    /// Body parts waiting for `pending` to have room; ends waiting for the last write.
    package var roomWaiters: [EventLoopPromise<Void>] = []
    package var drainWaiters: [EventLoopPromise<Void>] = []
    package var lastActivity = NIODeadline.now()
    package var lastProgress = NIODeadline.uptimeNanoseconds(0)
    package var idleTimer: Scheduled<Void>?
    package var task: HTTPClient.Task<Void>?
    package var failure: TransferAttemptResult?
    package var ended = false
    package var stopRequested = false
    package var writeDelay: Duration?
    /// Bytes received and not yet in the spool at most (`maximumBuffered`; smaller in tests).
    package var bufferLimit = TransferDelegate.maximumBuffered
    /// The most bytes that waited for a write at once, and how often a body part waited for room.
    package private(set) var mostBuffered = 0
    package private(set) var waitsForRoom = 0
    package var statistics: LockedValue<(mostBuffered: Int, waitsForRoom: Int)>?

    package init(_ attempt: TransferAttempt, loop: any EventLoop, threadPool: NIOThreadPool,
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

    package func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    /// On the loop, once the task exists: arms the idle timer.
    package func begin(_ task: HTTPClient.Task<Void>) {
        self.task = task
        lastActivity = .now()
        armIdleTimer()
    }

    package func armIdleTimer() {
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

    package static func seconds(_ value: TimeInterval) -> String {
        value == value.rounded() ? "\(Int(value)) s" : "\(value) s"
    }

    package func touched() { lastActivity = .now() }

    package func didSendRequestPart(task: HTTPClient.Task<Void>, _ part: IOData) {
        touched()
        sent += Int64(part.readableBytes)
        progress(final: false)
    }

    package func didReceiveHead(task: HTTPClient.Task<Void>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
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
    package func stagingRefusal(forTotal total: Int64) -> StagingRefusal? {
        guard let staging = attempt.staging, total > 0 else { return nil }
        var info = stat()
        let have = fstat(fd, &info) == 0 ? Int64(info.st_size) : 0
        return staging.grow(attempt.id, app: attempt.app, to: UInt64(total))
            ?? staging.checkDisk(adding: UInt64(max(0, total - min(have, offset))))
    }

    package func refuse(_ refusal: StagingRefusal) -> EventLoopFuture<Void> {
        failure = .failed(refusal.transferError, retry: false, restart: false)
        return loop.makeFailedFuture(refusal)
    }

    package func restart(_ detail: String) -> EventLoopFuture<Void> {
        failure = .failed(TransferError(code: TransferError.networkConnectionLostCode, message: detail), retry: true, restart: true)
        return loop.makeFailedFuture(RangeMismatch(detail: detail))
    }

    /// `bytes START-END/TOTAL` (TOTAL may be `*`).
    package static func contentRange(_ value: String) -> (start: Int64, total: Int64?)? {
        guard value.hasPrefix("bytes ") else { return nil }
        let spec = value.dropFirst(6)
        let parts = spec.split(separator: "/", maxSplits: 1)
        guard let range = parts.first, let dash = range.firstIndex(of: "-"), let start = Int64(range[..<dash]) else { return nil }
        let total = parts.count == 2 ? Int64(parts[1]) : nil
        return (start, total)
    }

    package func didReceiveBodyPart(task: HTTPClient.Task<Void>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
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
    package static let maximumBuffered = 2 << 20

    /// On the loop: starts the write of what `pending` holds unless one is out.
    package func flush() {
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
    package func drained() -> EventLoopFuture<Void> {
        if let writeFailure { return loop.makeFailedFuture(writeFailure) }
        flush()
        guard writing else { return loop.makeSucceededVoidFuture() }
        let promise = loop.makePromise(of: Void.self)
        drainWaiters.append(promise)
        return promise.futureResult
    }

    package func progress(final: Bool) {
        let now = NIODeadline.now()
        guard final || now >= lastProgress + .nanoseconds(Int64(attempt.progressInterval * 1e9)) else { return }
        lastProgress = now
        report(.progress(received: offset, expected: expected, sent: sent))
    }

    package func didReceiveError(task: HTTPClient.Task<Void>, _ error: Error) {}

    package func didFinishRequest(task: HTTPClient.Task<Void>) throws {}

    /// The task's end (on the loop): once the last write is done, the spool is synced and closed
    /// and the one `finished` event goes out.
    package func end(_ result: Result<Void, Error>) {
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
    package static func classify(_ error: Error) -> TransferAttemptResult {
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

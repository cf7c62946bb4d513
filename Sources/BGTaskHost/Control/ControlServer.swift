import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// Who is on the other end of a control connection (SO_PEERCRED).
public struct PeerCredentials: Sendable, Equatable {
    public var pid: pid_t
    public var uid: uid_t
    public var gid: gid_t
}

/// The host's control socket: a Unix stream socket in the state directory with owner-only
/// permissions. Each connection is served on its own thread, at most `limits.maximumConnections`
/// at once: the one over the cap gets a `too-many-connections` error frame and is closed. A peer
/// whose credentials (SO_PEERCRED) are not this process's user gets one error frame and is
/// dropped. A bad frame, or a request not complete by its deadline, ends only its own connection.
public final class ControlServer: @unchecked Sendable {
    /// What one client may hold of the host, as data.
    public struct Limits: Sendable, Equatable {
        /// Connections served at once (each holds a thread); the next one is refused.
        public var maximumConnections = 64
        /// From a request's first byte to its last: a peer that sends slowly is cut off, and
        /// the same bound applies to writing an answer to a peer that reads slowly.
        public var requestTimeout: Duration = .seconds(5)
        /// How long a connection may sit between requests before it is closed.
        public var idleTimeout: Duration = .seconds(30)

        public init() {}
    }

    public typealias Handler = @Sendable (ControlCommand, _ peer: PeerCredentials) -> ControlResponse
    /// Answers several pipelined commands, in order (one response each, in the same order).
    public typealias BatchHandler = @Sendable ([ControlCommand], _ peer: PeerCredentials) -> [ControlResponse]

    public let path: String
    private let listenFD: Int32
    private let handler: Handler
    private let batchHandler: BatchHandler
    private let logger: Logger
    private let lock = NSLock()
    private var stopped = false
    private var acceptThread: Thread?
    private let acceptDone = DispatchSemaphore(value: 0)
    /// Each connection is served on its own thread: a parked one, or a new one (see ParkedThreads).
    static let connectionThreads = ParkedThreads(name: "bgtask.control.connection", maximumIdle: 4)

    /// The uid allowed to connect (default: this process's effective uid).
    public var allowedUID: uid_t = geteuid()

    /// Set before `start()`.
    public var limits = Limits()
    /// Connections being served (behind `lock`).
    private var connections = 0

    /// `batch` answers pipelined requests together; by default each goes to `handler` in turn.
    public init(path: String, logger: Logger, handler: @escaping Handler, batch: BatchHandler? = nil) throws(BGTaskError) {
        self.path = path
        self.handler = handler
        self.batchHandler = batch ?? { requests, peer in requests.map { handler($0, peer) } }
        self.logger = logger
        var address = try unixAddress(path)
        let fd = try syscall("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        // A socket file left by a host that died is stale: nobody listens on it any more.
        unlink(path)
        let oldMask = umask(0o177)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        umask(oldMask)
        guard bound == 0 else {
            let error = errno
            close(fd)
            throw BGTaskError(.system, file: path, errno: error, "cannot bind the control socket")
        }
        chmod(path, 0o600)
        guard listen(fd, 64) == 0 else {
            let error = errno
            close(fd)
            throw BGTaskError(.system, file: path, errno: error, "cannot listen on the control socket")
        }
        listenFD = fd
    }

    public func start() {
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "bgtask.control"
        acceptThread = thread
        thread.start()
    }

    /// Stops accepting; connections in progress finish their current request.
    public func stop() {
        let first = lock.withLock {
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        shutdown(listenFD, Int32(SHUT_RDWR))
        if acceptThread != nil { acceptDone.wait() }
        close(listenFD)
        unlink(path)
    }

    private func acceptLoop() {
        defer { acceptDone.signal() }
        while true {
            let client = bgtask_accept_cloexec(listenFD)
            if client < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                if lock.withLock({ stopped }) { return }
                if errno == EMFILE || errno == ENFILE {
                    logger.error("control socket: out of descriptors; refusing connections for a moment")
                    usleep(50_000)
                    continue
                }
                return
            }
            let admitted = lock.withLock {
                guard connections < limits.maximumConnections else { return false }
                connections += 1
                return true
            }
            guard admitted else {
                refuseOverCap(client)
                continue
            }
            Self.connectionThreads.run { [self] in
                serve(client)
                lock.withLock { connections -= 1 }
            }
        }
    }

    /// Answers a connection over the cap with a named error and closes it, on the accept
    /// thread: the frame is small and the socket new, so the write does not wait (and may not
    /// for long: SO_SNDTIMEO).
    private func refuseOverCap(_ fd: Int32) {
        defer { close(fd) }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let maximum = limits.maximumConnections
        reply(.failure(.tooManyConnections, "the host serves at most \(maximum) control connections at once (bgtask host --max-connections); try again when one closes"), to: fd)
        // One line a second at most, however fast connections come (only this thread counts).
        refusedOverCap += 1
        let now = bgtask_monotonic_ns()
        if now >= lastOverCapWarningNs + 1_000_000_000 {
            logger.warning("control socket: refused connections over the cap", metadata: ["limit": "\(maximum)", "refused": "\(refusedOverCap)"])
            (lastOverCapWarningNs, refusedOverCap) = (now, 0)
        }
    }

    /// Refusals over the cap since the last warning, and when that was (accept thread only).
    private var refusedOverCap = 0
    private var lastOverCapWarningNs: UInt64 = 0

    private func serve(_ fd: Int32) {
        defer { close(fd) }
        var credentials = PeerCredentials(pid: 0, uid: 0, gid: 0)
        guard bgtask_peer_credentials(fd, &credentials.pid, &credentials.uid, &credentials.gid) == 0 else { return }
        // A peer that stops reading its answer does not hold the thread either: each send waits
        // at most this long, and the whole answer has the same deadline (`reply`).
        var timeout = timeval(tv_sec: Int(limits.requestTimeout.components.seconds),
                              tv_usec: Int(limits.requestTimeout.components.attoseconds / 1_000_000_000_000))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        if credentials.uid != allowedUID && credentials.uid != 0 {
            logger.warning("control socket: refused a peer", metadata: ["peer.uid": "\(credentials.uid)", "peer.pid": "\(credentials.pid)"])
            reply(.failure(.permissionDenied, "the host runs as uid \(allowedUID); a peer with uid \(credentials.uid) may not control it"), to: fd)
            return
        }
        // A launch drives nothing but its own app, through its channel: never this socket.
        if let runner = LaunchSupervisor.launchRunner(containing: credentials.pid) {
            logger.warning("control socket: refused a launch's process", metadata: ["peer.pid": "\(credentials.pid)", "child.pid": "\(runner)"])
            reply(.failure(.permissionDenied, "pid \(credentials.pid) belongs to a running launch (runner \(runner)); launches may not use the control socket"), to: fd)
            return
        }
        // An idle peer is closed after `idleTimeout`; a request must be whole within
        // `requestTimeout` of its first byte (SO_RCVTIMEO would restart at every byte).
        var reader = ControlFrameReader(fd: fd, idleTimeout: limits.idleTimeout, requestTimeout: limits.requestTimeout)
        while true {
            let first: Data?
            do {
                first = try reader.next()
            } catch {
                if error.code == .timedOut {
                    reply(.failure(.requestTimeout, "\(error) (bgtask host --request-timeout)"), to: fd)
                } else if error.code != .closed {
                    reply(.failure(.badFrame, "\(error)"), to: fd)
                }
                return
            }
            guard let first else { return }
            // Pipelining: frames the peer sent without waiting for answers are handled together
            // (consecutive submissions share one commit) and answered in order, in one write.
            var payloads = [first]
            var frameError: ControlFrame.FrameError?
            while payloads.count < Self.pipelineDepth {
                do {
                    guard let next = try reader.nextIfReady() else { break }
                    payloads.append(next)
                } catch {
                    frameError = error
                    break
                }
            }
            var commands: [ControlCommand] = []
            var answers: [ControlResponse?] = []
            var close = false
            for payload in payloads {
                switch ControlCodec.decode(payload) {
                case .command(let command):
                    commands.append(command)
                    answers.append(nil)
                case .refused(let failure):
                    answers.append(.failure(failure))
                case .malformed(let failure):
                    answers.append(.failure(failure))
                    close = true
                }
                if close { break }
            }
            var handled = batchHandler(commands, credentials)[...]
            var responses = answers.map { answer in
                answer ?? handled.popFirst() ?? .failure(.internalError, "the host gave no answer")
            }
            if let frameError, !close {
                if frameError.code == .timedOut {
                    responses.append(.failure(.requestTimeout, "\(frameError) (bgtask host --request-timeout)"))
                } else if frameError.code != .closed {
                    responses.append(.failure(.badFrame, "\(frameError)"))
                }
                close = true
            }
            guard reply(responses, to: fd), !close else { return }
        }
    }

    /// `ControlResponse()` as JSONEncoder writes it.
    static let bareOK = Data(#"{"ok":true}"#.utf8)

    /// At most this many pipelined frames are handled together.
    static let pipelineDepth = 256

    @discardableResult
    private func reply(_ response: ControlResponse, to fd: Int32) -> Bool {
        reply([response], to: fd)
    }

    /// Encodes and sends `responses`, one frame each, in one write.
    private func reply(_ responses: [ControlResponse], to fd: Int32) -> Bool {
        let encoder = JSONEncoder.control
        var payloads: [Data] = []
        for response in responses {
            // Most answers (every accepted submission) are a bare `{"ok":true}`.
            if response.isBareOK {
                payloads.append(Self.bareOK)
                continue
            }
            guard var data = try? encoder.encode(response) else { return false }
            if data.count > ControlFrame.maximumPayload {
                let tooLarge = ControlResponse.failure(.tooLarge, "the answer is \(data.count) bytes, over the frame limit of \(ControlFrame.maximumPayload): ask for less (a smaller history limit, or one app)")
                guard let small = try? encoder.encode(tooLarge) else { return false }
                data = small
            }
            payloads.append(data)
        }
        let deadline = bgtask_monotonic_ns() + UInt64(limits.requestTimeout.nanoseconds)
        do { try ControlFrame.write(payloads: payloads, to: fd, deadline: deadline) } catch { return false }
        return true
    }

    static func describe(_ error: Error) -> String {
        switch error {
        case let DecodingError.keyNotFound(key, _): "missing key '\(key.stringValue)'"
        case let DecodingError.typeMismatch(_, context), let DecodingError.valueNotFound(_, context):
            "wrong type at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        case let DecodingError.dataCorrupted(context): context.debugDescription
        default: "\(error)"
        }
    }
}

/// Talks to a host over its control socket: one request, one response.
public struct ControlClient: Sendable {
    public var path: String

    public init(stateDirectory: URL) {
        path = stateDirectory.appendingPathComponent("control.sock").path
    }

    public func send(_ command: ControlCommand) throws(BGTaskError) -> ControlResponse {
        try send([command])[0]
    }

    /// Sends `requests` on one connection, pipelined: `window` frames are written at once and
    /// their answers read after, so the host can handle them together (consecutive submissions
    /// share one commit). One response each, in order.
    public func send(_ commands: [ControlCommand], window: Int = 256) throws(BGTaskError) -> [ControlResponse] {
        let payloads: [Data]
        do { payloads = try commands.map(ControlCodec.encode) } catch {
            throw BGTaskError(.invalidRequest, file: path, "control socket: cannot encode the request: \(error)")
        }
        return try send(payloads: payloads, window: window)
    }

    /// Sends requests as they are on the wire, whatever they hold: for tests of what the host
    /// does with requests no client of this package sends.
    package func send(wire requests: [ControlRequest]) throws(BGTaskError) -> [ControlResponse] {
        let payloads: [Data]
        do { payloads = try requests.map { try JSONEncoder.control.encode($0) } } catch {
            throw BGTaskError(.invalidRequest, file: path, "control socket: cannot encode the request: \(error)")
        }
        return try send(payloads: payloads, window: 256)
    }

    private func send(payloads all: [Data], window: Int) throws(BGTaskError) -> [ControlResponse] {
        var address = try unixAddress(path)
        let fd = try syscall("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        defer { close(fd) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let error = errno
            if error == EACCES || error == EPERM {
                throw BGTaskError(.system, file: path, errno: error, "the control socket belongs to another user; only the host's user may control it")
            }
            throw BGTaskError(.system, file: path, errno: error,
                              "no bgtask host is listening (start one with `bgtask host --state \(URL(fileURLWithPath: path).deletingLastPathComponent().path)`)")
        }
        do {
            let decoder = JSONDecoder.control
            var reader = ControlFrameReader(fd: fd)
            var responses: [ControlResponse] = []
            responses.reserveCapacity(all.count)
            var start = all.startIndex
            while start < all.endIndex {
                let chunk = all[start..<min(all.endIndex, start + max(1, window))]
                do {
                    try ControlFrame.write(payloads: Array(chunk), to: fd)
                } catch {
                    // The host may have answered before reading (a refused peer): read that answer.
                    guard error.code == .closed, let payload = try? reader.next() else { throw error }
                    let refusal = try decoder.decode(ControlResponse.self, from: payload)
                    return responses + all[start...].map { _ in refusal }
                }
                for _ in chunk {
                    guard let payload = try reader.next() else {
                        throw BGTaskError(.system, file: path, "the host closed the connection without answering")
                    }
                    responses.append(payload == ControlServer.bareOK ? ControlResponse() : try decoder.decode(ControlResponse.self, from: payload))
                }
                start = chunk.endIndex
            }
            return responses
        } catch let error as BGTaskError {
            throw error
        } catch {
            throw BGTaskError(.system, file: path, "control socket: \(error)")
        }
    }
}

/// The address of the Unix socket at `path`, which must fit `sun_path`.
func unixAddress(_ path: String) throws(BGTaskError) -> sockaddr_un {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        throw BGTaskError(.invalidRequest, file: path, "the control socket path is too long for a Unix socket (\(bytes.count) bytes, at most 107): use a shorter --state directory")
    }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        raw.copyBytes(from: bytes)
        raw[bytes.count] = 0
    }
    return address
}

extension JSONEncoder {
    /// The control protocol's encoder (a new one each time: an encoder is not thread-safe).
    /// Keys are not sorted: nothing reads the frames but a decoder, and sorting costs.
    static var control: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }
}

extension JSONDecoder {
    static var control: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

extension ControlServer {
    /// A client's word quoted back in an error: its first 64 characters, and how long it was
    /// when longer (a megabyte-long verb must not make the answer a megabyte).
    static func quoted(_ text: String) -> String {
        text.count <= 64 ? text : "\(text.prefix(64))… (\(text.utf8.count) bytes)"
    }
}

import BGTaskControl
import BGTaskLaunch
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims


/// The host's control socket: a Unix stream socket in the state directory with owner-only
/// permissions, served by the host's supervision loops (`SupervisionLoop`), as its launches
/// are: no thread per connection. A connection's frames are read as they arrive and answered
/// in order; the commands themselves run on the control workers (`workers`), since they wait
/// on the host's queue and its store, and a launch by hand waiting for its record holds no
/// thread at all (`ControlVerbs.handle`).
///
/// At most `limits.maximumConnections` connections at once: the one over the cap gets a
/// `too-many-connections` error frame and is closed. A peer whose credentials (SO_PEERCRED)
/// are not this process's user, or that belongs to a running launch, gets one error frame and
/// is dropped. A bad frame, or a request not complete by its deadline, ends only its own
/// connection.
public final class ControlServer: @unchecked Sendable {
    /// What one client may hold of the host, as data.
    public struct Limits: Sendable, Equatable {
        /// Connections served at once; the next one is refused.
        public var maximumConnections = 64
        /// From a request's first byte to its last: a peer that sends slowly is cut off, and
        /// the same bound applies to writing an answer to a peer that reads slowly.
        public var requestTimeout: Duration = .seconds(5)
        /// How long a connection may sit between requests before it is closed.
        public var idleTimeout: Duration = .seconds(30)

        public init() {}
    }

    /// Answers pipelined commands, in order: calls `reply` once with one response each (on any
    /// thread, at once or later).
    public typealias Handler = @Sendable (_ commands: [ControlCommand], _ peer: PeerCredentials,
                                          _ reply: @escaping @Sendable ([ControlResponse]) -> Void) -> Void

    public let path: String
    let listenFD: Int32
    let handler: Handler
    let logger: Logger
    private let lock = NSLock()
    private var stopped = false
    private var listener: ControlListener?
    private let listenerGone = DispatchSemaphore(value: 0)

    /// The threads commands run on: they wait on the host's queue and its store, which a
    /// supervision loop must not.
    static let workers = WorkerPool(name: "bgtask.control", size: 4)

    /// The uid allowed to connect (default: this process's effective uid).
    public var allowedUID: uid_t = geteuid()

    /// Set before `start()`.
    public var limits = Limits()
    /// Connections being served (behind `lock`).
    private var connections = 0

    public init(path: String, logger: Logger, handler: @escaping Handler) throws(BGTaskError) {
        self.path = path
        self.handler = handler
        self.logger = logger
        var address = try unixAddress(path)
        let fd = try syscall("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0) }
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

    /// Starts accepting, on a supervision loop.
    public func start() throws(BGTaskError) {
        guard let loop = SupervisionLoops.all.first else {
            throw BGTaskError(.system, file: path, "the control socket has no supervision loop to serve it (the kernel refused an epoll set or an eventfd)")
        }
        let listener = ControlListener(server: self, loop: loop)
        lock.withLock { self.listener = listener }
        loop.add(listener)
    }

    /// Stops accepting; connections in progress finish their current request.
    public func stop() {
        let (first, listener) = lock.withLock {
            defer { stopped = true }
            return (!stopped, self.listener)
        }
        guard first else { return }
        if let listener {
            listener.loop.execute { listener.loop.refire(listener) }
            listenerGone.wait()
        } else {
            close(listenFD)
        }
        unlink(path)
    }

    var isStopped: Bool { lock.withLock { stopped } }

    /// The listener is out of its loop (its descriptor closed).
    func listenerRetired() { listenerGone.signal() }

    /// Counts a new connection in, unless the cap is reached.
    func admit() -> Bool {
        lock.withLock {
            guard connections < limits.maximumConnections else { return false }
            connections += 1
            return true
        }
    }

    func connectionEnded() { lock.withLock { connections -= 1 } }


    /// At most this many pipelined frames are handled together.
    static let pipelineDepth = 256

    /// `responses` as frames, in order, ready to write.
    static func frames(_ responses: [ControlResponse]) -> Data {
        let encoder = JSONEncoder.control
        var frames = Data()
        for response in responses {
            // Most answers (every accepted submission) are a bare `{"ok":true}`.
            var payload = ControlFrame.bareOK
            if !response.isBareOK {
                payload = (try? encoder.encode(response)) ?? Data(#"{"ok":false,"error":{"code":"internal","message":"the answer could not be encoded"}}"#.utf8)
                if payload.count > ControlFrame.maximumPayload {
                    let tooLarge = ControlResponse.failure(.tooLarge, "the answer is \(payload.count) bytes, over the frame limit of \(ControlFrame.maximumPayload): ask for less (a smaller history limit, or one app)")
                    payload = (try? encoder.encode(tooLarge)) ?? Data()
                }
            }
            frames.append(contentsOf: ControlFrame.header(length: payload.count))
            frames.append(payload)
        }
        return frames
    }

}

/// The control socket's listening descriptor, on a supervision loop: accepts what is waiting
/// each time it is readable, and hands each connection to the loop with the fewest sources.
final class ControlListener: SupervisionLoop.Source, @unchecked Sendable {
    private let server: ControlServer
    let loop: SupervisionLoop
    /// Out of descriptors: accepting pauses until then (the listen queue holds the rest).
    private var pausedUntil: UInt64 = 0
    /// Refusals over the cap since the last warning, and when that was.
    private var refusedOverCap = 0
    private var lastOverCapWarningNs: UInt64 = 0

    init(server: ControlServer, loop: SupervisionLoop) {
        self.server = server
        self.loop = loop
    }

    var descriptors: [(fd: Int32, events: UInt32)] {
        [(server.listenFD, pausedUntil == 0 ? UInt32(BGTASK_EPOLL_IN) : 0)]
    }

    var deadline: UInt64 { pausedUntil == 0 ? .max : pausedUntil }

    func fire(ready: UInt32, now: UInt64) -> Bool {
        if server.isStopped { return false }
        if pausedUntil != 0 {
            guard now >= pausedUntil else { return true }
            pausedUntil = 0
        }
        // A bounded number per turn, so that a flood of connections does not hold the loop.
        for _ in 0..<64 {
            let fd = bgtask_accept_cloexec(server.listenFD)
            if fd < 0 {
                switch errno {
                case EINTR, ECONNABORTED: continue
                case EMFILE, ENFILE:
                    server.logger.error("control socket: out of descriptors; refusing connections for a moment")
                    pausedUntil = now + 50_000_000
                    return true
                default: return true // EAGAIN: none waiting
                }
            }
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            accepted(fd, now: now)
        }
        return true
    }

    private func accepted(_ fd: Int32, now: UInt64) {
        var peer = PeerCredentials(pid: 0, uid: 0, gid: 0)
        guard bgtask_peer_credentials(fd, &peer.pid, &peer.uid, &peer.gid) == 0 else {
            close(fd)
            return
        }
        if peer.uid != server.allowedUID && peer.uid != 0 {
            server.logger.warning("control socket: refused a peer", metadata: ["peer.uid": "\(peer.uid)", "peer.pid": "\(peer.pid)"])
            refuse(fd, .failure(.permissionDenied, "the host runs as uid \(server.allowedUID); a peer with uid \(peer.uid) may not control it"))
            return
        }
        // A launch drives nothing but its own app, through its channel: never this socket.
        if let runner = LaunchSupervisor.launchRunner(containing: peer.pid) {
            server.logger.warning("control socket: refused a launch's process", metadata: ["peer.pid": "\(peer.pid)", "child.pid": "\(runner)"])
            refuse(fd, .failure(.permissionDenied, "pid \(peer.pid) belongs to a running launch (runner \(runner)); launches may not use the control socket"))
            return
        }
        guard server.admit() else {
            let maximum = server.limits.maximumConnections
            refuse(fd, .failure(.tooManyConnections, "the host serves at most \(maximum) control connections at once (bgtask host --max-connections); try again when one closes"))
            // One line a second at most, however fast connections come.
            refusedOverCap += 1
            if now >= lastOverCapWarningNs + 1_000_000_000 {
                server.logger.warning("control socket: refused connections over the cap", metadata: ["limit": "\(maximum)", "refused": "\(refusedOverCap)"])
                (lastOverCapWarningNs, refusedOverCap) = (now, 0)
            }
            return
        }
        // On this loop, at once: its request has most likely arrived with it. (A connection's
        // own work on a loop is a read and a write: the commands run on the control workers.)
        loop.addHere(ControlConnection(fd: fd, peer: peer, server: server, loop: loop, now: now))
    }

    /// One error frame, written without waiting (the socket is new: its buffer has room), then
    /// the connection is closed.
    private func refuse(_ fd: Int32, _ response: ControlResponse) {
        let frames = ControlServer.frames([response])
        _ = frames.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        close(fd)
    }

    func retire() {
        close(server.listenFD)
        server.listenerRetired()
    }
}

/// One control connection on a supervision loop. Its frames are read as they arrive (at most
/// `pipelineDepth` at a time); while their commands run on the control workers it reads no
/// more (a client that floods the socket waits for its answers, and the host holds at most
/// one batch of each connection); the answers are written as the peer takes them. Every wait
/// has a deadline: the next request within the idle timeout, a request whole within the
/// request timeout of its first byte, an answer taken within the request timeout.
final class ControlConnection: SupervisionLoop.Source, @unchecked Sendable {
    private let fd: Int32
    private let peer: PeerCredentials
    private let server: ControlServer
    private let idleNs: UInt64
    private let requestNs: UInt64
    private var reader: ControlFrameReader
    /// Answers not yet written, from `written`.
    private var outbox = Data()
    private var written = 0
    private var writeDeadline: UInt64 = .max
    private var idleDeadline: UInt64
    /// A batch of commands is with the workers.
    private var busy = false
    /// Close once the outbox is written (a bad frame, the peer's end of stream).
    private var closing = false
    /// The peer is gone (a write failed).
    private var gone = false
    /// The loop that serves it.
    private let loop: SupervisionLoop

    init(fd: Int32, peer: PeerCredentials, server: ControlServer, loop: SupervisionLoop, now: UInt64) {
        self.fd = fd
        self.loop = loop
        self.peer = peer
        self.server = server
        idleNs = UInt64(server.limits.idleTimeout.nanoseconds)
        requestNs = UInt64(server.limits.requestTimeout.nanoseconds)
        reader = ControlFrameReader(fd: fd)
        idleDeadline = now + idleNs
    }

    private var writing: Bool { written < outbox.count }

    var descriptors: [(fd: Int32, events: UInt32)] {
        var events: UInt32 = 0
        if !busy && !closing { events |= UInt32(BGTASK_EPOLL_IN) }
        if writing { events |= UInt32(BGTASK_EPOLL_OUT) }
        return [(fd, events)]
    }

    var deadline: UInt64 {
        if writing { return writeDeadline }
        if busy { return .max }
        if let since = reader.partialSinceNs { return since + requestNs }
        return idleDeadline
    }

    func fire(ready: UInt32, now: UInt64) -> Bool {
        if gone { return false }
        if writing {
            guard flush() else { return false }
            if writing {
                // The peer stopped reading: given up at the answer's deadline.
                return now < writeDeadline
            }
        }
        if closing { return false }
        if busy { return true }
        var payloads: [Data] = []
        var frameError: ControlFrame.FrameError?
        var ended = false
        reading: while payloads.count < ControlServer.pipelineDepth {
            do {
                switch try reader.poll() {
                case .frame(let payload): payloads.append(payload)
                case .pending: break reading
                case .ended:
                    ended = true
                    break reading
                }
            } catch {
                frameError = error
                break reading
            }
        }
        // What ends the connection after this batch is answered.
        var last: ControlResponse?
        if let frameError {
            closing = true
            if frameError.code != .closed { last = .failure(.badFrame, "\(frameError)") }
        } else if ended {
            closing = true
        }
        if payloads.isEmpty {
            if !closing {
                if let since = reader.partialSinceNs {
                    guard now >= since + requestNs else { return true }
                    last = .failure(.requestTimeout, "\(reader.requestTimedOut(server.limits.requestTimeout)) (bgtask host --request-timeout)")
                    closing = true
                } else {
                    // An idle peer is closed without a word, as before a request.
                    return now < idleDeadline
                }
            }
            guard let last else { return false }
            queue([last], now: now)
            return flush() && writing
        }
        idleDeadline = now + idleNs
        var commands: [ControlCommand] = []
        var answers: [ControlResponse?] = []
        decoding: for payload in payloads {
            switch ControlCodec.decode(payload) {
            case .command(let command):
                commands.append(command)
                answers.append(nil)
            case .refused(let failure):
                answers.append(.failure(failure))
            case .malformed(let failure):
                // Not a request at all: answered, and nothing after it is trusted.
                answers.append(.failure(failure))
                (closing, last) = (true, nil)
                break decoding
            }
        }
        busy = true
        let (loop, server, finalAnswer, fd) = (self.loop, self.server, last, self.fd)
        let decoded = answers
        let finish: @Sendable ([ControlResponse]) -> Void = { [self] handled in
            var handled = handled[...]
            var responses = decoded.map { $0 ?? handled.popFirst() ?? .failure(.internalError, "the host gave no answer") }
            if let finalAnswer { responses.append(finalAnswer) }
            // Written here, on the thread that has them, as far as the peer takes them now: the
            // answer does not wait for the loop's next turn. While `busy` the loop does not
            // touch the socket (it watches nothing of it), so this thread owns it.
            let frames = ControlServer.frames(responses)
            let sent = ControlConnection.send(frames, from: 0, to: fd)
            loop.execute { [self] in
                busy = false
                if let sent {
                    if sent < frames.count { queue(frames, from: sent, now: bgtask_monotonic_ns()) }
                    loop.refire(self)
                } else {
                    gone = true
                    loop.refire(self)
                }
            }
        }
        if commands.isEmpty {
            finish([])
        } else {
            let (peer, batch) = (self.peer, commands)
            ControlServer.workers.run { server.handler(batch, peer, finish) }
        }
        return true
    }

    /// Adds answers to the outbox; the peer has the request timeout to take them.
    private func queue(_ responses: [ControlResponse], now: UInt64) {
        queue(ControlServer.frames(responses), from: 0, now: now)
    }

    private func queue(_ frames: Data, from offset: Int, now: UInt64) {
        if !writing { (outbox, written) = (Data(), 0) }
        outbox.append(frames[(frames.startIndex + offset)...])
        writeDeadline = now + requestNs
    }

    /// Writes what the peer takes now; false when it is gone.
    private func flush() -> Bool {
        guard let sent = Self.send(outbox, from: written, to: fd) else { return false }
        written = sent
        return true
    }

    /// Sends `data` from `offset` without waiting: how far it got, or nil when the peer is gone.
    static func send(_ data: Data, from offset: Int, to fd: Int32) -> Int? {
        var offset = offset
        while offset < data.count {
            let sent = data.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if sent > 0 {
                offset += sent
                continue
            }
            let error = errno
            if sent < 0 && error == EINTR { continue }
            return sent < 0 && (error == EAGAIN || error == EWOULDBLOCK) ? offset : nil
        }
        return offset
    }

    func retire() {
        close(fd)
        server.connectionEnded()
    }
}


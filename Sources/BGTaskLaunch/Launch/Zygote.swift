import BGTaskControl
import BGTaskSystem
import BGTaskModel
import BGTaskWire
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// The fast launch path: a pre-warmed, single-threaded `bgtask-runner --zygote` that hands each
/// launch a child it forked in advance (a spare; see ZygoteServer) or forks one (with CLONE_PARENT, so the child is this process's own: waitable, with
/// rusage and a pidfd, exactly like a spawned runner). A launch then costs a fork and a
/// descriptor handoff instead of an exec, dynamic linking and a Swift runtime start-up.
///
/// Started on first use, restarted once if it died; if it cannot start (or is not
/// single-threaded), `launch` throws and the supervisor falls back to posix_spawn. Thread-safe:
/// requests are serialized.
public final class Zygote: @unchecked Sendable {
    public let runnerPath: String
    private let logger: Logger
    private let lock = NSLock()
    private var socket: Int32 = -1
    private var pid: pid_t = 0

    /// Whether its launches are confined (each in a PID namespace of its own): false for a host
    /// run with --no-sandbox. Read when the zygote starts.
    public let confine: Bool

    public init(runnerPath: String, logger: Logger, confine: Bool = true) {
        self.runnerPath = runnerPath
        self.logger = logger
        self.confine = confine
    }

    deinit { stop() }

    /// Forks a runner child with `channel` as fd 3, `stdin` as 0, `log` as 1 and 2, and
    /// `environment` over the zygote's own (the host's, at zygote start). Returns its pid.
    ///
    /// The launch goes straight to the spare this process holds (through the spare's socket,
    /// which the zygote handed over with it): no hop through the zygote on the way to the
    /// handler. The zygote is then asked for the next spare, and its answer is read when the
    /// next launch comes (the fork is off this launch's path, and off its supervisor's). Without
    /// a spare, or with one that died, the launch goes to the zygote, which forks it.
    public func launch(channel: Int32, stdin: Int32, log: Int32, environment: [String: String]) throws(BGTaskError) -> pid_t {
        var writer = WireWriter()
        ZygoteRequest(environment: environment).write(to: &writer)
        let payload = writer.bytes
        let fds = [channel, stdin, log]
        lock.lock()
        defer { lock.unlock() }
        // Two tries: a spare that died is replaced by the next one.
        for _ in 0..<2 {
            if spareRequested { collectSpareLocked() }
            if socket < 0 { try? startLocked() }
            guard spareSocket >= 0 else { break }
            let (child, target) = (sparePID, spareSocket)
            (sparePID, spareSocket) = (0, -1)
            let sent = payload.withUnsafeBytes { raw in
                fds.withUnsafeBufferPointer { bgtask_send_fds(target, $0.baseAddress, 3, raw.baseAddress, raw.count) }
            }
            close(target)
            // A launch now, not a spare (one that died stays counted, to be reaped).
            if sent == 0 { spares.remove(child) }
            requestSpareLocked()
            if sent == 0 {
                reapSpares(waiting: false)
                return child
            }
        }
        do {
            for attempt in 0..<2 {
                if socket < 0 { try startLocked() }
                let sent = payload.withUnsafeBytes { raw in
                    fds.withUnsafeBufferPointer { bgtask_send_fds(socket, $0.baseAddress, 3, raw.baseAddress, raw.count) }
                }
                switch sent == 0 ? readAnswer() : nil {
                case let .launched(child, _)?:
                    // (The next spare, which came with it, is held by `readAnswer`.)
                    spares.remove(child)
                    reapSpares(waiting: false)
                    return child
                case let .failed(reason)?:
                    throw BGTaskError(.launch, file: runnerPath, "the zygote could not fork: \(reason)")
                case .ready?, .spare?:
                    logger.warning("the zygote answered out of turn; restarting it", metadata: ["attempt": "\(attempt + 1)"])
                case nil:
                    logger.warning("the zygote is gone or did not answer; restarting it", metadata: ["attempt": "\(attempt + 1)"])
                }
                stopLocked(kill: true)
            }
        }
        throw BGTaskError(.launch, file: runnerPath, "the zygote keeps dying")
    }

    /// The spare request's answer if it has come (without waiting): what this process's
    /// children are is then known as soon as it can be (`processes`).
    private func collectSpareIfReadyLocked() {
        guard spareRequested, socket >= 0 else { return }
        var poller = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        if bgtask_poll_ns(&poller, 1, 0) > 0 { collectSpareLocked() }
    }

    /// Asks the zygote for the next spare; its answer is read by the next launch. A zygote that
    /// cannot be written to is replaced then.
    private func requestSpareLocked() {
        guard socket >= 0 else { return }
        var request = WireWriter()
        ZygoteSpareRequest().write(to: &request)
        spareRequested = request.bytes.withUnsafeBytes { send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } > 0
        if !spareRequested { stopLocked(kill: true) }
    }

    /// The answer to the spare request sent after the last launch: the next spare, held for the
    /// next launch. A zygote that does not give it is replaced (the launch waiting here then
    /// goes to the new zygote's first spare).
    private func collectSpareLocked() {
        spareRequested = false
        switch readAnswer() {
        case .spare?: break // held by readAnswer
        case let other:
            logger.warning("the zygote did not answer the spare request; restarting it", metadata: ["answer": "\(String(describing: other))"])
            stopLocked(kill: true)
        }
    }

    /// Ends the zygote (it exits when its socket closes) and reaps it.
    public func stop() {
        lock.withLock { stopLocked() }
    }

    private func startLocked() throws(BGTaskError) {
        var fds: [Int32] = [-1, -1]
        let kind = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        try syscall("socketpair") { socketpair(AF_UNIX, kind, 0, &fds) }
        defer { close(fds[1]) }
        let null = try syscall("open /dev/null") { open("/dev/null", O_RDWR | O_CLOEXEC) }
        defer { close(null) }
        var environment = ProcessInfo.processInfo.environment
        environment["BGTASK_LAUNCH_ID"] = nil
        // Every symbol bound once, in the zygote, instead of lazily in each child: a lazy
        // binding in a child costs a symbol lookup and a copy-on-write fault of its GOT page,
        // launch after launch. The zygote removes the variable from its environment at once,
        // so launches and what they start do not inherit it.
        environment["LD_BIND_NOW"] = "1"
        // Room for each launch's container paths where CoreFoundation reads them (see
        // AppContainer.snapshottedVariables): a child writes its own into these bytes.
        for key in AppContainer.snapshottedVariables { environment[key] = AppContainer.reservedValue }
        if !confine { environment[AppContainer.pidNamespaceSwitch] = "off" }
        environment[AppContainer.zygoteConfinesSwitch] = confine ? "1" : nil
        let child: pid_t
        // The zygote's own output goes nowhere (its stderr is this process's); each launch's
        // goes to its log.
        do {
            child = try Subprocess.spawn([runnerPath, "--zygote"], environment: environment,
                                         stdin: null, stdout: null, stderr: 2, descriptor3: fds[1])
        } catch {
            close(fds[0])
            throw BGTaskError(.launch, file: runnerPath, errno: error.errno, "cannot spawn the zygote")
        }
        socket = fds[0]
        pid = child
        guard case let .ready(threads, _)? = readAnswer(timeout: answerTimeout * 3) else {
            stopLocked(kill: true)
            throw BGTaskError(.launch, file: runnerPath, "the zygote did not report ready")
        }
        guard threads == 1 else {
            stopLocked()
            throw BGTaskError(.launch, file: runnerPath, "the zygote has \(threads) threads; forking it would not be safe")
        }
        logger.debug("zygote started", metadata: ["zygote.pid": "\(child)"])
    }

    /// How long the zygote has to answer a request (it hands it to its spare, or forks:
    /// milliseconds at worst on a loaded machine; its `ready` gets three times as long). One
    /// that does not is killed and replaced. Set before the first launch.
    public var answerTimeout: Duration = .seconds(10)

    /// The zygote's next answer; nil when it is gone, said something unreadable, or did not
    /// answer within `timeout`. The spare an answer names is counted among this process's
    /// spares, and its socket (which comes with the answer) held for the next launch.
    private func readAnswer(timeout: Duration? = nil) -> ZygoteAnswer? {
        var poller = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        let deadline = bgtask_monotonic_ns() + UInt64((timeout ?? answerTimeout).nanoseconds)
        while true {
            let now = bgtask_monotonic_ns()
            guard now < deadline else { return nil }
            let ready = bgtask_poll_ns(&poller, 1, Int64(deadline - now))
            if ready > 0 { break }
            if ready < 0 && errno != EINTR { return nil }
        }
        var buffer = [UInt8](repeating: 0, count: 512)
        var received: [Int32] = [-1, -1]
        var count: Int32 = 2
        let n = buffer.withUnsafeMutableBytes { bgtask_recv_fds(socket, &received, &count, $0.baseAddress, $0.count) }
        let descriptors = Array(received.prefix(Int(max(0, count))))
        guard n > 0 else {
            descriptors.forEach { close($0) }
            return nil
        }
        let answer: ZygoteAnswer
        do {
            answer = try LaunchChannel.decode(ZygoteAnswer.self, from: Array(buffer[0..<n]))
        } catch {
            descriptors.forEach { close($0) }
            logger.warning("unreadable answer from the zygote", metadata: ["error": "\(error)"])
            return nil
        }
        let spare: Int32
        switch answer {
        case let .ready(_, named), let .launched(_, named), let .spare(named): spare = named
        case .failed: spare = 0
        }
        if spare > 0 { spares.insert(spare) }
        if spare > 0, descriptors.count == 1 {
            if spareSocket >= 0 { close(spareSocket) }
            (sparePID, spareSocket) = (spare, descriptors[0])
        } else {
            // A spare without its socket cannot be used (it exits when the zygote does).
            descriptors.forEach { close($0) }
        }
        return answer
    }

    /// Ends the zygote: it exits when its socket closes; `kill`: one that stopped answering is
    /// killed first (it may never read its socket again).
    private func stopLocked(kill killFirst: Bool = false) {
        // A spare forked for a request whose answer was not read yet: learned now (briefly, for
        // a zygote being killed), so that it is reaped below with the others.
        if spareRequested && socket >= 0 {
            _ = readAnswer(timeout: killFirst ? .milliseconds(1) : answerTimeout)
        }
        if socket >= 0 {
            close(socket)
            socket = -1
        }
        // The spare held here sees its socket's end and exits.
        if spareSocket >= 0 {
            close(spareSocket)
            (sparePID, spareSocket) = (0, -1)
        }
        spareRequested = false
        if killFirst && pid > 0 { kill(pid, SIGKILL) }
        if pid > 0 {
            var status: Int32 = 0
            _ = bgtask_wait4(pid, &status, 0, nil)
            pid = 0
        }
        // With the zygote gone, its spares see end of stream and exit: they are this
        // process's children (CLONE_PARENT), so they are reaped here.
        reapSpares(waiting: true)
    }

    /// Spares the zygote forked (this process's children) that have not become launches.
    private var spares = Set<pid_t>()
    /// The spare the next launch goes to, and its socket (-1: none held).
    private var sparePID: pid_t = 0
    private var spareSocket: Int32 = -1
    /// A spare request was sent after the last launch and its answer not read yet.
    private var spareRequested = false

    /// The zygote and its spares: this process's children that are not launches (yet).
    package var processes: Set<pid_t> {
        lock.withLock {
            collectSpareIfReadyLocked()
            return pid > 0 ? spares.union([pid]) : spares
        }
    }

    /// The zygote's pid (0 when not running) and its spares' (for tests).
    package var processID: pid_t { lock.withLock { pid } }
    package var spareIDs: Set<pid_t> {
        lock.withLock {
            collectSpareIfReadyLocked()
            return spares
        }
    }

    /// Reaps spares that have exited (a spare that died before its launch, or every spare once
    /// the zygote is gone and `waiting`).
    private func reapSpares(waiting: Bool) {
        for spare in spares {
            var status: Int32 = 0
            if bgtask_wait4(spare, &status, waiting ? 0 : WNOHANG, nil) != 0 { spares.remove(spare) }
        }
    }
}

import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation
import Glibc
import _BGTaskSystemShims

/// `bgtask-runner --zygote`: a launcher the host starts once and asks for one child per launch,
/// so a launch costs a hand-off instead of an exec and a Swift runtime start-up.
///
/// Protocol on fd 3 (SOCK_SEQPACKET; `ZygoteRequest`, `ZygoteSpareRequest` and `ZygoteAnswer`
/// in the wire module): the zygote first answers `ready` (its thread count, which the host
/// requires to be 1, and its first spare, with the spare's socket). A launch is the launch's
/// environment overrides with three descriptors (SCM_RIGHTS): the launch channel, stdin, and the
/// log for stdout and stderr. The host hands it to the spare it holds, through the spare's own
/// socket, without the zygote; then asks the zygote for the next spare (`ZygoteSpareRequest`,
/// answered `spare`, with its socket). A launch sent to the zygote itself (the host had no
/// spare, or it died) is forked directly, answered `launched` (its process and the next spare,
/// with its socket) or `failed`. The spare decodes a launch's bytes as the host sent them. End
/// of stream: the host is gone, and so is the zygote; a spare sees its own socket's end when
/// the host is gone.
///
/// A spare is a child forked *before* it is needed (like Android's unspecialized app process
/// pool): it has already reset its signals, made its process group and installed the launch's
/// system-call filter, and waits on a socket of its own. A launch hands it the launch's
/// descriptors and environment, so the launch starts at once. The zygote keeps no spare: each
/// goes to the host with its socket, and a launch is not held up by a hop through the zygote
/// (it used to pass every launch to its spare itself: two wake-ups more on the way to the
/// handler).
///
/// The zygote must stay single-threaded: nothing here may start a thread (no Dispatch queues,
/// no Foundation run loops). Children are forked with CLONE_PARENT, so the host is their parent
/// (it waits for them, and gets their rusage and a pidfd); a child returns from `serve()` and
/// becomes an ordinary runner. Where it may (root), each child is a launch's PID namespace
/// (namespace.c): the host's child is its outer process, which ends as the launch ends, and
/// what returns from `serve()` is pid 2 of the namespace.
///
/// After fork (docs/isolation.md, "After fork"): the zygote is single-threaded when it forks (the
/// host refuses a zygote whose `ready` reports more than one thread; `bgtask_clone_parent` and
/// `bgtask_clone_parent_namespaced` refuse a process glibc says has had a second thread), so its
/// child is an ordinary process from the moment the clone returns 0: the Swift below may
/// allocate, lock and start threads there. Only namespace.c's outer and init processes, which
/// share the zygote's memory, are held to raw system calls. Each function a child runs says so.
enum ZygoteServer {
    static let control: Int32 = 3

    /// A request: the environment overrides and the three descriptors.
    private struct Request {
        var payload: [UInt8]
        var fds: [Int32]
    }

    /// Async-signal-safe: no — allocates and talks to the host; runs in the single-threaded
    /// zygote, and its children (ordinary processes) return through it to main.swift.
    static func serve() {
        unsetenv("LD_BIND_NOW") // set by the host for the zygote alone (see Zygote)
        Sandbox.spareFilters = getenv(AppContainer.zygoteConfinesSwitch).map { String(cString: $0) == "1" } == true
            && !Sandbox.layersSwitchedOff().contains("seccomp")
        unsetenv(AppContainer.zygoteConfinesSwitch)
        warmUp()
        // The zygote changes no signal action from here on: each fork resets only the ones
        // that are not at their default now (a handful, instead of 62 sigaction calls).
        bgtask_note_signal_actions()
        let threads = bgtask_thread_count()
        switch forkSpare() {
        case .becameLaunch: return
        case let .forked(spare): answer(control, .ready(threads: threads, spare: spare.pid), handing: spare)
        case .failed: answer(control, .ready(threads: threads, spare: 0))
        }
        while true {
            guard let request = receiveRequest(on: control) else { _exit(0) }
            if request.fds.isEmpty, (try? LaunchChannel.decode(ZygoteSpareRequest.self, from: request.payload)) != nil {
                switch forkSpare() {
                case .becameLaunch: return
                case let .forked(spare): answer(control, .spare(pid: spare.pid), handing: spare)
                case .failed: answer(control, .spare(pid: 0))
                }
                continue
            }
            guard request.fds.count == 3 else {
                for fd in request.fds { close(fd) }
                answer(control, .failed("expected 3 descriptors, got \(request.fds.count)"))
                continue
            }
            // The host had no spare (none could be forked, or it died): the launch directly.
            let launched = cloneLaunch()
            if launched == 0 {
                becomeLaunch(request)
                return
            }
            for fd in request.fds { close(fd) }
            guard launched > 0 else {
                answer(control, .failed("clone: \(String(cString: strerror(errno)))"))
                continue
            }
            // And a spare for the next launch, reported with it (the host reaps spares that die
            // unused).
            switch forkSpare() {
            case .becameLaunch: return
            case let .forked(spare): answer(control, .launched(pid: launched, spare: spare.pid), handing: spare)
            case .failed: answer(control, .launched(pid: launched, spare: 0))
            }
        }
    }

    private struct Spare {
        var pid: pid_t
        /// The zygote's end of the socket the spare waits on.
        var socket: Int32
    }

    private enum Forked {
        case forked(Spare)
        case failed
        /// In the spare, once a request arrived: return to main and run the launch.
        case becameLaunch
    }

    /// Forks a spare that prepares itself and waits for a request on its own socket.
    /// Async-signal-safe: no — the spare's side rehearses (allocation, a thread, Dispatch); it is
    /// a fork of the single-threaded zygote, an ordinary process once `cloneLaunch` returns 0.
    private static func forkSpare() -> Forked {
        var pair: [Int32] = [-1, -1]
        let kind = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, kind, 0, &pair) == 0 else { return .failed }
        // Not at idle priority (SCHED_IDLE): on a busy machine an idle-priority fork or
        // rehearsal starves, and the launch that comes for its spare (and the host waiting for
        // the zygote's answer) would wait with it.
        let pid = cloneLaunch()
        if pid < 0 {
            close(pair[0])
            close(pair[1])
            return .failed
        }
        if pid > 0 {
            close(pair[1])
            return .forked(Spare(pid: pid, socket: pair[0]))
        }
        // The spare. Not the zygote's control socket (/dev/null in its place): only the zygote
        // talks to the host, and the host must see end of stream when the zygote dies.
        close(pair[0])
        dup2(STDIN_FILENO, control)
        // Nothing else of the zygote's: the two pidfds it keeps for every launch it started
        // that still runs (thousands, at scale), another spare's socket. `becomeLaunch` would
        // close them anyway; closed now, the rehearsal runs with the launch's own few, and
        // finding what the main run loop makes costs a look at a handful (listing 2,000
        // inherited descriptors twice per spare was a tenth of the machine's CPU while 1,000
        // launches started).
        let socket = [pair[1]]
        bgtask_close_from_except(4, socket, 1)
        rehearse()
        if Sandbox.spareFilters { Sandbox.installFilterInSpare() }
        // The pages the launch writes first, copied now (copy-on-write of the zygote's) instead
        // of on its way to the handler: its process title and container paths are written into
        // the argument and environment strings (five faults, about 25 µs, before this).
        bgtask_prefault_arguments_and_environment(CommandLine.unsafeArgv, CommandLine.argc)
        // End of stream: the zygote is gone (its host too), or it handed the launch elsewhere.
        guard let request = receiveRequest(on: pair[1]), request.fds.count == 3 else { _exit(0) }
        close(pair[1])
        becomeLaunch(request)
        return .becameLaunch
    }

    /// One request from `socket` (its payload and the descriptors that came with it, at most
    /// three); nil at end of stream or on an error.
    /// Async-signal-safe: no — allocates the request's arrays; the zygote and its spares.
    private static func receiveRequest(on socket: Int32) -> Request? {
        var fds: [Int32] = [-1, -1, -1]
        var count: Int32 = 3
        var received: Int
        repeat {
            received = bgtask_recv_fds(socket, &fds, &count, requestBuffer.baseAddress, requestBuffer.count)
        } while received < 0 && errno == EINTR
        guard received > 0 else { return nil }
        return Request(payload: Array(requestBuffer[0..<received]), fds: Array(fds.prefix(Int(count))))
    }

    /// Where requests are received, allocated once and never zeroed: a request is a few hundred
    /// bytes, and a fresh zeroed 64 KiB buffer per request cost the zygote and each spare 15
    /// page faults (the heap is trimmed between requests; a spare's pages are fresh).
    nonisolated(unsafe) private static let requestBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)

    /// A dry run, in a spare, of what a launch does before its handler runs: its side of the
    /// channel (a start decoded, its messages encoded; not sent: a dozen system calls would only
    /// fault in a few pages of code), the host's request decoded (four copy-on-write faults of
    /// the runtime's and the allocator's pages otherwise taken by the launch), a thread (the
    /// launch's parent reader) and the dynamic linker's reads. A fresh fork pays for each page
    /// it first touches (copy-on-write, or a library page it has not mapped yet); paid here,
    /// while the spare waits, it is off the launch's critical path. Only the launch's own side:
    /// the parent's half (encoding the start, decoding the child's messages) would fault pages
    /// no launch touches, and spares cost CPU that concurrent launches need. No Dispatch queue:
    /// a launch uses one only for expiration, and its worker thread would be one more thread for
    /// every launch to end.
    /// Async-signal-safe: no — starts a thread and uses Dispatch; the spare is an ordinary process
    /// and forks nothing afterwards (its thread makes it unforkable by `bgtask_clone_parent`).
    private static func rehearse() {
        exerciseChildSide(startPacket, send: nil)
        _ = try? LaunchChannel.decode(ZygoteRequest.self, from: requestPacket)
        let done = DispatchSemaphore(value: 0)
        startThread { done.signal() }
        done.wait()
        rehearseSymbolLookups()
        rehearseMainThread()
        // The system's part of the launch's Landlock ruleset (a score of rules, each an open and
        // a system call): made while the spare waits, the launch adds its bundle and containers.
        Sandbox.prepareRuleset()
    }

    /// The app's main thread, made ready in the spare, which becomes the launch's process: the
    /// main run loop and the main dispatch queue's port exist and have run once. Made by the
    /// first launch handler, they cost a fresh fork 350-400 µs of page faults (CoreFoundation's
    /// run loop, libdispatch's main queue) on the way to the handler. Their descriptors (an
    /// epoll set, eventfds, a timerfd) are the spare's own and survive `becomeLaunch`. Nothing
    /// else is touched: not Bundle.main, not a global queue (no thread is started).
    /// Async-signal-safe: no — the main queue and run loop; the spare, an ordinary process.
    private static func rehearseMainThread() {
        let existing = Set(openDescriptors())
        DispatchQueue.main.async {}
        _ = RunLoop.main.run(mode: .default, before: Date())
        mainThreadDescriptors = openDescriptors().filter { !existing.contains($0) }
    }

    /// Every open descriptor from 4 up, ascending, however many: a zygote supervising a
    /// thousand launches holds two pidfds for each, and its spare inherits them, so the run
    /// loop's own land far above them. (Looking below 256 only, with room for 64, missed them
    /// with a few dozen launches running: `becomeLaunch` closed the run loop's epoll set and
    /// every later launch's main thread spun in `RunLoop.run`, a core's worth of CPU each.)
    /// Async-signal-safe: no — allocates; the spare, an ordinary process.
    static func openDescriptors() -> [Int32] {
        var capacity = 256
        while true {
            var found = [Int32](repeating: -1, count: capacity)
            let count = Int(bgtask_open_descriptors(4, Int32.max, &found, Int32(capacity)))
            if count <= capacity { return Array(found.prefix(count)) }
            capacity = count + 64
        }
    }

    /// Descriptors the main thread's rehearsal made (ascending): kept by `becomeLaunch`.
    nonisolated(unsafe) private static var mainThreadDescriptors: [Int32] = []

    /// What the dynamic linker reads when the launch dlopens its plugin, read once here: the
    /// name of every loaded library (each of the plugin's DT_NEEDED entries is matched against
    /// all of them; libc comes late in the list) and the hash tables a lookup walks through the
    /// whole global scope (the weak symbols every shared object asks for are found nowhere and
    /// walk all of it; the others are what every SwiftPM-built plugin and most C ones import).
    /// A fresh fork maps none of the libraries' read-only pages it reads: each first read is a
    /// page fault, 43 of them in a no-op launch's dlopen before this rehearsal.
    /// Async-signal-safe: no — dlopen and dlsym take the loader's lock; the spare, an ordinary
    /// process.
    private static func rehearseSymbolLookups() {
        if let libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD) { dlclose(libc) }
        for name in rehearsedSymbols { _ = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) }
    }

    private static let rehearsedSymbols = [
        "__gmon_start__", "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__cxa_finalize",
        "swift_addNewDSOImage", "_swift_backtrace_isThunkFunction", "swift_retain", "swift_release",
        "swift_allocObject", "swift_once", "malloc", "free", "calloc", "realloc", "memset", "memcpy",
        "strlen", "__stack_chk_fail", "pthread_mutex_lock", "pthread_mutex_unlock",
    ]

    nonisolated(unsafe) private static var rehearsedBytes = 0

    /// The start of `rehearsalAssignment`, encoded once by the zygote.
    nonisolated(unsafe) private static var startPacket: [UInt8] = []
    /// A launch request with the variables a host sends, encoded once by the zygote.
    nonisolated(unsafe) private static var requestPacket: [UInt8] = []

    /// The launch's side of its channel: decodes `packet` (a start), encodes every message a
    /// no-op launch sends, and sends them on `channel` if there is one. Starts no thread.
    /// Async-signal-safe: no — allocates; the zygote (before it forks) and the spare.
    private static func exerciseChildSide(_ packet: [UInt8], send channel: LaunchChannel?) {
        guard case let .start(assignment)? = try? LaunchChannel.decode(ParentMessage.self, from: packet) else { return }
        let messages: [ChildMessage] = [
            .loading(path: assignment.executablePath, at: bgtask_monotonic_ns()),
            .registered(identifier: "a.b.c", at: bgtask_monotonic_ns()), .launched(at: bgtask_monotonic_ns()),
            .taskBegan(task: 1, at: bgtask_monotonic_ns()), .taskCompleted(task: 1, success: true, at: bgtask_monotonic_ns()),
            .finished(at: bgtask_monotonic_ns(), descendants: false, peakResidentBytes: 0),
        ]
        for message in messages {
            if let channel {
                try? channel.send(message)
            } else {
                var writer = WireWriter()
                message.write(to: &writer)
                rehearsedBytes &+= writer.bytes.count // kept, so the encoding is not optimized away
            }
        }
    }

    /// A launch's process, a child of the host's: in a PID namespace of its own (the pid
    /// returned is the outer process's, which ends as the launch does; see namespace.c), or
    /// a plain fork where namespaces are unavailable. Returns 0 in the launch's process, which
    /// has its own process group and default signals. Nothing may start a thread before.
    /// Async-signal-safe: no — the child's side allocates (`notePidNamespace`'s strings) before
    /// it resets its signals: it is a fork of the single-threaded zygote, no lock held in its
    /// copy, an ordinary process from the clone's return (see `ZygoteServer`).
    private static func cloneLaunch() -> pid_t {
        var pid: pid_t
        var failure: String?
        if Sandbox.namespacesUnavailable == nil {
            var error = [CChar](repeating: 0, count: 512)
            pid = bgtask_clone_parent_namespaced(&error, error.count)
            if pid == 0 {
                Sandbox.notePidNamespace(true)
                bgtask_reset_signals() // its group is the outer process's
                return 0
            }
            if pid > 0 { return pid }
            failure = String(decoding: error.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        pid = bgtask_clone_parent()
        if pid == 0 {
            Sandbox.notePidNamespace(false, error: failure)
            setpgid(0, 0)
            bgtask_reset_signals()
        }
        return pid
    }

    /// Descriptors 0-3 as a spawned runner has them, and nothing else but the main run loop's
    /// own (see `rehearseMainThread`) and the prepared Landlock ruleset; the launch's environment.
    /// Async-signal-safe: no — decodes and allocates; the spare or the zygote's direct child, an
    /// ordinary process.
    private static func becomeLaunch(_ request: Request) {
        let (channel, stdin, log) = (request.fds[0], request.fds[1], request.fds[2])
        dup2(stdin, 0)
        dup2(log, 1)
        dup2(log, 2)
        dup2(channel, 3)
        let keep = (mainThreadDescriptors + (Sandbox.preparedRuleset >= 0 ? [Sandbox.preparedRuleset] : [])).sorted()
        bgtask_close_from_except(4, keep, Int32(keep.count))
        // In place where the value fits: CoreFoundation holds the addresses of some variables'
        // values from before the fork (AppContainer.snapshottedVariables).
        let decoded: ZygoteRequest
        do {
            decoded = try LaunchChannel.decode(ZygoteRequest.self, from: request.payload)
        } catch {
            // The host's own bytes, never a plugin's: a bug between two builds. Said in the log.
            fputs("bgtask-runner: the zygote's request: \(error)\n", stderr)
            _exit(RunnerExitStatus.protocolError)
        }
        for (key, value) in decoded.environment { AppContainer.setInPlace(key, value) }
    }

    /// Fills the caches every launch uses, so children inherit them ready: the launch's side of
    /// the channel (and the start packet every spare rehearses with), a runner's registrations
    /// and task start (its dictionaries' generic metadata was 5 % of a no-op launch's CPU when
    /// every child instantiated it anew), the environment parse. Starts no thread.
    private static func warmUp() {
        bgtask_resolve_foundation_hooks()
        Sandbox.findLibraryDirectories()
        Sandbox.checkNamespaces()
        var writer = WireWriter()
        ParentMessage.start(rehearsalAssignment).write(to: &writer)
        startPacket = writer.bytes
        if let pair = try? LaunchChannel.makePair() {
            try? pair.parent.send(bytes: startPacket)
            if let packet = try? pair.child.receivePacket() { exerciseChildSide(packet, send: pair.child) }
            pair.parent.close()
            pair.child.close()
        }
        var request = WireWriter()
        var environment = AppContainer.environment(container: "/var/lib/bgtask/containers/com.example.rehearsal")
        environment["BGTASK_LAUNCH_ID"] = "20260101T000000-00000000"
        environment["BGTASK_BUNDLE_ID"] = "com.example.rehearsal"
        environment["BGTASK_LOG_PRIVATE"] = "0"
        ZygoteRequest(environment: environment).write(to: &request)
        requestPacket = request.bytes
        _ = try? LaunchChannel.decode(ZygoteRequest.self, from: requestPacket)
        guard let pair = try? LaunchChannel.makePair() else { return }
        defer {
            pair.parent.close()
            pair.child.close()
        }
        let rehearsal = Runner(assignment: rehearsalAssignment, channel: pair.child)
        let noop: bgtask_launch_handler = { _, _ in }
        for identifier in rehearsalAssignment.permittedIdentifiers {
            _ = rehearsal.register(identifier, .abi(noop, nil))
            _ = try? pair.parent.receive(ChildMessage.self)
        }
        // Starts task 1 (its handler is queued for a handler thread that never runs here) and
        // sets an expiration handler; completing it would end the launch, and this process.
        rehearsal.startTasks()
        rehearsal.setExpirationHandler(1, { _, _ in true }, nil)
        while (try? pair.parent.receivePacket(nonBlocking: true)) != nil {}
    }

    private static let rehearsalAssignment = LaunchAssignment(
        launchID: "rehearsal", role: .background, bundleIdentifier: "a.b", bundlePath: "/a/B.app",
        executablePath: "/a/B.app/libB.so", dataDirectory: "/a/data", permittedIdentifiers: ["a.b.c", "a.b.d", "a.b.e", "a.b.f", "a.b.g"],
        tasks: [TaskAssignment(task: 1, identifier: "a.b.c", kind: .refresh), TaskAssignment(task: 2, identifier: "a.b.d", kind: .processing)],
        mappedHandlers: [], supportedResources: 0, memoryBackstopBytes: 1 << 30)

    /// Sends `message`; with `handing`, that spare's socket goes with it, and the zygote's own
    /// copy is closed (the spare is the host's to use).
    private static func answer(_ fd: Int32, _ message: ZygoteAnswer, handing spare: Spare? = nil) {
        var writer = WireWriter()
        message.write(to: &writer)
        var descriptors = spare.map { [$0.socket] } ?? []
        _ = writer.bytes.withUnsafeBytes { raw in
            descriptors.withUnsafeMutableBufferPointer { bgtask_send_fds(fd, $0.baseAddress, Int32($0.count), raw.baseAddress, raw.count) }
        }
        if let spare { close(spare.socket) }
    }
}

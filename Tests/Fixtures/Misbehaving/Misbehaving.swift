// Misbehaving: a plugin that breaks the rules on purpose, one way per identifier (or, selected by
// BGTASK_FIXTURE_MODE, one way per launch), so the host's handling of each can be tested.
//
//   (unset) / normal      registers every com.example.misbehaving.* handler below
//   register-twice        registers com.example.misbehaving.ok twice in the entry
//   throw-in-entry        the entry throws "Misbehaving: entry refused to launch"
//   register-unpermitted  registers com.example.not.permitted (prints what register returned),
//                         then com.example.misbehaving.ok
import BackgroundTasks
#if canImport(Glibc)
import Glibc
#endif

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "Misbehaving") { launch in
        let mode = ProcessInfo.processInfo.environment["BGTASK_FIXTURE_MODE"] ?? "normal"
        switch mode {
        case "", "normal":
            Misbehaving.registerAll()
            if launch.role == .foreground { Misbehaving.continued(launch.eventJSON) }
        case "register-twice":
            Misbehaving.registerOK()
            Misbehaving.registerOK()
        case "throw-in-entry":
            throw EntryRefused()
        case "register-unpermitted":
            let registered = BGTaskScheduler.shared.register(
                forTaskWithIdentifier: "com.example.not.permitted", using: nil
            ) { task in task.setTaskCompleted(success: true) }
            print("misbehaving: register(com.example.not.permitted) returned \(registered)")
            Misbehaving.registerOK()
        default:
            throw UnknownMode(mode: mode)
        }
    }
}

struct EntryRefused: Error, CustomStringConvertible, LocalizedError {
    var description: String { "Misbehaving: entry refused to launch" }
    var errorDescription: String? { description }
}

struct UnknownMode: Error, CustomStringConvertible, LocalizedError {
    var mode: String
    var description: String { "Misbehaving: unknown BGTASK_FIXTURE_MODE '\(mode)'" }
    var errorDescription: String? { description }
}

nonisolated(unsafe) var thermalObservers: [any NSObjectProtocol] = []

enum Misbehaving {
    static let prefix = "com.example.misbehaving."

    /// Foreground launches: submit continued-processing tasks as the event says:
    /// {"continued": ["fast", "stall", "slow"], "strategy": "queue"|"fail", "gpu": true}.
    /// fast: 10 steps of 20 ms; slow: 10 steps of 200 ms; stall: one step, then nothing
    /// (its expiration handler completes it with false).
    static func continued(_ eventJSON: String?) {
        struct Event: Decodable { var continued: [String]?; var strategy: String?; var gpu: Bool? }
        guard let json = eventJSON, let event = try? JSONDecoder().decode(Event.self, from: Data(json.utf8)) else { return }
        for name in event.continued ?? [] {
            let identifier = prefix + "continued." + name
            BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: nil) { task in
                let task = task as! BGContinuedProcessingTask
                let stop = DispatchSemaphore(value: 0)
                task.expirationHandler = {
                    print("misbehaving: \(identifier) expired")
                    stop.signal()
                }
                task.progress.totalUnitCount = 10
                let steps = name == "stall" ? 1 : 10
                for step in 1...steps {
                    if stop.wait(timeout: .now() + .milliseconds(name == "slow" ? 200 : 20)) == .success {
                        task.setTaskCompleted(success: false)
                        return
                    }
                    task.progress.completedUnitCount = Int64(step)
                    task.updateTitle("Misbehaving \(name)", subtitle: "step \(step) of 10")
                }
                if name == "stall" {
                    stop.wait()
                    task.setTaskCompleted(success: false)
                    return
                }
                task.setTaskCompleted(success: true)
            }
            let request = BGContinuedProcessingTaskRequest(identifier: identifier, title: "Misbehaving \(name)", subtitle: "starting")
            request.strategy = event.strategy == "fail" ? .fail : .queue
            if event.gpu == true { request.requiredResources = .gpu }
            do {
                try BGTaskScheduler.shared.submit(request)
                print("misbehaving: submitted \(identifier)")
            } catch let error as BGTaskScheduler.Error {
                print("misbehaving: submit \(identifier) failed: code \(error.code.rawValue): \(error.localizedDescription)")
            } catch {
                print("misbehaving: submit \(identifier) failed: \(error)")
            }
        }
    }

    static func register(_ name: String, _ handler: @escaping (BGTask) -> Void) {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: prefix + name, using: nil, launchHandler: handler)
    }

    static func registerOK() {
        register("ok") { task in
            print("misbehaving: ok completes with success")
            task.setTaskCompleted(success: true)
        }
    }

    static func registerAll() {
        registerOK()
        registerConnect()

        // Completes at once, then computes on another thread: the launch's work is over, but
        // the app is not quiet, so its process lingers before it is suspended or exits. `linger`
        // computes for 600 ms (outlasting another app's whole launch); `linger-brief` for 400 ms:
        // past a 300 ms budget for certain, and 600 ms inside the second a finished launch is
        // given to be gone, for a loaded machine.
        for (name, seconds) in [("linger", 0.6), ("linger-brief", 0.4)] {
            register(name) { task in
                print("misbehaving: \(name) completes, then computes for \(Int(seconds * 1000)) ms")
                task.setTaskCompleted(success: true)
                Thread.detachNewThread {
                    let end = Date().addingTimeInterval(seconds)
                    var x = 0.0
                    while Date() < end { x += sin(x) + 1 }
                    print("misbehaving: \(name) done computing (\(x > 0))")
                }
            }
        }

        // Never completes; completes unsuccessfully only when expired.
        register("never") { task in
            print("misbehaving: never will not complete until expired")
            task.expirationHandler = {
                print("misbehaving: never expired, completing with false")
                task.setTaskCompleted(success: false)
            }
        }

        // Never completes and sets no expiration handler: the host has to end it.
        register("noexpiry") { _ in
            print("misbehaving: noexpiry will never complete and has no expiration handler")
        }

        register("fail") { task in
            print("misbehaving: fail completes with success false")
            task.setTaskCompleted(success: false)
        }

        // Only the first completion counts.
        register("twice") { task in
            print("misbehaving: twice completes true, true, then false")
            task.setTaskCompleted(success: true)
            task.setTaskCompleted(success: true)
            task.setTaskCompleted(success: false)
        }

        // Registering after launch ends the launch, as on iOS: register does not return.
        register("late-register") { task in
            print("misbehaving: late-register registers \(prefix)late after launch")
            let registered = BGTaskScheduler.shared.register(
                forTaskWithIdentifier: prefix + "late", using: nil
            ) { late in late.setTaskCompleted(success: true) }
            print("misbehaving: late-register: register returned \(registered) (the launch should have ended)")
            task.setTaskCompleted(success: true)
        }
    
        // The zoo of issue 3: each breaks the launch in one way the host must survive and name.

        // Sets an expiration handler that ignores expiry, and keeps the CPU busy: watchdog.
        register("spin") { task in
            print("misbehaving: spin ignores expiration and spins")
            task.expirationHandler = { print("misbehaving: spin was told to expire and ignores it") }
            var x: UInt64 = 0
            while true { x &+= 1; if x == 0 { print(x) } }
        }

        // Says the device's thermal state and Low Power Mode as it begins, and each change it is
        // told of (ProcessInfo's notifications), until it expires: then it completes.
        register("thermal") { task in
            let info = ProcessInfo.processInfo
            print("misbehaving: thermal: began at state \(info.thermalState.rawValue), low power \(info.isLowPowerModeEnabled)")
            thermalObservers = [
                NotificationCenter.default.addObserver(forName: ProcessInfo.thermalStateDidChangeNotification, object: nil, queue: nil) { _ in
                    print("misbehaving: thermal: state changed to \(ProcessInfo.processInfo.thermalState.rawValue)")
                },
                NotificationCenter.default.addObserver(forName: .NSProcessInfoPowerStateDidChange, object: nil, queue: nil) { _ in
                    print("misbehaving: thermal: low power changed to \(ProcessInfo.processInfo.isLowPowerModeEnabled)")
                },
            ]
            task.expirationHandler = {
                print("misbehaving: thermal: expired at state \(ProcessInfo.processInfo.thermalState.rawValue)")
                task.setTaskCompleted(success: false)
            }
        }

        // Blocks forever in a C call (pause), expiration handler or not: watchdog.
        register("block") { task in
            print("misbehaving: block blocks in pause()")
            task.expirationHandler = { print("misbehaving: block expired, still blocked") }
            while true { pause() }
        }

        // Completes its task from its expiration handler, then blocks that thread for good: the
        // launch still ends once it goes quiet (its end is not timed on the expiration thread).
        register("stuck-expiry") { task in
            task.expirationHandler = {
                print("misbehaving: stuck-expiry completes, then blocks its expiration thread")
                task.setTaskCompleted(success: false)
                while true { pause() }
            }
        }

        register("segfault") { _ in
            print("misbehaving: segfault dereferences a bad pointer")
            raise(SIGSEGV)
        }

        register("abort") { _ in
            print("misbehaving: abort calls abort()")
            abort()
        }

        register("trap") { _ in
            let values: [Int] = []
            print("misbehaving: trap reads past the end of an array: \(values[values.count])")
        }

        register("exit3") { _ in
            print("misbehaving: exit3 calls exit(3)")
            exit(3)
        }

        // Leaves with its task open: not a normal exit.
        register("exit-early") { _ in
            print("misbehaving: exit-early calls exit(0) with its task open")
            exit(0)
        }

        // Touches memory until the host kills it (jetsam).
        register("alloc") { _ in
            print("misbehaving: alloc touches memory until killed")
            var blocks: [UnsafeMutableRawPointer] = []
            while true {
                let block = malloc(1 << 20)!
                memset(block, 1, 1 << 20)
                blocks.append(block)
            }
        }

        // Writes its container full, a MiB at a time, slowly enough for the host to look
        // (at most 4 GiB); says where it stopped and completes.
        register("fill-disk") { task in
            let path = (ProcessInfo.processInfo.environment["HOME"] ?? "/tmp") + "/Documents/fill"
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            let chunk = [UInt8](repeating: 7, count: 1 << 20)
            var written = 0
            while written < 4096 {
                guard chunk.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == chunk.count else { break }
                written += 1
                usleep(2_000)
            }
            print("misbehaving: fill-disk stopped after \(written) MiB: \(String(cString: strerror(errno)))")
            close(fd)
            task.setTaskCompleted(success: true)
        }

        // Writes 4 MiB into its container and syncs it: what its record's energy counts.
        register("write") { task in
            let path = (ProcessInfo.processInfo.environment["HOME"] ?? "/tmp") + "/Documents/written"
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            let chunk = [UInt8](repeating: 9, count: 1 << 20)
            for _ in 0..<4 { _ = chunk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } }
            fsync(fd)
            close(fd)
            print("misbehaving: write wrote 4 MiB")
            task.setTaskCompleted(success: true)
        }

        // A forked grandchild allocates; the child waits for it: jetsam must count both.
        register("alloc-grandchild") { _ in
            print("misbehaving: alloc-grandchild forks a child that touches memory")
            let pid = fork()
            if pid == 0 {
                while true { memset(malloc(1 << 20)!, 1, 1 << 20) }
            }
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }

        // A grandchild escapes the process group and ignores SIGTERM; it must still die.
        register("fork-setsid") { task in
            // Named after its launch: in the launch's PID namespace, its pid is not the one
            // the test sees.
            let launchID = ProcessInfo.processInfo.environment["BGTASK_LAUNCH_ID"] ?? "?"
            let name = "fsg-" + launchID.suffix(10)
            let pid = fork()
            if pid == 0 {
                let comm = open("/proc/self/comm", O_WRONLY)
                _ = name.withCString { write(comm, $0, strlen($0)) }
                close(comm)
                setsid()
                signal(SIGTERM, SIG_IGN)
                while true { pause() }
            }
            let path = (ProcessInfo.processInfo.environment["HOME"] ?? "/tmp") + "/grandchild.pid"
            try? name.write(toFile: path, atomically: true, encoding: .utf8)
            print("misbehaving: fork-setsid started grandchild \(pid)")
            task.setTaskCompleted(success: true)
        }

        // Closes its channel to the host, then waits.
        register("close-channel") { _ in
            print("misbehaving: close-channel closes fd 3")
            close(3)
            while true { pause() }
        }

        // Writes garbage to its channel, then waits.
        register("garbage") { _ in
            print("misbehaving: garbage writes junk to fd 3")
            let junk: [UInt8] = [0xde, 0xad, 0xbe, 0xef, 0x00, 0x7b, 0x22]
            _ = junk.withUnsafeBytes { send(3, $0.baseAddress, $0.count, 0) }
            while true { pause() }
        }

        // Writes nothing at all.
        register("silent") { task in task.setTaskCompleted(success: true) }

        // Writes 1 MiB to stdout (16 times a pipe's buffer) in numbered lines, with a log
        // call and a line on stderr after every 1,000th line, so the log's order can be checked.
        register("chatty") { task in
            let filler = String(repeating: "x", count: 1_000)
            for line in 1...1_024 {
                print("line \(line) \(filler)")
                if line % 256 == 0 {
                    fflush(nil)
                    BGTaskPlugin.log("log call after line \(line)")
                    FileHandle.standardError.write(Data("stderr after line \(line)\n".utf8))
                }
            }
            fflush(nil)
            task.setTaskCompleted(success: true)
        }

        // Lists its open descriptors and where they point, for the inheritance test.
        register("fds") { task in
            let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            for entry in entries.sorted() {
                let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(entry)")) ?? "?"
                print("fd \(entry) -> \(target)")
            }
            // The process's signal state (SigBlk, SigIgn, SigCgt: hexadecimal masks).
            let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
            for line in status.split(separator: "\n") where line.hasPrefix("Sig") { print(line) }
            task.setTaskCompleted(success: true)
        }

        // Resource abuse (ResourceAbuse.swift).
        registerResourceAbuse()
    }
}

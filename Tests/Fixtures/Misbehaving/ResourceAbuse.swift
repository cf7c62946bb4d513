// Resource abuse (issue 13, item 4): each handler pushes one resource at its host as hard as it
// can, so that ResourceBoundsTests can check the host bounds it, names the limit and loses
// nothing of anyone else's. Registered by `registerAll` (normal mode), identifiers at the end of
// Info.plist.
import BackgroundTasks
#if canImport(Glibc)
import Glibc
#endif

extension Misbehaving {
    static func registerResourceAbuse() {
        // 100,000 registrations of identifiers it is not permitted (200 bytes each): every one
        // is refused, and the record may list only so many.
        register("refuse-many") { task in
            let filler = String(repeating: "r", count: 180)
            var refused = 0
            for index in 0..<100_000 {
                let registered = BGTaskScheduler.shared.register(
                    forTaskWithIdentifier: "com.example.refused.\(filler).\(index)", using: nil
                ) { $0.setTaskCompleted(success: true) }
                if !registered { refused += 1 }
            }
            print("misbehaving: refuse-many: \(refused) registrations refused")
            task.setTaskCompleted(success: true)
        }

        // The same refresh request submitted 500 times (each accepted, replacing the one before).
        register("resubmit-many") { task in
            var accepted = 0
            for _ in 0..<500 {
                if (try? BGTaskScheduler.shared.submit(BGAppRefreshTaskRequest(identifier: prefix + "ok"))) != nil { accepted += 1 }
            }
            print("misbehaving: resubmit-many: \(accepted) submissions accepted")
            task.setTaskCompleted(success: true)
        }

        // 1 MiB identifiers to register, submit and cancel, and a 1 MiB log line: each call must
        // come back at once (not after the 30 s a lost request waits), refused by name.
        register("huge-inputs") { task in
            let huge = prefix + String(repeating: "x", count: 1 << 20)
            var start = bgtaskNow()
            let registered = BGTaskScheduler.shared.register(forTaskWithIdentifier: huge, using: nil) { $0.setTaskCompleted(success: true) }
            print("misbehaving: huge-inputs: register returned \(registered) after \(elapsedMs(start)) ms")
            start = bgtaskNow()
            do {
                try BGTaskScheduler.shared.submit(BGAppRefreshTaskRequest(identifier: huge))
                print("misbehaving: huge-inputs: submit accepted after \(elapsedMs(start)) ms")
            } catch {
                print("misbehaving: huge-inputs: submit refused after \(elapsedMs(start)) ms: \(error.localizedDescription)")
            }
            start = bgtaskNow()
            BGTaskScheduler.shared.cancel(taskRequestWithIdentifier: huge)
            print("misbehaving: huge-inputs: cancel returned after \(elapsedMs(start)) ms")
            start = bgtaskNow()
            BGTaskPlugin.log(String(repeating: "L", count: 1 << 20))
            print("misbehaving: huge-inputs: log returned after \(elapsedMs(start)) ms")
            task.setTaskCompleted(success: true)
        }

        // Writes to stdout as fast as it can, for ever, ignoring its expiration: the log stops
        // at its limit and the watchdog still fires on time.
        register("flood") { task in
            task.expirationHandler = {}
            let line = [UInt8](repeating: UInt8(ascii: "f"), count: 64 * 1024 - 1) + [10]
            while true { _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) } }
        }

        // Puts a symlink where the host will make its log (it knows its launch id), pointing
        // at a file in its container, then prints: the host must not write through it.
        register("plant-log") { task in
            let environment = ProcessInfo.processInfo.environment
            let home = environment["HOME"] ?? "/tmp"
            let state = URL(fileURLWithPath: home).deletingLastPathComponent().deletingLastPathComponent()
            let target = home + "/planted-target"
            FileManager.default.createFile(atPath: target, contents: nil)
            let link = state.appendingPathComponent("logs/\(environment["BGTASK_LAUNCH_ID"] ?? "?").log").path
            let planted = symlink(target, link) == 0
            let why = planted ? "" : ": \(String(cString: strerror(errno)))"
            print("misbehaving: plant-log: symlink to \(target) \(planted ? "planted" : "not planted")\(why)")
            fflush(nil)
            task.setTaskCompleted(success: true)
        }

        // 40 children that wait in its process group, then a spin through its expiration: the
        // launch is killed (watchdog, or jetsam once its children are counted), and none of
        // its children may stay a zombie under the host.
        register("fork-many") { task in
            task.expirationHandler = {}
            for _ in 0..<40 where fork() == 0 {
                while true { pause() }
            }
            print("misbehaving: fork-many: 40 children started")
            fflush(nil)
            var x: UInt64 = 0
            while true { x &+= 1; if x == 0 { print(x) } }
        }
    }

    private static func bgtaskNow() -> UInt64 { DispatchTime.now().uptimeNanoseconds }
    private static func elapsedMs(_ start: UInt64) -> UInt64 { (DispatchTime.now().uptimeNanoseconds - start) / 1_000_000 }
}

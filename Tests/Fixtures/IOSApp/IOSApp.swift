// IOSApp: background-task code written the way public iOS apps write it, leaning on the process
// around the API: handlers registered on the main queue, tasks completed through
// DispatchQueue.main and the main actor, task identifiers derived from a force-unwrapped
// Bundle.main.bundleIdentifier, files in Documents and Caches, UserDefaults, and an app group
// shared with a share extension (the same library, bundled as Share.appex). Each handler prints
// one line saying what it observed; LaunchTests assert them.
import BackgroundTasks

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "IOSApp") { launch in
        if launch.role == .extension {
            ShareExtension().didReceive(eventJSON: launch.eventJSON ?? "{}")
        } else {
            _ = AppDelegate.shared.application(didFinishLaunchingWithOptions: nil)
        }
    }
}

func say(_ line: String) {
    print(line)
    fflush(stdout)
}

/// What the run-loop handler saw, in order (touched only on the main thread).
final class Steps: @unchecked Sendable {
    var names: [String] = []
}

enum Shared {
    static let appGroup = "group.com.example.iosapp"
    static let sharedURLKey = "lastSharedURL"
}

final class AppDelegate {
    static let shared = AppDelegate()

    // As one of the apps does: identifiers from the bundle, force-unwrapped.
    let bundleID = Bundle.main.bundleIdentifier!
    var mainQueueID: String { "\(bundleID).mainqueue" }
    var dispatchMainID: String { "\(bundleID).dispatchmain" }
    var mainActorID: String { "\(bundleID).mainactor" }
    var runLoopID: String { "\(bundleID).runloop" }
    var filesID: String { "\(bundleID).files" }
    var expiringID: String { "\(bundleID).expiring" }
    var blocksMainID: String { "\(bundleID).blocksmain" }
    var blocksMainForeverID: String { "\(bundleID).blocksmainforever" }

    @discardableResult
    func application(didFinishLaunchingWithOptions options: [String: Any]?) -> Bool {
        // didFinishLaunching runs on the main thread, on the main actor.
        let isolated: Bool = MainActor.assumeIsolated { Thread.isMainThread }
        say("launch: main thread \(Thread.isMainThread), main actor \(isolated)")
        say("bundle: \(Bundle.main.bundleIdentifier ?? "nil") at \(Bundle.main.bundlePath) executable \(Bundle.main.executableURL?.lastPathComponent ?? "nil")")
        let version = Bundle.main.infoDictionary?["CFBundleShortVersionString"] as? String ?? "nil"
        let feed = Bundle.main.object(forInfoDictionaryKey: "IOSAppFeedURL") as? String ?? "nil"
        say("info: version \(version) feed \(feed)")
        if let seed = Bundle.main.url(forResource: "seed", withExtension: "txt"),
           let text = try? String(contentsOf: seed, encoding: .utf8) {
            say("resource: seed.txt says \(text.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        DispatchQueue.main.async { say("launch: a block queued on the main queue in didFinishLaunching ran") }

        BGTaskScheduler.shared.register(forTaskWithIdentifier: mainQueueID, using: .main) { task in
            let onMain = Thread.isMainThread
            let actor: Bool = MainActor.assumeIsolated { true }
            say("mainqueue: handler on main thread \(onMain), main actor \(actor)")
            task.setTaskCompleted(success: onMain)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: dispatchMainID, using: nil) { task in
            let onMain = Thread.isMainThread
            DispatchQueue.global(qos: .utility).async {
                let refreshed = "3 new stories"
                DispatchQueue.main.async {
                    say("dispatchmain: handler on main thread \(onMain); completed on main thread \(Thread.isMainThread) with \(refreshed)")
                    task.setTaskCompleted(success: true)
                }
            }
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: mainActorID, using: nil) { task in
            Task { @MainActor in
                try? await Task.sleep(nanoseconds: 5_000_000)
                say("mainactor: completed from a main-actor Task on main thread \(Thread.isMainThread)")
                task.setTaskCompleted(success: true)
            }
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: runLoopID, using: .main) { task in
            let steps = Steps()
            _ = Timer.scheduledTimer(withTimeInterval: 0.01, repeats: false) { _ in
                steps.names.append("timer")
                OperationQueue.main.addOperation {
                    steps.names.append("operation")
                    RunLoop.main.perform {
                        steps.names.append("perform")
                        say("runloop: \(steps.names.joined(separator: ", ")) on the main thread \(Thread.isMainThread)")
                        task.setTaskCompleted(success: true)
                    }
                }
            }
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: filesID, using: .main) { task in
            self.handleFiles(task)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: expiringID, using: .main) { task in
            // Work that never finishes by itself; the expiration handler hands the completion
            // to the main queue, as apps that keep their state on the main thread do.
            task.expirationHandler = {
                let onMain = Thread.isMainThread
                DispatchQueue.main.async {
                    say("expiring: expiration handler on main thread \(onMain); completed on main thread \(Thread.isMainThread)")
                    task.setTaskCompleted(success: false)
                }
            }
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: blocksMainID, using: .main) { task in
            // Blocks the main queue; the expiration handler runs elsewhere and completes it.
            task.expirationHandler = {
                say("blocksmain: expiration handler ran while the main thread is blocked")
                task.setTaskCompleted(success: false)
            }
            while true { sleep(1) }
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: blocksMainForeverID, using: .main) { task in
            // Blocks the main queue and completes only through it: only the watchdog ends this.
            task.expirationHandler = {
                say("blocksmainforever: expiration handler asks the blocked main queue to complete")
                DispatchQueue.main.async { task.setTaskCompleted(success: false) }
            }
            while true { sleep(1) }
        }
        return true
    }

    func handleFiles(_ task: BGTask) {
        let fileManager = FileManager.default
        let documents = fileManager.urls(for: .documentDirectory, in: .userDomainMask)[0]
        let caches = fileManager.urls(for: .cachesDirectory, in: .userDomainMask)[0]
        let support = try! fileManager.url(for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true)
        try! Data("{\"stories\": 3}".utf8).write(to: documents.appendingPathComponent("feed.json"))
        try! Data("thumbnail".utf8).write(to: caches.appendingPathComponent("thumb.bin"))
        try! Data("db".utf8).write(to: support.appendingPathComponent("store.sqlite"))
        let temporary = NSTemporaryDirectory()
        _ = fileManager.createFile(atPath: temporary + "scratch.tmp", contents: Data("t".utf8))
        say("files: home \(NSHomeDirectory())")
        say("files: homeDirectoryForCurrentUser \(fileManager.homeDirectoryForCurrentUser.path)")
        say("files: documents \(documents.path)")
        say("files: URL.documentsDirectory \(URL.documentsDirectory.path)")
        say("files: library \(URL.libraryDirectory.path)")
        say("files: caches \(caches.path)")
        say("files: application support \(support.path)")
        say("files: temporary \(temporary)")

        let defaults = UserDefaults.standard
        let launches = defaults.integer(forKey: "launchCount") + 1
        defaults.set(launches, forKey: "launchCount")
        say("files: UserDefaults launchCount \(launches)")

        let group = fileManager.containerURL(forSecurityApplicationGroupIdentifier: Shared.appGroup)
        say("files: group container \(group?.path ?? "nil")")
        say("files: other group container \(fileManager.containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.other")?.path ?? "nil")")
        let shared = UserDefaults(suiteName: Shared.appGroup)?.string(forKey: Shared.sharedURLKey) ?? "nil"
        say("files: group defaults \(Shared.sharedURLKey) \(shared)")
        if let group, let text = try? String(contentsOf: group.appendingPathComponent("inbox.txt"), encoding: .utf8) {
            say("files: group inbox \(text)")
        }
        task.setTaskCompleted(success: true)
    }
}

/// The share extension: what the user shared goes into the app group for the app to pick up.
final class ShareExtension {
    func didReceive(eventJSON: String) {
        say("share: bundle \(Bundle.main.bundleIdentifier ?? "nil") (\(Bundle.main.bundleURL.pathExtension))")
        let object = try? JSONSerialization.jsonObject(with: Data(eventJSON.utf8)) as? [String: Any]
        let url = object?["url"] as? String ?? "none"
        let defaults = UserDefaults(suiteName: Shared.appGroup)!
        defaults.set(url, forKey: Shared.sharedURLKey)
        defaults.synchronize()
        if let group = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: Shared.appGroup) {
            try! Data(url.utf8).write(to: group.appendingPathComponent("inbox.txt"))
        }
        say("share: stored \(url) in \(Shared.appGroup)")
    }
}

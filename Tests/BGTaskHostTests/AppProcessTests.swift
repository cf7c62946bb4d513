@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// A launch is an iOS app process as far as app code can tell (DESIGN.md, "The app process"):
/// the IOSApp fixture leans on the main queue, the main actor, the main run loop, Bundle.main,
/// Foundation's container paths, UserDefaults and an app group, in real launches, by both
/// launch paths: `bgtask run` spawns the runner, the host forks it from its zygote.
@Suite struct AppProcessTests {
    static let id = "com.example.iosapp"

    /// IOSApp.app, with a resource file inside the bundle.
    func makeApp(_ scratch: Scratch, name: String = "IOSApp.app") throws -> URL {
        let app = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Info.plist", name: name)
        try "seeded\n".write(to: app.appendingPathComponent("seed.txt"), atomically: true, encoding: .utf8)
        return app
    }

    /// Lines the launch printed that start with `prefix`.
    func lines(_ record: RunRecord, _ prefix: String) throws -> [String] {
        try record.logText().split(separator: "\n").map(String.init).filter { $0.hasPrefix(prefix) }
    }

    @Test func handlersCompleteThroughTheMainQueueTheMainActorAndTheRunLoop() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try makeApp(scratch)
        let tasks = ["mainqueue:refresh", "dispatchmain:processing", "mainactor:processing", "runloop:processing"]
        let (record, _) = try scratch.run(app, tasks.flatMap { ["--task", "\(Self.id).\($0)"] })
        #expect(record.termination == .exited)
        for task in tasks {
            let id = "\(Self.id).\(task.split(separator: ":")[0])"
            #expect(record.task(id)?.outcome == .succeeded, "\(id): \(String(describing: record.task(id)))")
        }
        let log = try record.logText()
        #expect(log.contains("launch: main thread true, main actor true\n"), "the launch entry runs on the main actor")
        #expect(log.contains("launch: a block queued on the main queue in didFinishLaunching ran\n"))
        #expect(log.contains("mainqueue: handler on main thread true, main actor true\n"))
        #expect(log.contains("dispatchmain: handler on main thread false; completed on main thread true with 3 new stories\n"),
                "a nil queue is a background queue, as on iOS")
        #expect(log.contains("mainactor: completed from a main-actor Task on main thread true\n"))
        #expect(log.contains("runloop: timer, operation, perform on the main thread true\n"))
    }

    @Test func bundleMainIsTheAppsBundle() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try makeApp(scratch)
        let (record, _) = try scratch.run(app, ["--task", "\(Self.id).mainqueue:refresh"])
        #expect(record.task("\(Self.id).mainqueue")?.outcome == .succeeded, "task identifiers derived from Bundle.main.bundleIdentifier!")
        #expect(try lines(record, "bundle:") == ["bundle: \(Self.id) at \(app.path) executable libIOSApp.so"])
        #expect(try lines(record, "info:") == ["info: version 2.4.1 feed https://example.com/feed.json"])
        #expect(try lines(record, "resource:") == ["resource: seed.txt says seeded"])
    }

    @Test func foundationPathsAndUserDefaultsStayInTheContainer() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try makeApp(scratch)
        let container = scratch.state.appendingPathComponent("containers/\(Self.id)").path
        let (first, _) = try scratch.run(app, ["--task", "\(Self.id).files:processing"])
        #expect(first.task("\(Self.id).files")?.outcome == .succeeded)
        #expect(try lines(first, "files:") == [
            "files: home \(container)",
            "files: homeDirectoryForCurrentUser \(container)",
            "files: documents \(container)/Documents",
            "files: URL.documentsDirectory \(container)/Documents",
            "files: library \(container)/Library",
            "files: caches \(container)/Library/Caches",
            "files: application support \(container)/Library/Application Support",
            "files: temporary \(container)/tmp/",
            "files: UserDefaults launchCount 1",
            "files: group container \(scratch.state.path)/groups/group.com.example.iosapp",
            "files: other group container nil",
            "files: group defaults lastSharedURL nil",
        ])
        for file in ["Documents/feed.json", "Library/Caches/thumb.bin", "Library/Application Support/store.sqlite",
                     "tmp/scratch.tmp", "Library/Preferences/\(Self.id).plist"] {
            #expect(FileManager.default.fileExists(atPath: "\(container)/\(file)"), "\(file) in the container")
        }
        // Without synchronize(): UserDefaults written in one launch are there in the next.
        let (second, _) = try scratch.run(app, ["--task", "\(Self.id).files:processing"])
        #expect(try lines(second, "files: UserDefaults").first == "files: UserDefaults launchCount 2")
    }

    @Test func expirationReachesHandlersThatLiveOnTheMainQueue() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try makeApp(scratch)
        // Two launches: a handler that blocks the main queue would also hold back the other's
        // completion, queued behind it (as on iOS).
        for (id, line) in [("expiring", "expiring: expiration handler on main thread false; completed on main thread true\n"),
                           ("blocksmain", "blocksmain: expiration handler ran while the main thread is blocked\n")] {
            let (record, _) = try scratch.run(app, ["--task", "\(Self.id).\(id):processing", "--expire-after", "300ms"])
            #expect(record.termination == .exited, "\(id)")
            let task = try #require(record.task("\(Self.id).\(id)"))
            #expect(task.outcome == .expired, "\(id)")
            #expect(task.expirationHandled == true, "\(id)")
            #expect((task.expiredMs ?? 0) >= 300, "\(id)")
            #expect(try record.logText().contains(line))
        }
    }

    @Test func aHandlerThatHoldsTheMainQueueIsStillKilledByTheWatchdog() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try makeApp(scratch)
        let (record, _) = try scratch.run(app, ["--task", "\(Self.id).blocksmainforever:processing",
                                                "--expire-after", "200ms", "--grace", "300ms"])
        #expect(record.termination == .watchdog)
        let task = try #require(record.task("\(Self.id).blocksmainforever"))
        #expect(task.outcome == .unfinished)
        #expect(task.expirationHandled == true)
        #expect(try record.logText().contains("blocksmainforever: expiration handler asks the blocked main queue to complete\n"))
    }

    /// The host forks launches from its zygote, whose Foundation was loaded with the host's
    /// environment and warmed before the fork: none of that may leak into a launch.
    @Test func zygoteLaunchesAreTheAppAndShareItsGroupWithTheExtension() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        let appex = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Share-Info.plist", name: "Share.appex")
        let staged = scratch.url.appendingPathComponent("staged-IOSApp.app")
        let made = try runCLI(["bundle", "--library", Products.library("IOSApp"),
                               "--info", Products.packageRoot.appendingPathComponent("Tests/Fixtures/IOSApp/Info.plist").path,
                               "--extension", appex.path, "--output", staged.path])
        try #require(made.status == 0, "\(made.stderr)")
        try FileManager.default.moveItem(at: staged, to: host.plugins.appendingPathComponent("IOSApp.app"))
        try host.start()
        defer { host.stop() }

        let shared = try host.cli(["extension", "run", "\(Self.id).share", "--event", #"{"url": "https://example.com/story"}"#, "--json"])
        #expect(shared.status == 0, "\(shared.stderr)")
        let extensionRecord = try RunRecord.decode(Data(shared.stdout.utf8))
        #expect(extensionRecord.launcher == "zygote")
        #expect(try lines(extensionRecord, "share:") == [
            "share: bundle \(Self.id).share (appex)",
            "share: stored https://example.com/story in group.com.example.iosapp",
        ])

        let container = scratch.state.appendingPathComponent("containers/\(Self.id)").path
        var firstPID: Int32?
        for (index, (task, type)) in [("files", "processing"), ("mainqueue", "refresh"), ("mainactor", "processing"), ("files", "processing")].enumerated() {
            let result = try host.cli(["simulate-launch", "\(Self.id).\(task)", "--force", "--type", type, "--json"])
            #expect(result.status == 0, "\(task): \(result.stderr)")
            let record = try RunRecord.decode(Data(result.stdout.utf8))
            #expect(record.launcher == "zygote")
            #expect(record.task("\(Self.id).\(task)")?.outcome == .succeeded, "\(task)")
            // The first launch starts the app's process (its launch entry prints its bundle); the
            // others resume it, suspended in between: no second launch entry, the same process.
            #expect(try lines(record, "bundle:") == (index == 0 ? ["bundle: \(Self.id) at \(host.plugins.path)/IOSApp.app executable libIOSApp.so"] : []))
            #expect(record.resumed == (index > 0) && record.processLaunches == index + 1, "\(record)")
            #expect(record.termination == .suspended)
            if index == 0 { firstPID = record.pid } else { #expect(record.pid == firstPID) }
            if task == "files" {
                let files = try lines(record, "files:")
                #expect(files.contains("files: home \(container)"))
                #expect(files.contains("files: caches \(container)/Library/Caches"))
                #expect(files.contains("files: group defaults lastSharedURL https://example.com/story"), "\(files)")
                #expect(files.contains("files: group inbox https://example.com/story"))
            }
        }
        // UserDefaults of the zygote's children land in the container (CoreFoundation reads its
        // preferences directory from values it took before the fork), and persist.
        #expect(FileManager.default.fileExists(atPath: "\(container)/Library/Preferences/\(Self.id).plist"))
        let history = try host.send(.history(limit: 100)).records ?? []
        let counts = try history.filter { $0.task("\(Self.id).files") != nil }.flatMap { try lines($0, "files: UserDefaults") }
        #expect(counts.sorted() == ["files: UserDefaults launchCount 1", "files: UserDefaults launchCount 2"])
    }

    @Test func appGroupEntitlementsAreValidatedWithTheKeyNamed() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let cases: [(String, String)] = [
            ("<string>group.com.example.a</string>", "must be an array of app group identifiers"),
            ("<array><integer>1</integer></array>", "[0]: must be a string"),
            ("<array><string>group.com.example.a</string><string>com.example.b</string></array>", "[1]: 'com.example.b' is not an app group identifier"),
            ("<array><string>group.</string></array>", "'group.' is not an app group identifier"),
        ]
        for (value, message) in cases {
            let bundle = scratch.url.appendingPathComponent("G\(abs(value.hashValue)).app")
            try FileManager.default.createDirectory(at: bundle, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: Products.library("IOSApp"), toPath: bundle.appendingPathComponent("libG.so").path)
            try """
            <plist><dict><key>CFBundleIdentifier</key><string>com.example.g</string><key>CFBundleExecutable</key><string>libG.so</string>
            <key>Entitlements</key><dict><key>com.apple.security.application-groups</key>\(value)</dict></dict></plist>
            """.write(to: bundle.appendingPathComponent("Info.plist"), atomically: true, encoding: .utf8)
            #expect(throws: BGTaskError.self) { try BundleReader.read(bundle) }
            do {
                _ = try BundleReader.read(bundle)
            } catch {
                #expect(error.description.contains("Entitlements.com.apple.security.application-groups"), "\(error)")
                #expect(error.description.contains(message), "\(error)")
            }
        }
        let good = try BundleReader.read(try makeApp(scratch))
        #expect(good.appGroups == ["group.com.example.iosapp"])
    }
}

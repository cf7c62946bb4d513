import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// End-to-end launches: the real CLI, a real runner child, real plugin libraries built by the
/// package.
@Suite struct LaunchTests {
    @Test func feedRefreshSucceedsAndKeepsStateAcrossLaunches() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")

        let (first, result) = try scratch.run(app, ["--task", "com.example.feed.refresh:refresh"])
        #expect(result.status == 0)
        #expect(first.termination == .exited)
        #expect(first.app == "com.example.feed")
        #expect(first.reason == "simulated")
        let task = try #require(first.task("com.example.feed.refresh"))
        #expect(task.outcome == .succeeded)
        #expect(task.type == .refresh)
        #expect((task.startedMs ?? -1) >= 0 && (task.completedMs ?? -1) >= task.startedMs!)
        #expect(first.submitted.map(\.identifier) == ["com.example.feed.refresh"])
        #expect(first.submitted.first?.earliestBeginDate != nil)

        let (second, _) = try scratch.run(app, ["--task", "com.example.feed.refresh:refresh"])
        #expect(second.termination == .exited)
        #expect(second.launchID != first.launchID)
        #expect(second.pid != first.pid)
        let stateFile = scratch.state.appendingPathComponent("containers/com.example.feed/state.json")
        let state = try JSONSerialization.jsonObject(with: Data(contentsOf: stateFile)) as? [String: Any]
        #expect(state?["refreshCount"] as? Int == 2)
        let log = try second.logText()
        #expect(log.contains("refresh #2"))
    }

    @Test func recordHasEveryContractField() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")
        let result = try runCLI(["run", app.path, "--task", "com.example.feed.refresh:refresh", "--json", "--state", scratch.state.path])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        for key in ["app", "launch_id", "reason", "tasks", "termination", "wall_ms", "cpu_ms", "peak_rss_bytes",
                    "memory_limit_bytes", "memory_mechanism", "budget_ms", "pid"] {
            #expect(object[key] != nil, "missing \(key)")
        }
        let tasks = try #require(object["tasks"] as? [[String: Any]])
        for key in ["identifier", "type", "outcome", "started_ms", "completed_ms"] {
            #expect(tasks.first?[key] != nil, "task misses \(key)")
        }
        #expect(object["memory_mechanism"] as? String == "sampler")
        #expect((object["peak_rss_bytes"] as? Int ?? 0) > 1_000_000)
        #expect(result.stdout.split(separator: "\n").count == 1, "--json prints one object on one line")
    }

    @Test func cPluginRunsRegisteredAndFFIMappedHandlers() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Counter", info: "Plugins/Counter/Info.plist", name: "Counter.app")
        let tasks = ["com.example.counter.tick", "com.example.counter.report", "com.example.counter.slow"]
        let (record, result) = try scratch.run(app, tasks.flatMap { ["--task", $0] })
        #expect(result.status == 0)
        #expect(record.termination == .exited)
        for identifier in tasks {
            #expect(record.task(identifier)?.outcome == .succeeded, "\(identifier)")
        }
        // The closure-completed task finished ~50 ms after it started, on another thread.
        let slow = try #require(record.task("com.example.counter.slow"))
        #expect((slow.completedMs ?? 0) - (slow.startedMs ?? 0) >= 40)
        let log = try record.logText()
        #expect(log.contains("counter: tick 1"))
        #expect(log.contains("com.example.counter.report in \(scratch.state.path)/containers/com.example.counter: count is 1"))

        let (again, _) = try scratch.run(app, ["--task", "com.example.counter.tick"])
        #expect(again.task("com.example.counter.tick")?.outcome == .succeeded)
        let count = try String(contentsOf: scratch.state.appendingPathComponent("containers/com.example.counter/count.txt"), encoding: .utf8)
        #expect(count.trimmingCharacters(in: .whitespacesAndNewlines) == "2")
    }

    /// An app delegate as Xcode 26 writes it (main-actor isolated, by the module's default in
    /// Swift 6 mode; `override init()` setting main-actor state; a handler that hops with
    /// `Task { @MainActor in }`; ProcessInfo's device state) compiles in both language modes
    /// and runs as on iOS.
    @Test(arguments: ["MainActorApp5", "MainActorApp6"])
    func aMainActorAppDelegateRunsInARealLaunch(library: String) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle(library, info: "Tests/Fixtures/\(library)/Info.plist", name: "MainActor.app")
        let (record, _) = try scratch.run(app, ["--task", "com.example.mainactor.refresh:refresh"])
        #expect(record.task("com.example.mainactor.refresh")?.outcome == .succeeded, "\(record)")
        let log = try record.logText()
        #expect(log.contains("mainactor: launched (notes: init, launch) thermal 0 low-power false"), "\(log)")
        #expect(log.contains("mainactor: refreshed 1 (notes: init, launch, refresh 1)"), "\(log)")
    }

    @Test(arguments: ["ApplePatterns5", "ApplePatterns6"])
    func appleAPIPatternsRunInARealLaunch(library: String) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle(library, info: "Tests/Fixtures/\(library)/Info.plist", name: "Patterns.app")
        let succeeding = ["cast:refresh", "label:processing", "witness:refresh", "pending:refresh",
                          "errors:refresh", "submit:refresh", "requests:refresh"]
        let expiring = ["swifttask:processing", "semaphore:processing"]
        let (record, _) = try scratch.run(app, (succeeding + expiring).flatMap { ["--task", "com.example.patterns.\($0)"] }
                                          + ["--expire-after", "500ms"])
        #expect(record.termination == .exited)
        for entry in succeeding {
            let id = "com.example.patterns." + entry.split(separator: ":")[0]
            #expect(record.task(id)?.outcome == .succeeded, "\(id): \(String(describing: record.task(id)))")
        }
        for entry in expiring {
            let id = "com.example.patterns." + entry.split(separator: ":")[0]
            let task = try #require(record.task(id))
            #expect(task.outcome == .expired, "\(id)")
            #expect(task.expirationHandled == true)
            #expect((task.expiredMs ?? 0) >= 500)
        }
        #expect(record.task("com.example.patterns.label")?.type == .processing)
        #expect(record.submitted.map(\.identifier).contains("com.example.patterns.label"))

        // What each handler observed, line for line as Apple's SDK gives it.
        let refusal = "'com.example.not.permitted' is not in BGTaskSchedulerPermittedIdentifiers of com.example.patterns"
        let lines = Set(try record.logText().split(separator: "\n").map(String.init))
        for line in [
            // BGTaskScheduler.Error: Apple's initializers, fields and NSError description.
            #"patterns: errors made: Error Domain=BGTaskSchedulerErrorDomain Code=1 "(null)" | Error Domain=BGTaskSchedulerErrorDomain Code=3 "the message" UserInfo={NSLocalizedDescription=the message}"#,
            "patterns: errors fields: code notPermitted, errorCode 3, userInfo the message, no userInfo true, domain BGTaskSchedulerErrorDomain true",
            "patterns: errors localizedDescription: The operation couldn’t be completed. (BGTaskSchedulerErrorDomain error 1.) | the message",
            "patterns: errors as NSError: BGTaskSchedulerErrorDomain 3 the message",
            #"patterns: errors SDK refusal: pattern true, text Error Domain=BGTaskSchedulerErrorDomain Code=3 "\#(refusal)" UserInfo={NSLocalizedDescription=\#(refusal)}"#,
            // A mock's hand-made NSError matches `catch BGTaskScheduler.Error.notPermitted`.
            "patterns: errors NSError: catch true, switch notPermitted, if case true, other domain false, other code false",
            #"patterns: errors converted: notPermitted Error Domain=BGTaskSchedulerErrorDomain Code=3 "(null)", bridged tooManyPendingTaskRequests, wrong domain nil, equal true, distinct 3"#,
            // submitTaskRequest: the handler on another queue, async/await, pending requests equal to the submitted ones.
            "patterns: submit completionHandler: notPermitted true, on the caller's queue false",
            "patterns: submit async: accepted, refused notPermitted, mock refused true, completion handler accepted true, "
                + "pending equal: processing true, study true, refresh true, study protection NSFileProtectionComplete",
            // Request equality (isEqual/hash) and protectionTypeOfRequiredData as an NSString.
            "patterns: requests refresh: same fields true, date differs false, same date true, set 2, refresh vs processing false, isEqual true hash true",
            "patterns: requests processing: power differs false, same true, copy true",
            "patterns: requests continued: same true, strategy differs false, title differs false",
            "patterns: requests health: default NSFileProtectionCompleteUntilFirstUserAuthentication, raw value NSFileProtectionComplete, "
                + "literal NSFileProtectionComplete, string true, protection differs false, same true",
            "patterns: requests health taught: complete NSFileProtectionComplete, until first authentication "
                + "NSFileProtectionCompleteUntilFirstUserAuthentication, unless open NSFileProtectionCompleteUnlessOpen, as the raw value true",
        ] {
            #expect(lines.contains(line), "missing from the log: \(line)\nlog:\n\(lines.sorted().joined(separator: "\n"))")
        }
        let submitted = Dictionary(record.submitted.map { ($0.identifier, $0) }, uniquingKeysWith: { $1 })
        #expect(submitted["com.example.patterns.study"]?.kind == .healthResearch)
        #expect(submitted["com.example.patterns.study"]?.protectionType == 1, "complete")
        #expect(submitted["com.example.patterns.later"]?.requiresExternalPower == true)
    }

    @Test func everyTaskOfALaunchRunsInOneProcess() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, result) = try scratch.run(app, ["--task", "com.example.misbehaving.ok:refresh",
                                                     "--task", "com.example.misbehaving.fail:processing",
                                                     "--task", "com.example.misbehaving.twice:refresh",
                                                     "--task", "com.example.misbehaving.late:refresh"])
        #expect(result.status == 1, "a failed task makes `bgtask run` fail")
        #expect(record.termination == .exited)
        #expect(record.task("com.example.misbehaving.ok")?.outcome == .succeeded)
        #expect(record.task("com.example.misbehaving.fail")?.outcome == .failed)
        #expect(record.task("com.example.misbehaving.twice")?.outcome == .succeeded, "only the first completion counts")
        #expect(record.task("com.example.misbehaving.late")?.outcome == .notRegistered)
        #expect(Set(record.tasks.map(\.identifier)).count == 4)
    }

    @Test func expiryWithoutHandlerCompletesTheTaskUnsuccessfully() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, _) = try scratch.run(app, ["--task", "com.example.misbehaving.noexpiry:refresh",
                                                "--task", "com.example.misbehaving.never:refresh", "--budget", "300ms"])
        #expect(record.termination == .exited)
        let noexpiry = try #require(record.task("com.example.misbehaving.noexpiry"))
        #expect(noexpiry.outcome == .failed)
        #expect(noexpiry.expirationHandled == false)
        let never = try #require(record.task("com.example.misbehaving.never"))
        #expect(never.outcome == .expired)
        #expect(record.budgetMs == 300)
        #expect((record.expiredAtMs ?? 0) >= 300)
    }

    @Test func aHandlerThatIgnoresExpiryIsKilledByTheWatchdog() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        for id in ["spin", "block"] {
            let (record, result) = try scratch.run(app, ["--task", "com.example.misbehaving.\(id):refresh",
                                                         "--budget", "300ms", "--grace", "200ms"])
            #expect(result.status == 1)
            #expect(record.termination == .watchdog, "\(id)")
            #expect(record.signal == "SIGKILL")
            #expect(record.task("com.example.misbehaving.\(id)")?.outcome == .unfinished)
            #expect(record.task("com.example.misbehaving.\(id)")?.expirationHandled == true)
            #expect(record.wallMs >= 500)
            #expect(!processExists(record.pid))
        }
    }

    /// An expiration handler that completes its task and then never returns holds the thread
    /// expiration is delivered on; the launch's end is timed elsewhere, so it still ends when it
    /// goes quiet, long before the watchdog.
    @Test func anExpirationHandlerThatNeverReturnsDoesNotHoldTheLaunchsEnd() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, _) = try scratch.run(app, ["--task", "com.example.misbehaving.stuck-expiry:refresh", "--budget", "300ms", "--grace", "5s"])
        #expect(record.termination == .exited, "\(record.termination)")
        #expect(record.task("com.example.misbehaving.stuck-expiry")?.outcome == .expired)
        #expect(record.task("com.example.misbehaving.stuck-expiry")?.expirationHandled == true)
        #expect(record.wallMs < 2_000, "ended \(record.wallMs) ms after it began: it waited for the watchdog")
    }

    @Test func registrationRulesEndOrRefuseAsOnIOS() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let ok = ["--task", "com.example.misbehaving.ok:refresh"]

        let (twice, _) = try scratch.run(app, ok, environment: ["BGTASK_FIXTURE_MODE": "register-twice"])
        #expect(twice.termination == .launchFailed, "broken during the launch entry")
        #expect(twice.signal == "SIGABRT")
        #expect(twice.error?.contains("'com.example.misbehaving.ok' registered twice") == true, "\(twice.error ?? "")")

        let (late, _) = try scratch.run(app, ["--task", "com.example.misbehaving.late-register:refresh"])
        #expect(late.termination == .crashed)
        #expect(late.error?.contains("'com.example.misbehaving.late' registered after the app finished launching") == true, "\(late.error ?? "")")
        #expect(late.task("com.example.misbehaving.late-register")?.outcome == .unfinished)

        let (unpermitted, _) = try scratch.run(app, ok, environment: ["BGTASK_FIXTURE_MODE": "register-unpermitted"])
        #expect(unpermitted.termination == .exited)
        #expect(unpermitted.refusedRegistrations == ["com.example.not.permitted"])
        #expect(unpermitted.task("com.example.misbehaving.ok")?.outcome == .succeeded)
        let log = try unpermitted.logText()
        #expect(log.contains("register(com.example.not.permitted) returned false"))

        let (thrown, _) = try scratch.run(app, ok, environment: ["BGTASK_FIXTURE_MODE": "throw-in-entry"])
        #expect(thrown.termination == .launchFailed)
        #expect(thrown.error?.contains("Misbehaving: entry refused to launch") == true, "\(thrown.error ?? "")")
        #expect(thrown.task("com.example.misbehaving.ok")?.outcome == .notRegistered)
    }

    @Test func brokenPluginsFailTheirLaunchWithTheReason() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        func info(_ executable: String) throws -> String {
            let path = scratch.url.appendingPathComponent("\(executable).plist")
            try """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
            <key>CFBundleIdentifier</key><string>com.example.broken</string>
            <key>CFBundleExecutable</key><string>\(executable)</string>
            <key>BGTaskSchedulerPermittedIdentifiers</key><array><string>com.example.broken.task</string></array>
            <key>UIBackgroundModes</key><array><string>fetch</string></array>
            </dict></plist>
            """.write(to: path, atomically: true, encoding: .utf8)
            return path.path
        }
        let cases: [(library: String, expect: String)] = [
            ("BadABI", "ABI version mismatch: libBadABI.so was built for bgtask ABI 99, this runner provides ABI 1"),
            ("NoEntry", "libNoEntry.so does not export the entry symbol 'bgtask_plugin_entry'"),
            ("EntryFails", "the launch entry of libEntryFails.so returned 7: database file is missing"),
            ("CrashInConstructor", "crashed with SIGSEGV while loading libCrashInConstructor.so"),
        ]
        for (library, expected) in cases {
            let app = scratch.url.appendingPathComponent("\(library).app")
            let made = try runCLI(["bundle", "--library", Products.library(library), "--info", try info("lib\(library).so"), "--output", app.path])
            try #require(made.status == 0, "\(made.stderr)")
            let (record, result) = try scratch.run(app, ["--task", "com.example.broken.task"])
            #expect(result.status == 1)
            #expect(record.termination == .launchFailed, "\(library)")
            #expect(record.error?.contains(expected) == true, "\(library): \(record.error ?? "no error")")
            #expect(record.task("com.example.broken.task")?.outcome == .notRegistered)
        }

        // An ELF header that dlopen rejects.
        let truncated = scratch.url.appendingPathComponent("Truncated.app")
        try FileManager.default.createDirectory(at: truncated, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: try info("libTruncated.so"), toPath: truncated.appendingPathComponent("Info.plist").path)
        let elf = try Data(contentsOf: URL(fileURLWithPath: Products.library("NoEntry"))).prefix(64)
        try elf.write(to: truncated.appendingPathComponent("libTruncated.so"))
        let (record, _) = try scratch.run(truncated, ["--task", "com.example.broken.task"])
        #expect(record.termination == .launchFailed)
        #expect(record.error?.hasPrefix("dlopen \(truncated.path)/libTruncated.so: ") == true, "\(record.error ?? "")")
    }

    @Test func crashesAreClassifiedAndNothingIsLeftBehind() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let cases: [(String, RunRecord.Termination, String?, Int32?)] = [
            ("segfault", .crashed, "SIGSEGV", nil),
            ("abort", .crashed, "SIGABRT", nil),
            ("trap", .crashed, "SIGILL", nil),
            ("exit3", .crashed, nil, 3),
            ("exit-early", .crashed, nil, 0),
            ("garbage", .crashed, "SIGKILL", nil),
        ]
        for (id, termination, signal, status) in cases {
            let (record, _) = try scratch.run(app, ["--task", "com.example.misbehaving.\(id):processing", "--budget", "5s"])
            #expect(record.termination == termination, "\(id): \(record.termination) \(record.error ?? "")")
            #expect(record.signal == signal, "\(id)")
            if let status { #expect(record.exitStatus == status, "\(id)") }
            #expect(record.task("com.example.misbehaving.\(id)")?.outcome == .unfinished, "\(id)")
            #expect(!processExists(record.pid), "\(id): the child is gone")
        }
        let (closed, _) = try scratch.run(app, ["--task", "com.example.misbehaving.close-channel:processing", "--budget", "300ms"])
        #expect(closed.termination == .crashed)
        #expect(closed.exitStatus == 75)
        #expect(closed.error?.contains("closed or broke its launch channel") == true, "\(closed.error ?? "")")
        #expect(closed.task("com.example.misbehaving.close-channel")?.outcome == .unfinished)

        let (garbage, _) = try scratch.run(app, ["--task", "com.example.misbehaving.garbage:processing"])
        #expect(garbage.error?.contains("malformed frame of 7 bytes") == true, "\(garbage.error ?? "")")
    }

    @Test func descendantsDieWithTheLaunchEvenAfterSetsid() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, _) = try scratch.run(app, ["--task", "com.example.misbehaving.fork-setsid:processing"])
        #expect(record.task("com.example.misbehaving.fork-setsid")?.outcome == .succeeded)
        let pidFile = scratch.state.appendingPathComponent("containers/com.example.misbehaving/grandchild.pid")
        let name = try String(contentsOf: pidFile, encoding: .utf8)
        #expect(name.hasPrefix("fsg-") && name.count > 4)
        let survivors = processes(named: name)
        #expect(survivors.isEmpty, "the setsid grandchild \(name) (pids \(survivors)) outlived its launch")
        for survivor in survivors { kill(survivor, SIGKILL) }
    }

    @Test func memoryOverTheLimitIsJetsam() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        for id in ["alloc", "alloc-grandchild"] {
            let (record, _) = try scratch.run(app, ["--task", "com.example.misbehaving.\(id):processing", "--memory-limit", "96MB", "--budget", "20s"])
            #expect(record.termination == .jetsam, "\(id): \(record.termination)")
            #expect(record.memoryLimitBytes == 96 << 20)
            #expect(record.peakRSSBytes > 96 << 20)
            #expect(record.task("com.example.misbehaving.\(id)")?.outcome == .unfinished)
        }
    }

    /// The kernel-enforced mechanism needs a delegated cgroup v2 directory with the memory
    /// controller; CI machines without one skip this test (and say so), and bgtask never
    /// writes to the machine's own hierarchy. Set BGTASK_TEST_CGROUP to such a directory.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["BGTASK_TEST_CGROUP"] != nil,
                   "skipped: no delegated cgroup v2 directory (set BGTASK_TEST_CGROUP to test the cgroup mechanism)"))
    func memoryOverTheLimitIsJetsamWithACgroup() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let root = ProcessInfo.processInfo.environment["BGTASK_TEST_CGROUP"]!
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        for id in ["alloc", "alloc-grandchild"] {
            let (record, _) = try scratch.run(app, ["--task", "com.example.misbehaving.\(id):processing", "--memory-limit", "96MB", "--cgroup", root])
            #expect(record.termination == .jetsam, "\(id)")
            #expect(record.memoryMechanism == "cgroup")
        }
        let left = try FileManager.default.contentsOfDirectory(atPath: root).filter { $0.hasPrefix("bgtask-") }
        #expect(left.isEmpty, "launch cgroups left behind: \(left)")
    }

    @Test func aCgroupThatIsNotDelegatedIsRefused() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")
        let result = try runCLI(["run", app.path, "--task", "com.example.feed.refresh:refresh", "--cgroup", scratch.url.path, "--state", scratch.state.path])
        #expect(result.status == 64)
        #expect(result.stderr.contains("not a cgroup v2 directory"), "\(result.stderr)")
    }

    @Test func badCommandLinesAndBundlesAreRefusedClearly() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")

        let ambiguous = try runCLI(["run", app.path, "--task", "com.example.feed.refresh", "--state", scratch.state.path])
        #expect(ambiguous.status == 64)
        #expect(ambiguous.stderr.contains("--type"))

        let unpermitted = try runCLI(["run", app.path, "--task", "com.example.other:refresh", "--state", scratch.state.path])
        #expect(unpermitted.status == 64)
        #expect(unpermitted.stderr.contains("'com.example.other' is not permitted"), "\(unpermitted.stderr)")

        let missing = try runCLI(["run", scratch.url.appendingPathComponent("Nope.app").path, "--task", "a.b"])
        #expect(missing.status == 65)
        #expect(missing.stderr.contains("Nope.app: bundle not found"))

        let notELF = scratch.url.appendingPathComponent("lib.so")
        try "not a library".write(to: notELF, atomically: true, encoding: .utf8)
        let bundled = try runCLI(["bundle", "--library", notELF.path, "--info", Products.packageRoot.appendingPathComponent("Plugins/Feed/Info.plist").path,
                                  "--output", scratch.url.appendingPathComponent("Bad.app").path])
        #expect(bundled.status == 65)
        #expect(bundled.stderr.contains("Info.plist: key CFBundleExecutable: 'libFeed.so' is not an ELF shared library"), "\(bundled.stderr)")
        #expect(!FileManager.default.fileExists(atPath: scratch.url.appendingPathComponent("Bad.app").path), "an invalid bundle is not left behind")
    }
}

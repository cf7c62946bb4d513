@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskModel
import Foundation
import Glibc
import Testing

/// Issue 28, identity the host vouches for (docs/isolation.md, "Identity, channel messages
/// and records"): a hostile app (Tests/Fixtures/Hostile, C against the published ABI) forges
/// log entries, floods its launch channel, registers 100,000 identifiers, takes another app's
/// app group and lies that it finished; each is held, and the record says what was refused.
@Suite(.serialized) struct IdentityTests {
    static let id = "com.example.hostile"

    func makeHostile(_ scratch: Scratch, info: String = "Tests/Fixtures/Hostile/Info.plist") throws -> URL {
        try scratch.bundle("Hostile", info: info, name: "Hostile.app")
    }

    /// `bgtask log ... --json`, decoded.
    func entries(_ scratch: Scratch, _ arguments: [String]) throws -> [[String: String]] {
        let result = try runCLI(["log", "--json", "--state", scratch.state.path] + arguments)
        try #require(result.status == 0, "bgtask log \(arguments): \(result.status) \(result.stderr)")
        return try result.stdout.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: String], "\($0)")
        }
    }

    /// The `hostile: NAME: RESULT` lines of a launch's log.
    func results(_ record: RunRecord) throws -> [String: String] {
        var results: [String: String] = [:]
        for line in try record.logText().split(separator: "\n") where line.hasPrefix("hostile: ") {
            let parts = line.dropFirst("hostile: ".count).split(separator: ":", maxSplits: 1)
            if parts.count == 2 { results[String(parts[0])] = parts[1].trimmingCharacters(in: .whitespaces) }
        }
        return results
    }

    // MARK: Forgery: log lines

    /// A launch prints entries in the log line format naming another app (on stdout, with the
    /// supervisor's tag, through the host's `log` call) after a line shaped like the host's
    /// header: none shows under the other app; all show as the hostile launch's own, under its
    /// launch id. The file's first line is the host's header.
    @Test func aForgedLogEntryNeverShowsUnderAnotherApp() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let (record, _) = try scratch.run(try makeHostile(scratch), ["--task", "\(Self.id).forgelog"])
        #expect(record.task("\(Self.id).forgelog")?.outcome == .succeeded)
        let text = try record.logText()
        #expect(text.hasPrefix("[bgtask launch] \(Self.id) \(record.launchID)\n"), "\(text)")
        #expect(text.contains("com.example.victim com.example.victim/forged: forged stdout entry"))

        #expect(try entries(scratch, ["--app", "com.example.victim"]).isEmpty)
        let own = try entries(scratch, ["--app", Self.id])
        #expect(own.map { $0["message"] ?? "" } == ["forged stdout entry", "forged tagged entry", "forged through log()"], "\(own)")
        #expect(own.allSatisfy { $0["app"] == Self.id && $0["launch_id"] == record.launchID }, "\(own)")
        #expect(try entries(scratch, ["--launch", "20260101T000000-00000000"]).isEmpty)
        let all = try entries(scratch, [])
        #expect(!all.contains { $0["app"] == "com.example.victim" }, "\(all)")
    }

    /// A log file the host did not make (planted under another launch's name, by anyone but
    /// the logs directory's owner) is not read; one without a header shows its entries with
    /// the app `-`, never with the app a line names.
    @Test func aLogWithoutTheHostsHeaderIsNotBelieved() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let logs = scratch.state.appendingPathComponent("logs")
        try FileManager.default.createDirectory(at: logs, withIntermediateDirectories: true)
        let line = "[os:default] 2026-11-22T04:11:40.123Z com.example.victim com.example.victim/x: planted\n"
        try line.write(to: logs.appendingPathComponent("20260101T000000-aaaaaaaa.log"), atomically: true, encoding: .utf8)
        let planted = logs.appendingPathComponent("20260101T000000-bbbbbbbb.log")
        try ("[bgtask launch] com.example.victim 20260101T000000-bbbbbbbb\n" + line).write(to: planted, atomically: true, encoding: .utf8)
        #expect(chown(planted.path, 7_654_321, 7_654_321) == 0)
        let all = try entries(scratch, [])
        #expect(all.map { $0["app"] } == [UnifiedLogReader.unknownApp], "\(all)")
        #expect(try entries(scratch, ["--app", "com.example.victim"]).isEmpty)
    }

    // MARK: Exhaustion: the launch channel

    /// The host's resident memory, from /proc/PID/status (VmRSS).
    static func residentBytes(_ pid: pid_t) -> UInt64 {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kib = UInt64(line.split(separator: " ").dropFirst().first ?? "") else { return 0 }
        return kib * 1024
    }

    /// 2,000,000 forged "background time began" messages (each a new id, never ended), sent
    /// as fast as the host reads them, for at most 15 s: the host keeps 1,024 held
    /// assertions and 100 listed, refuses the rest (one line in the launch's log, the count in
    /// the record), and its resident memory stays within 24 MiB of what it was before the
    /// launch, during the flood and after. (Before: 3.6 M grew the host by 97 MiB, kept.)
    @Test func aFloodOfForgedBackgroundTimeMessagesIsBoundedAndCounted() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        host.environment["BGTASK_TEST_FLOOD_COUNT"] = "2000000"
        try host.install("Hostile", info: "Tests/Fixtures/Hostile/Info.plist", as: "Hostile.app")
        try host.start()
        defer { host.stop() }
        // A launch first, so that what a launch costs the host is in the baseline.
        _ = try host.cli(["simulate-launch", "\(Self.id).forgelog", "--force", "--type", "processing", "--json"])
        let before = Self.residentBytes(host.pid)
        let peak = LockedValue<UInt64>(0)
        let sampling = LockedValue(true)
        let sampler = Thread {
            while sampling.withLock({ $0 }) {
                let now = Self.residentBytes(host.pid)
                peak.withLock { $0 = max($0, now) }
                usleep(20_000)
            }
        }
        sampler.start()
        let result = try host.cli(["simulate-launch", "\(Self.id).btflood", "--force", "--type", "processing", "--json"])
        sampling.withLock { $0 = false }
        usleep(50_000)
        let after = Self.residentBytes(host.pid)
        let record = try RunRecord.decode(Data(result.stdout.utf8))
        let log = try record.logText()
        let forged = try #require(log.split(separator: "\n").first { $0.hasPrefix("hostile: forged ") }, "\(log)")
        let sent = try #require(Int(forged.split(separator: " ")[2]))
        print("flood: \(sent) messages; host VmRSS before \(before >> 10) KiB, peak \(peak.withLock { $0 } >> 10) KiB, after \(after >> 10) KiB")
        #expect(sent > 100_000, "the flood reached the host: \(sent)")
        #expect(record.task("\(Self.id).btflood")?.outcome == .succeeded)
        #expect(record.backgroundTime?.count == InputLimits.recordListEntries)
        #expect(record.listEntriesOmitted?["background_time"] == LaunchState.heldBackgroundTimeLimit - InputLimits.recordListEntries)
        #expect(record.messagesRefused?["background_time_began"] == sent - LaunchState.heldBackgroundTimeLimit, "\(record.messagesRefused ?? [:])")
        #expect(log.components(separatedBy: "the host refused a background_time_began message").count == 2, "logged once")
        let bound: UInt64 = 24 << 20
        #expect(peak.withLock { $0 } < before + bound, "peak \(peak.withLock { $0 }) over \(before) + 24 MiB")
        #expect(after < before + bound, "after \(after) over \(before) + 24 MiB")
        #expect(try host.send(.status).ok == true)
    }

    // MARK: Exhaustion: records

    /// 100,000 real registrations (continued-processing identifiers, allowed after launch):
    /// the record lists 100 and counts the rest, fits a control frame, `simulate-launch`
    /// answers with it and `history` has it.
    @Test func aHundredThousandRegistrationsStillMakeADeliverableRecord() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        try host.install("Hostile", info: "Tests/Fixtures/Hostile/Info.plist", as: "Hostile.app")
        try host.start()
        defer { host.stop() }
        let result = try host.cli(["simulate-launch", "\(Self.id).registerflood", "--force", "--type", "processing", "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        let record = try RunRecord.decode(Data(result.stdout.utf8))
        #expect(try record.logText().contains("hostile: registered 100000 identifiers"))
        #expect(record.registered.count == InputLimits.recordListEntries)
        // The launch entry's (every permitted identifier but the wildcard) and the 100,000.
        let plist = try String(contentsOfFile: Products.packageRoot.appendingPathComponent("Tests/Fixtures/Hostile/Info.plist").path, encoding: .utf8)
        let entry = plist.split(separator: "\n").filter { $0.contains("<string>\(Self.id).") && !$0.contains(".*<") }.count
        #expect(record.listEntriesOmitted?["registered"] == 100_000 + entry - InputLimits.recordListEntries, "\(record.listEntriesOmitted ?? [:])")
        #expect(try record.jsonData().count < RunRecord.maximumBytes)
        let history = try host.send(.history(limit: 100)).records ?? []
        #expect(history.contains { $0.launchID == record.launchID })
    }

    /// Past every list's bound, a record whose entries are long is still cut to fit
    /// `RunRecord.maximumBytes`, and says how much it left out.
    @Test func aRecordIsCutToFitAControlFrame() throws {
        let long = String(repeating: "\u{1}", count: 255)
        var record = RunRecord(
            app: "a.b", launchID: "L", reason: "simulated", tasks: [], termination: .exited, signal: nil, exitStatus: 0,
            error: String(repeating: "e", count: 100_000), wallMs: 1, cpuMs: 1, peakRSSBytes: 0, memoryLimitBytes: 0,
            memoryMechanism: "sampler", budgetMs: 1, graceMs: 1, expiredAtMs: nil, pid: 1, startedAt: Date(), bundlePath: "/b",
            log: nil, registered: (0..<1000).map { "\(long)\($0)" }, refusedRegistrations: (0..<100).map { "\(long)\($0)" },
            submitted: [], launcher: "spawn")
        record.notificationsAdded = (0..<100).map { "\(long)\($0)" }
        #expect(try record.jsonData().count > RunRecord.maximumBytes)
        record.fitToFrame()
        let size = try record.jsonData().count
        #expect(size <= RunRecord.maximumBytes, "\(size)")
        #expect((record.error?.utf8.count ?? 0) < RunRecord.maximumErrorBytes + 100)
        let omitted = record.listEntriesOmitted ?? [:]
        #expect(record.registered.count + (omitted["registered"] ?? 0) == 1000, "\(omitted)")
        let encoded = try record.jsonData()
        #expect(RecordJSON.record(record).map { Data($0.utf8) } == encoded)
    }

    // MARK: Confused deputy: app groups

    /// The Hostile app naming group.com.example.iosapp (IOSApp's, claimed at its first launch)
    /// gets no container for it: the record and `bgtask validate --state` say why, and the
    /// app can neither read the owner's file nor write one there. The operator's grant gives
    /// it the group; a grant file others can write is ignored.
    @Test func anAppGroupIsOnlyItsOwnersItsExtensionsAndTheOperatorsGrantees() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let owner = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Info.plist", name: "IOSApp.app")
        let (first, _) = try scratch.run(owner, ["--task", "com.example.iosapp.files:processing"])
        #expect(first.appGroupsRefused == nil)
        let group = scratch.state.appendingPathComponent("groups/group.com.example.iosapp")
        try "the owner's\n".write(to: group.appendingPathComponent("secret.txt"), atomically: true, encoding: .utf8)
        #expect(chmod(group.appendingPathComponent("secret.txt").path, 0o660) == 0)

        // The hostile bundle names the owner's group.
        let plist = try String(contentsOfFile: Products.packageRoot.appendingPathComponent("Tests/Fixtures/Hostile/Info.plist").path, encoding: .utf8)
        let claiming = plist.replacingOccurrences(of: "<key>UIBackgroundModes</key>", with: """
            <key>Entitlements</key><dict><key>com.apple.security.application-groups</key>\
            <array><string>group.com.example.iosapp</string></array></dict>
            <key>UIBackgroundModes</key>
            """)
        let info = scratch.url.appendingPathComponent("Claiming-Info.plist")
        try claiming.write(to: info, atomically: true, encoding: .utf8)
        let hostile = scratch.url.appendingPathComponent("Claiming.app")
        let made = try runCLI(["bundle", "--library", Products.library("Hostile"), "--info", info.path, "--output", hostile.path])
        try #require(made.status == 0, "\(made.stderr)")

        let validate = try runCLI(["validate", hostile.path, "--state", scratch.state.path])
        #expect(validate.stdout.contains("app group refused: app group 'group.com.example.iosapp' belongs to com.example.iosapp"), "\(validate.stdout)")
        let (refused, _) = try scratch.run(hostile, ["--task", "\(Self.id).groupsteal"])
        let why = try #require(refused.appGroupsRefused?["group.com.example.iosapp"], "\(refused)")
        #expect(why.contains("belongs to com.example.iosapp") && why.contains("app-group-grants"), "\(why)")
        #expect(try refused.logText().contains("[bgtask error] \(why)"))
        let probed = try results(refused)
        #expect(probed["read another app's group container"]?.hasPrefix("denied") == true, "\(probed)")
        #expect(probed["write another app's group container"]?.hasPrefix("denied") == true, "\(probed)")
        #expect(!FileManager.default.fileExists(atPath: group.appendingPathComponent("stolen.txt").path))

        // A grant file anyone may write is no grant.
        let grants = scratch.state.appendingPathComponent("app-group-grants")
        try "group.com.example.iosapp \(Self.id)\n".write(to: grants, atomically: true, encoding: .utf8)
        #expect(chmod(grants.path, 0o666) == 0)
        let (stillRefused, _) = try scratch.run(hostile, ["--task", "\(Self.id).groupsteal"])
        #expect(stillRefused.appGroupsRefused?["group.com.example.iosapp"] != nil)

        // The operator's grant.
        #expect(chmod(grants.path, 0o644) == 0)
        let (granted, _) = try scratch.run(hostile, ["--task", "\(Self.id).groupsteal"])
        #expect(granted.appGroupsRefused == nil, "\(granted.appGroupsRefused ?? [:])")
        let grantedProbes = try results(granted)
        #expect(grantedProbes["read another app's group container"] == "ALLOWED", "\(grantedProbes)")
        let validated = try runCLI(["validate", hostile.path, "--state", scratch.state.path])
        #expect(!validated.stdout.contains("app group refused"), "\(validated.stdout)")
    }

    /// The owner decides per app, not per bundle: an extension claims as its app, so the
    /// first app's extension has the group, another app's does not.
    @Test func extensionsShareTheirAppsGroupsAndNoOneElses() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let owners = AppGroupOwners(stateDirectory: scratch.state)
        try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
        #expect(try owners.decide(app: "com.a", groups: ["group.com.a"], claim: true).granted == ["group.com.a"])
        // com.a's extension decides as com.a (LaunchSupervisor passes containingApp).
        #expect(try owners.decide(app: "com.a", groups: ["group.com.a", "group.com.a.more"], claim: true).granted == ["group.com.a", "group.com.a.more"])
        let other = try owners.decide(app: "com.b", groups: ["group.com.a", "group.com.b"], claim: true)
        #expect(other.granted == ["group.com.b"])
        #expect(other.refused["group.com.a"]?.contains("belongs to com.a") == true)
        // Kept across processes: a new reader sees the same owners.
        #expect(try AppGroupOwners(stateDirectory: scratch.state).decide(app: "com.b", groups: ["group.com.a"], claim: false).refused.count == 1)
    }

    // MARK: Forgery: finished

    /// A forged `finished` under a host that confines (its own uid, PID namespace, Landlock,
    /// seccomp): the launch that runs on is the host's kill, and the record says so and why.
    @Test(arguments: ["forgefinished", "forgefinishedchild"])
    func aForgedFinishedIsRecordedAsTheHostsKill(handler: String) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        try host.install("Hostile", info: "Tests/Fixtures/Hostile/Info.plist", as: "Hostile.app")
        try host.start()
        defer { host.stop() }
        let result = try host.cli(["simulate-launch", "\(Self.id).\(handler)", "--force", "--type", "processing", "--json"])
        let record = try RunRecord.decode(Data(result.stdout.utf8))
        #expect(record.termination == .watchdog, "\(record)")
        #expect(record.error?.contains("said its tasks had ended but its process was still running") == true, "\(record.error ?? "")")
    }
}

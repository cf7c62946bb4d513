@testable import BGTaskHost
import BGTaskControl
import BGTaskDashboard
import BGTaskModel
import Foundation
import Testing

/// The store writes records, task lists and registered identifiers with `RecordJSON`, not
/// `JSONEncoder`: its text must be the encoder's, byte for byte, whatever the record holds.
@Suite struct RecordJSONTests {
    /// Every optional field of the record, and of everything in it, set: a field added to
    /// `RunRecord` (or renamed) that `RecordJSON` does not write makes this fail, once the
    /// fixture sets it (the first check says which field it lacks).
    @Test func aRecordWithEveryFieldSetIsTheEncodersText() throws {
        let record = Self.everyField()
        let missing = Self.nilOptionals(in: record)
        #expect(missing.isEmpty, "the fixture leaves these unset, so RecordJSON's handling of them is not checked: \(missing)")
        let encoded = String(decoding: try record.jsonData(), as: UTF8.self)
        let written = try #require(RecordJSON.record(record))
        #expect(written == encoded)
    }

    /// Fields present and absent in every mix, numbers of every size, text that needs escaping.
    @Test func recordsOfEveryShapeAreTheEncodersText() throws {
        var generator = SystemRandomNumberGenerator()
        var differing: [String] = []
        for _ in 0..<400 {
            let record = Self.randomRecord(&generator)
            let encoded = String(decoding: try record.jsonData(), as: UTF8.self)
            let written = try #require(RecordJSON.record(record))
            if written != encoded { differing.append("\(written.prefix(400))…\n  encoder: \(encoded.prefix(400))…") }
        }
        #expect(differing.isEmpty, "\(differing.count) of 400 differ; the first: \(differing.first ?? "")")
    }

    /// A number the encoder refuses (infinity, NaN): no text, so that the store asks the
    /// encoder and reports its error instead of storing a record no decoder reads.
    @Test func aNumberTheEncoderRefusesGivesNoText() {
        for value in [Double.infinity, -Double.infinity, Double.nan] {
            var record = Self.everyField()
            record.wallMs = value
            #expect(RecordJSON.record(record) == nil)
            #expect(throws: (any Error).self) { try record.jsonData() }
            record = Self.everyField()
            record.tasks[0].completedMs = value
            #expect(RecordJSON.record(record) == nil)
        }
    }

    @Test func taskListsAndIdentifiersAreTheEncodersText() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let lists: [[String]] = [[], ["a"], ["com.example.refresh", "tab\there", "quote\"back\\slash/", "é🙂", "\u{01}\u{1f}"]]
        for list in lists {
            #expect(RecordJSON.strings(list) == String(decoding: try encoder.encode(list), as: UTF8.self))
        }
        let tasks = [
            TaskAssignment(task: 1, identifier: "com.example.refresh", kind: .refresh),
            TaskAssignment(task: UInt64.max, identifier: "p/\"q\"", kind: .processing),
            TaskAssignment(task: 3, identifier: "c.*", kind: .continuedProcessing),
            TaskAssignment(task: 4, identifier: "h", kind: .healthResearch),
        ]
        for count in 0...tasks.count {
            let list = Array(tasks.prefix(count))
            #expect(RecordJSON.tasks(list) == String(decoding: try encoder.encode(list), as: UTF8.self))
        }
    }

    // MARK: Fixtures

    static let awkward = "a \"quoted\" back\\slash, a /path/, a tab\t, a newline\n, \u{08}\u{0c}\r, \u{00}\u{1b}\u{7f}, é, 🙂"

    static func everyField() -> RunRecord {
        var record = RunRecord(
            app: "com.example.app", launchID: "20261126T120000-0badc0de", reason: "scheduled",
            tasks: [
                .init(identifier: "com.example.refresh", type: .refresh, outcome: .expired, startedMs: 1.5, completedMs: 1234.25,
                      expiredMs: 1000, expirationHandled: true, success: false),
                .init(identifier: awkward, type: .processing, outcome: .succeeded, startedMs: 0.001, completedMs: 2,
                      expiredMs: 1e-7, expirationHandled: false, success: true),
            ],
            termination: .watchdog, signal: "SIGKILL", exitStatus: -1, error: awkward, wallMs: 30_000.125, cpuMs: 12.5,
            peakRSSBytes: UInt64.max, memoryLimitBytes: 64 << 20, memoryMechanism: "sampler", processLimit: 128,
            budgetMs: 30_000, graceMs: 1_000, expiredAtMs: 29_999.999, pid: 4_194_304,
            startedAt: Date(timeIntervalSince1970: 1_795_000_000.123), bundlePath: "/var/lib/bgtask/plugins/App.bundle",
            log: "/var/lib/bgtask/logs/20261126T120000-0badc0de.log", logTruncated: true, logBytesDropped: 1 << 40,
            refusedRegistrationsOmitted: 3, submittedOmitted: 4,
            registered: ["com.example.refresh", awkward], refusedRegistrations: ["com.example.other"],
            submitted: [
                TaskRequest(kind: .refresh, identifier: "r", earliestBeginDate: 1_795_000_900.5, title: "not written", subtitle: "for a refresh"),
                TaskRequest(kind: .processing, identifier: "p", earliestBeginDate: 0, requiresNetworkConnectivity: true,
                            requiresExternalPower: false, protectionType: 2, title: "t", subtitle: "s", strategyFail: true, requiredResources: 1),
                TaskRequest(kind: .continuedProcessing, identifier: "c.1", earliestBeginDate: -1, requiresNetworkConnectivity: true,
                            requiresExternalPower: true, protectionType: 1, title: awkward, subtitle: "sub", strategyFail: true, requiredResources: 7),
                TaskRequest(kind: .healthResearch, identifier: "h", earliestBeginDate: 1e20, requiresNetworkConnectivity: false,
                            requiresExternalPower: true, protectionType: 3, title: "x", subtitle: "y", strategyFail: false, requiredResources: 2),
            ],
            launcher: "zygote")
        record.sandbox = [
            "landlock": SandboxLayer(applied: true, detail: "ABI 7"), "seccomp": SandboxLayer(applied: true, detail: "filter"),
            "no_new_privs": SandboxLayer(applied: true, detail: "set"), "pid_namespace": SandboxLayer(applied: false, detail: awkward),
            "uid": SandboxLayer(applied: true, detail: "uid 70001"),
        ]
        record.backgroundTime = [
            .init(id: 1, name: "upload", outcome: .endedAfterExpiration, beganMs: 3, endedMs: 31_000, expiredMs: 30_000, expirationHandled: true),
            .init(id: UInt64.max, name: awkward, outcome: .notEnded, beganMs: 0.5, endedMs: 0, expiredMs: 0, expirationHandled: false),
        ]
        record.push = .init(id: "5A1C2B3D-0000-4000-8000-000000000001", receivedAt: Date(timeIntervalSince1970: 1_794_999_999.5),
                            deliveredAfterMs: 0.75, result: "new-data", completedMs: 12)
        record.notificationsAdded = ["n1", awkward]
        record.transfers = .init(delivered: ["t1", "t2"], sessions: ["com.example.session", awkward])
        record.disk = .init(bytes: UInt64.max, inodes: 12, quotaBytes: 1 << 30, quotaInodes: 100_000, enforcement: awkward,
                            exceeded: awkward, logError: awkward)
        record.listEntriesOmitted = ["registered": 99_910, "background_time": 924, awkward: 1]
        record.messagesRefused = ["background_time_began": 3_600_000, "progress": 2, "é": 0]
        record.appGroupsRefused = ["group.com.example.other": awkward, "group.b": "owned"]
        record.resumed = true
        record.suspendedMs = 86_400_000.125
        record.processLaunches = Int.max
        record.previousProcess = awkward
        record.expirationReason = awkward
        record.notificationsPresented = [awkward: "banner, sound", "n2": "not shown"]
        record.metricsDelivered = true
        record.energy = .init(diskWrittenBytes: UInt64.max, diskReadBytes: 0, wakeups: 1 << 40, networkSentBytes: 1 << 33,
                              networkReceivedBytes: UInt64.max - 1, cpuLimit: awkward)
        return record
    }

    static func randomRecord(_ generator: inout SystemRandomNumberGenerator) -> RunRecord {
        func maybe<T>(_ value: @autoclosure () -> T) -> T? { Bool.random(using: &generator) ? value() : nil }
        func number() -> Double {
            switch Int.random(in: 0..<6, using: &generator) {
            case 0: return Double(Int.random(in: 0...100_000, using: &generator))
            case 1: return Double.random(in: 0...100_000, using: &generator)
            case 2: return Double.random(in: -1...1, using: &generator) * 1e-9
            case 3: return Double.random(in: 1e15...1e22, using: &generator)
            case 4: return (Double.random(in: 0...100_000, using: &generator) * 1000).rounded() / 1000
            default: return -Double.random(in: 0...10, using: &generator)
            }
        }
        func text() -> String {
            let pieces = ["a", "/", "\"", "\\", "\n", "\u{01}", "é", "🙂", "com.example", " ", "\t", "\u{7f}"]
            return (0..<Int.random(in: 0...8, using: &generator)).map { _ in pieces.randomElement(using: &generator)! }.joined()
        }
        let kinds: [TaskKind] = [.refresh, .processing, .continuedProcessing, .healthResearch]
        var record = RunRecord(
            app: text(), launchID: text(), reason: text(),
            tasks: (0..<Int.random(in: 0...3, using: &generator)).map { _ in
                .init(identifier: text(), type: kinds.randomElement(using: &generator)!,
                      outcome: [.succeeded, .failed, .expired, .unfinished, .notRegistered].randomElement(using: &generator)!,
                      startedMs: maybe(number()), completedMs: maybe(number()), expiredMs: maybe(number()),
                      expirationHandled: maybe(Bool.random(using: &generator)), success: maybe(Bool.random(using: &generator)))
            },
            termination: [.exited, .watchdog, .jetsam, .disk, .cpuLimit, .crashed, .launchFailed, .hostLost].randomElement(using: &generator)!,
            signal: maybe(text()), exitStatus: maybe(Int32.random(in: .min ... .max, using: &generator)), error: maybe(text()),
            wallMs: number(), cpuMs: number(), peakRSSBytes: UInt64.random(in: 0 ... .max, using: &generator),
            memoryLimitBytes: UInt64.random(in: 0...(1 << 40), using: &generator), memoryMechanism: text(),
            processLimit: maybe(Int.random(in: .min ... .max, using: &generator)), budgetMs: number(), graceMs: number(),
            expiredAtMs: maybe(number()), pid: Int32.random(in: 0 ... .max, using: &generator),
            startedAt: Date(timeIntervalSince1970: Double(Int64.random(in: 0...4_102_444_800_000, using: &generator)) / 1000),
            bundlePath: text(), log: maybe(text()), logTruncated: maybe(Bool.random(using: &generator)),
            logBytesDropped: maybe(UInt64.random(in: 0 ... .max, using: &generator)),
            refusedRegistrationsOmitted: maybe(Int.random(in: 0...1000, using: &generator)),
            submittedOmitted: maybe(Int.random(in: 0...1000, using: &generator)),
            registered: (0..<Int.random(in: 0...3, using: &generator)).map { _ in text() },
            refusedRegistrations: (0..<Int.random(in: 0...2, using: &generator)).map { _ in text() },
            submitted: (0..<Int.random(in: 0...4, using: &generator)).map { _ in
                TaskRequest(kind: kinds.randomElement(using: &generator)!, identifier: text(), earliestBeginDate: maybe(number()),
                            requiresNetworkConnectivity: Bool.random(using: &generator), requiresExternalPower: Bool.random(using: &generator),
                            protectionType: Int32.random(in: -5...5, using: &generator), title: maybe(text()), subtitle: maybe(text()),
                            strategyFail: Bool.random(using: &generator), requiredResources: UInt32.random(in: 0 ... .max, using: &generator))
            },
            launcher: maybe(text()))
        record.expirationReason = maybe(text())
        record.notificationsPresented = maybe([text(): text()])
        record.metricsDelivered = maybe(Bool.random(using: &generator))
        record.energy = maybe(RunRecord.EnergyRecord(diskWrittenBytes: UInt64.random(in: 0 ... .max, using: &generator),
                                                     diskReadBytes: UInt64.random(in: 0 ... .max, using: &generator),
                                                     wakeups: UInt64.random(in: 0 ... .max, using: &generator),
                                                     networkSentBytes: maybe(UInt64.random(in: 0 ... .max, using: &generator)),
                                                     networkReceivedBytes: maybe(UInt64.random(in: 0 ... .max, using: &generator)), cpuLimit: maybe(text())))
        if Bool.random(using: &generator) {
            record.sandbox = Dictionary(uniqueKeysWithValues: SandboxLayer.names.filter { _ in Bool.random(using: &generator) }.map {
                ($0, SandboxLayer(applied: Bool.random(using: &generator), detail: text()))
            })
        }
        record.backgroundTime = maybe((0..<Int.random(in: 0...2, using: &generator)).map { _ in
            RunRecord.BackgroundTimeRecord(
                id: UInt64.random(in: 0 ... .max, using: &generator), name: maybe(text()),
                outcome: [.ended, .endedAfterExpiration, .notEnded].randomElement(using: &generator)!, beganMs: number(),
                endedMs: maybe(number()), expiredMs: maybe(number()), expirationHandled: maybe(Bool.random(using: &generator)))
        })
        record.push = maybe(RunRecord.PushRecord(
            id: text(), receivedAt: Date(timeIntervalSince1970: Double(Int64.random(in: 0...4_102_444_800_000, using: &generator)) / 1000),
            deliveredAfterMs: number(), result: maybe(text()), completedMs: maybe(number())))
        record.notificationsAdded = maybe((0..<Int.random(in: 0...2, using: &generator)).map { _ in text() })
        record.transfers = maybe(RunRecord.TransfersRecord(delivered: (0..<Int.random(in: 0...2, using: &generator)).map { _ in text() },
                                                           sessions: maybe([text()])))
        record.disk = maybe(RunRecord.DiskRecord(
            bytes: maybe(UInt64.random(in: 0 ... .max, using: &generator)), inodes: maybe(UInt64.random(in: 0...1_000_000, using: &generator)),
            quotaBytes: UInt64.random(in: 0 ... .max, using: &generator), quotaInodes: UInt64.random(in: 0...1_000_000, using: &generator),
            enforcement: maybe(text()), exceeded: maybe(text()), logError: maybe(text())))
        record.listEntriesOmitted = maybe([text(): Int.random(in: 0...1_000_000, using: &generator), "registered": 5])
        record.messagesRefused = maybe([text(): Int.random(in: 0...1_000_000, using: &generator)])
        record.appGroupsRefused = maybe([text(): text(), "group.a": text()])
        record.resumed = maybe(Bool.random(using: &generator))
        record.suspendedMs = maybe(Double.random(in: 0...1e9, using: &generator))
        record.processLaunches = maybe(Int.random(in: 1...1_000_000, using: &generator))
        record.previousProcess = maybe(text())
        record.termination = [.exited, .suspended, .watchdog][Int.random(in: 0...2, using: &generator)]
        return record
    }

    /// Paths of the optionals left nil anywhere in `value` (records, arrays, dictionaries).
    /// The dashboard's overview writes its apps and running launches with `RecordJSON`: read
    /// back by `JSONDecoder`, they are what was written, with every field set and with none.
    @Test func theOverviewsAppsAndRunningLaunchesDecodeAsWritten() throws {
        let at = Date(timeIntervalSince1970: 1_795_000_000)
        var app = AppSummary(
            identifier: "com.example.\"quoted\"\\app", path: "/plugins/A.app", permittedIdentifiers: ["a.refresh", "a.\u{e9}t\u{e9}"],
            backgroundModes: ["fetch", "processing"], extensions: ["com.example.ext"], running: "L-1", refreshEnabled: false, penaltyLevel: 2,
            penaltyUntil: at, pending: 7, process: "suspended", processID: 4242, processBytes: 12_345_678, suspendedSince: at,
            processLaunches: 3, lastEviction: "memory pressure: suspended budget", lastEvictionAt: at)
        app.entitlements = ["com.apple.developer.healthkit"]
        app.appGroups = ["group.example"]
        #expect(Self.nilOptionals(in: app, path: "app").isEmpty, "\(Self.nilOptionals(in: app, path: "app"))")
        let bare = AppSummary(identifier: "b", path: "/p", permittedIdentifiers: [], backgroundModes: [], extensions: [], refreshEnabled: true,
                              penaltyLevel: 0, pending: 0)
        let launch = RunningLaunchReport(launchID: "20261127T000000-0000abcd", app: "a\nb", reason: "simulated", role: "background",
                                         identifiers: ["a.refresh"], startedAt: at, budgetMs: 30_000.5, graceMs: 1_000, expired: true,
                                         workOver: true, pid: 99, residentBytes: 1 << 33, memoryLimitBytes: 64 << 20)
        #expect(Self.nilOptionals(in: launch, path: "launch").isEmpty)
        let bareLaunch = RunningLaunchReport(launchID: "x", app: "a", reason: "r", role: "foreground", identifiers: [], startedAt: at,
                                             budgetMs: 0, graceMs: 0, memoryLimitBytes: 0)
        for value in [app, bare] {
            var out = RecordJSON()
            out.app(value)
            #expect(try JSONDecoder.control.decode(AppSummary.self, from: Data(try #require(out.text).utf8)) == value)
        }
        for value in [launch, bareLaunch] {
            var out = RecordJSON()
            out.running(value)
            #expect(try JSONDecoder.control.decode(RunningLaunchReport.self, from: Data(try #require(out.text).utf8)) == value)
        }
    }

    static func nilOptionals(in value: Any, path: String = "record") -> [String] {
        let mirror = Mirror(reflecting: value)
        if mirror.displayStyle == .optional {
            guard let wrapped = mirror.children.first?.value else { return [path] }
            return nilOptionals(in: wrapped, path: path)
        }
        var found: [String] = []
        for (index, child) in mirror.children.enumerated() {
            found += nilOptionals(in: child.value, path: "\(path).\(child.label ?? "\(index)")")
        }
        return found
    }
}

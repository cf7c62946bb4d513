@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskStore
import BGTaskModel
import Foundation
import Testing

/// The scheduling pass on its own, over a table instead of the store: which apps launch, with
/// which requests, when to look again, and when to watch the device.
@Suite struct SchedulerTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    struct Table: SchedulingSource {
        var due: [String]
        var requests: [String: [StoredRequest]]
        var next: Date?
        func dueApps(at now: Date) throws(BGTaskError) -> [String] { due }
        func appState(_ app: String) throws(BGTaskError) -> AppState { AppState(app: app) }
        func pending(app: String?) throws(BGTaskError) -> [StoredRequest] { requests[app ?? ""] ?? [] }
        func nextDueDate(after now: Date) throws(BGTaskError) -> Date? { next }
    }

    func bundle(_ name: String) -> PluginBundle {
        PluginBundle(
            kind: .app, url: URL(fileURLWithPath: "/p/\(name).app"), identifier: "com.example.\(name)", executableName: "lib.so",
            permittedIdentifiers: ["com.example.\(name).r", "com.example.\(name).p"], backgroundModes: ["fetch", "processing"],
            mappedHandlers: [], entitlements: [:], extensionPoint: nil, extensions: [], invalidExtensions: [])
    }

    func stored(_ app: String, _ request: TaskRequest) -> StoredRequest {
        StoredRequest(app: "com.example.\(app)", request: request, submittedAt: now)
    }

    @Test func dueAppsLaunchUpToTheLimitSkippingRunningMissingAndBackingOffApps() throws {
        let apps = ["a", "b", "c", "d", "e"]
        var requests: [String: [StoredRequest]] = [:]
        for app in apps { requests["com.example.\(app)"] = [stored(app, TaskRequest(kind: .refresh, identifier: "com.example.\(app).r"))] }
        let table = Table(due: apps.map { "com.example.\($0)" } + ["com.example.gone"], requests: requests, next: now.addingTimeInterval(600))
        let catalog = Dictionary(uniqueKeysWithValues: apps.map { ("com.example.\($0)", bundle($0)) })
        let eligibility = Eligibility(policy: .immediate, now: now, conditions: DeviceConditions(), runningLaunches: 1, maximumConcurrentLaunches: 3)
        let decision = try Scheduler(eligibility: eligibility).decide(
            from: table, catalog: catalog, running: ["com.example.a"], runningCount: 1, maximumLaunches: 3,
            backingOff: { $0 == "com.example.b" })
        #expect(decision.launches.map(\.app.identifier) == ["com.example.c", "com.example.d"], "a runs, b backs off; two slots left")
        #expect(decision.launches.allSatisfy { $0.requests.count == 1 })
        #expect(decision.wakeAt == now.addingTimeInterval(600))
        #expect(!decision.watchConditions)
    }

    @Test func heldBackRequestsSetTheWakeUpAndTheDeviceWatch() throws {
        let later = TaskRequest(kind: .refresh, identifier: "com.example.a.r", earliestBeginDate: now.timeIntervalSince1970 + 60)
        let needsPower = TaskRequest(kind: .processing, identifier: "com.example.a.p", requiresExternalPower: true)
        let table = Table(due: ["com.example.a"], requests: ["com.example.a": [stored("a", later), stored("a", needsPower)]], next: nil)
        var device = DeviceConditions()
        device.externalPower = false
        let eligibility = Eligibility(policy: .immediate, now: now, conditions: device, runningLaunches: 0, maximumConcurrentLaunches: 2)
        let decision = try Scheduler(eligibility: eligibility).decide(
            from: table, catalog: ["com.example.a": bundle("a")], running: [], runningCount: 0, maximumLaunches: 2, backingOff: { _ in false })
        #expect(decision.launches.isEmpty)
        #expect(decision.wakeAt == now.addingTimeInterval(60), "when the first request becomes due")
        #expect(decision.watchConditions, "power may come back at any moment")
    }
}

/// What each scheduling pass asks of the running launches (`RunningTally`), counted as they
/// come and go: it must agree with counting them all, whatever order they come and go in.
@Suite struct RunningTallyTests {
    func launch(_ id: String, app: String, role: LaunchRole, kinds: [TaskKind]) -> LaunchCoordinator.RunningLaunch {
        LaunchCoordinator.RunningLaunch(
            id: id, app: app, reason: "scheduled",
            tasks: kinds.enumerated().map { TaskAssignment(task: UInt64($0.offset + 1), identifier: "t\($0.offset)", kind: $0.element) },
            requests: [:], control: LaunchControl(), role: role)
    }

    @Test func theTallyAgreesWithCountingEveryLaunch() {
        var tally = RunningTally()
        var running: [String: LaunchCoordinator.RunningLaunch] = [:]
        func check(_ when: String) {
            #expect(tally.busy == running.values.filter { !$0.workOver }.count, "busy, \(when)")
            #expect(tally.apps == Set(running.values.map(\.app)), "apps, \(when)")
            #expect(tally.clientStarted == running.values.filter { $0.role == .foreground || $0.role == .extension }.count, "client-started, \(when)")
            #expect((tally.background > 0) == running.values.contains { $0.role != .foreground }, "background, \(when)")
            #expect((tally.processing > 0) == running.values.contains { $0.tasks.contains { $0.kind == .processing || $0.kind == .healthResearch } },
                    "processing, \(when)")
        }
        let launches = [
            launch("a", app: "one", role: .background, kinds: [.refresh]),
            launch("b", app: "one", role: .foreground, kinds: []),
            launch("c", app: "two", role: .background, kinds: [.processing, .refresh]),
            launch("d", app: "three", role: .extension, kinds: [.healthResearch]),
        ]
        for launch in launches {
            running[launch.id] = launch
            tally.noteAdded(launch)
            check("after \(launch.id) began")
        }
        #expect(tally.unenforced == ["a", "b", "c", "d"])
        // A background launch's work ends before its record comes back; another's never does.
        running["c"]?.workOver = true
        tally.noteWorkOver()
        check("after c's work ended")
        for id in ["a", "c", "b", "d"] {
            tally.noteRemoved(running.removeValue(forKey: id)!)
            check("after \(id) ended")
        }
        #expect(tally.busy == 0 && tally.apps.isEmpty && tally.background == 0 && tally.processing == 0 && tally.clientStarted == 0)
    }
}

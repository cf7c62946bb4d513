@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// The pure scheduling decision behind both the scheduler and `why`.
@Suite struct EligibilityTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)
    let app = PluginBundle(
        kind: .app, url: URL(fileURLWithPath: "/p/A.app"), identifier: "com.example.a", executableName: "libA.so",
        permittedIdentifiers: ["com.example.a.r", "com.example.a.p"], backgroundModes: ["fetch", "processing"],
        mappedHandlers: [], entitlements: [PluginBundle.healthResearchEntitlement: true], extensionPoint: nil,
        extensions: [], invalidExtensions: [])

    func codes(_ request: TaskRequest, conditions: DeviceConditions = DeviceConditions(), policy: SchedulingPolicy = .immediate,
               state: AppState? = nil, running: Int = 0, appRunning: Bool = false) -> [String] {
        let eligibility = Eligibility(policy: policy, now: now, conditions: conditions, runningLaunches: running, maximumConcurrentLaunches: 2)
        return eligibility.blockers(for: StoredRequest(app: app.identifier, request: request, submittedAt: now), app: app,
                                    state: state ?? AppState(app: app.identifier), appRunning: appRunning).map(\.code)
    }

    @Test func aDueRequestWithItsConditionsIsEligible() {
        #expect(codes(TaskRequest(kind: .refresh, identifier: "com.example.a.r")).isEmpty)
        #expect(codes(TaskRequest(kind: .refresh, identifier: "com.example.a.r", earliestBeginDate: now.timeIntervalSince1970)).isEmpty,
                "earliestBeginDate is a floor: due at that instant")
    }

    @Test func everyConditionIsNamed() {
        let later = TaskRequest(kind: .refresh, identifier: "com.example.a.r", earliestBeginDate: now.timeIntervalSince1970 + 60)
        #expect(codes(later) == ["not-due"])
        var off = DeviceConditions()
        off.backgroundRefresh = false
        off.lowPowerMode = true
        #expect(codes(TaskRequest(kind: .refresh, identifier: "com.example.a.r"), conditions: off) == ["refresh-disabled", "low-power-mode"])
        var state = AppState(app: app.identifier)
        state.refreshEnabled = false
        #expect(codes(TaskRequest(kind: .refresh, identifier: "com.example.a.r"), state: state) == ["app-refresh-disabled"])
        var device = DeviceConditions()
        device.externalPower = false
        device.network = false
        device.idle = false
        let needy = TaskRequest(kind: .processing, identifier: "com.example.a.p", requiresNetworkConnectivity: true, requiresExternalPower: true)
        #expect(codes(needy, conditions: device) == ["device-not-idle", "no-external-power", "no-network"])
        #expect(codes(TaskRequest(kind: .processing, identifier: "com.example.a.p"), running: 2) == ["concurrency"])
        #expect(codes(TaskRequest(kind: .processing, identifier: "com.example.a.p"), appRunning: true) == ["app-running"])
    }

    @Test(arguments: [(Int32(1), true, true, true), (1, false, true, false), (2, true, true, true),
                      (3, true, true, false), (3, false, false, true), (0, true, false, false)])
    func dataProtection(protection: Int32, locked: Bool, unlockedSinceBoot: Bool, blocked: Bool) {
        var device = DeviceConditions()
        device.locked = locked
        device.unlockedSinceBoot = unlockedSinceBoot
        let request = TaskRequest(kind: .healthResearch, identifier: "com.example.a.p", protectionType: protection)
        #expect(codes(request, conditions: device).contains("data-protected") == blocked)
    }

    @Test func realisticPenaltiesDoubleAndRateLimitRefreshes() {
        #expect(SchedulingPolicy.penalty(level: 1) == 30 * 60)
        #expect(SchedulingPolicy.penalty(level: 2) == 60 * 60)
        #expect(SchedulingPolicy.penalty(level: 20) == 24 * 60 * 60)
        var state = AppState(app: app.identifier)
        state.penaltyLevel = 1
        state.penaltyUntil = now.addingTimeInterval(60)
        state.lastLaunchAt = now.addingTimeInterval(-60)
        // Opened an hour ago, with no habit yet: its usage pattern holds nothing back.
        state.opens = [now.addingTimeInterval(-3_600)]
        let refresh = TaskRequest(kind: .refresh, identifier: "com.example.a.r")
        #expect(codes(refresh, policy: .realistic, state: state) == ["penalty", "rate-limit"])
        #expect(codes(refresh, policy: .immediate, state: state).isEmpty, "immediate ignores both")
    }

    @Test func aHandlerTheLastLaunchDidNotRegisterIsANoteNotABlocker() {
        var state = AppState(app: app.identifier)
        state.lastRegistered = ["com.example.a.p"]
        let eligibility = Eligibility(policy: .immediate, now: now, conditions: DeviceConditions(), runningLaunches: 0, maximumConcurrentLaunches: 2)
        let blockers = eligibility.blockers(for: StoredRequest(app: app.identifier, request: TaskRequest(kind: .refresh, identifier: "com.example.a.r"), submittedAt: now),
                                            app: app, state: state, appRunning: false)
        #expect(blockers.map(\.code) == ["handler-not-registered"])
        #expect(blockers.allSatisfy { !$0.blocking })
    }
}

import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// Usage patterns: when the user opens an app, what the host predicts from it, and how the
/// realistic policy moves the app's refresh to shortly before its next predicted use.
@Suite struct UsagePatternTests {
    private static let day0 = Date(timeIntervalSince1970: 1_800_057_600)  // a midnight UTC

    private func at(day: Int, _ hour: Int, _ minute: Int = 0) -> Date {
        Self.day0.addingTimeInterval(Double(day) * 86_400 + Double(hour) * 3_600 + Double(minute) * 60)
    }

    @Test func aHabitIsAHalfHourOpenedOnTwoDaysAndTheNextOneIsPredicted() throws {
        // Opened around 08:10 on three days, once at 19:40, and long ago at 12:00 twice.
        let opens = [at(day: 1, 8, 5), at(day: 2, 8, 20), at(day: 3, 8, 12), at(day: 3, 19, 40), at(day: -20, 12), at(day: -19, 12)]
        let prediction = try #require(UsagePrediction.predict(opens: opens, now: at(day: 3, 23)))
        #expect(prediction.next == at(day: 4, 8) && prediction.days == 3 && prediction.timeOfDay == "08:00 UTC")
        // Before the habit's half hour starts on its day, it is that day's.
        #expect(UsagePrediction.predict(opens: opens, now: at(day: 4, 7, 59))?.next == at(day: 4, 8))
        // Once a single day: no habit. Older than the window: forgotten.
        #expect(UsagePrediction.predict(opens: [at(day: 1, 8), at(day: 1, 8, 10), at(day: 2, 19)], now: at(day: 2, 20)) == nil)
        #expect(UsagePrediction.predict(opens: opens, now: at(day: 30, 1)) == nil)
        #expect(!UsagePrediction.wasOpened(opens, before: at(day: 30, 1)))
        // Two habits: the nearer one.
        let two = opens + [at(day: 1, 13, 0), at(day: 2, 13, 29)]
        #expect(UsagePrediction.predict(opens: two, now: at(day: 4, 9))?.next == at(day: 4, 13))
    }

    @Test func theRealisticPolicyRunsARefreshShortlyBeforeTheNextUseAndStarvesAnAppNeverOpened() {
        func blockers(_ state: AppState, at now: Date) -> [Blocker] {
            let eligibility = Eligibility(policy: .realistic, now: now, conditions: DeviceConditions(), runningLaunches: 0, maximumConcurrentLaunches: 4)
            let stored = StoredRequest(app: "com.example.app", request: TaskRequest(kind: .refresh, identifier: "com.example.app.r"), submittedAt: now)
            return eligibility.blockers(for: stored, app: nil, state: state, appRunning: false).filter { $0.code == "usage" }
        }
        var habitual = AppState(app: "com.example.app")
        habitual.opens = [at(day: 1, 8, 5), at(day: 2, 8, 20)]
        habitual.lastLaunchAt = at(day: 2, 8, 20)
        let waiting = blockers(habitual, at: at(day: 2, 10))
        #expect(waiting.count == 1 && waiting[0].blocking && waiting[0].until == at(day: 3, 7, 45), "\(waiting)")
        #expect(waiting.first?.message.contains("usually opened at 08:00 UTC (on 2 of the last 14 days)") == true)
        let due = blockers(habitual, at: at(day: 3, 7, 50))
        #expect(due.count == 1 && !due[0].blocking, "within the lead: a note, not a blocker")

        var used = AppState(app: "com.example.app")
        used.opens = [at(day: 2, 9)]
        used.lastLaunchAt = at(day: 2, 9)
        #expect(blockers(used, at: at(day: 2, 10)).isEmpty, "opened, no habit: the usual interval only")

        var neverOpened = AppState(app: "com.example.app")
        #expect(blockers(neverOpened, at: at(day: 2, 10)).isEmpty, "its first refresh runs")
        neverOpened.lastLaunchAt = at(day: 2, 9)
        let starved = blockers(neverOpened, at: at(day: 2, 10))
        #expect(starved.count == 1 && starved[0].until == at(day: 2, 13), "\(starved)")
        #expect(blockers(neverOpened, at: at(day: 2, 13)).isEmpty)
    }

    /// In a real host on a virtual clock: the user opens the app at 08:00 two days running; a
    /// refresh submitted at 10:00 the second day runs at 07:45 the third, not before.
    @Test func aPredictionMovesARefreshInARealHost() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--policy", "realistic", "--foreground-stay", "100ms"],
                                           installing: [.misbehaving])
        defer { host.stop() }
        let app = "com.example.misbehaving", refresh = "com.example.misbehaving.ok"
        /// Moves the virtual clock to the next `hour`:`minute` UTC.
        func advance(toNext hour: Int, _ minute: Int = 0) throws {
            let now = try host.call(.clock()).now.timeIntervalSince1970
            let target = (now / 86_400).rounded(.down) * 86_400 + Double(hour * 3_600 + minute * 60)
            let seconds = target > now ? target - now : target + 86_400 - now
            _ = try host.call(.clock(advance: seconds.rounded(.up)))
        }
        for day in 1...2 {
            try advance(toNext: 8)
            #expect(try host.cli(["open", app, "--wait"]).status == 0)
            _ = try host.waitForHistory(count: day)
        }
        try advance(toNext: 10)
        #expect(try host.cli(["submit", app, refresh]).status == 0)
        let why = try #require(try host.send(.why(identifier: refresh)).why)
        let usage = try #require(why.blockers.first { $0.code == "usage" }, "\(why.text)")
        #expect(usage.blocking && usage.message.contains("usually opened at 08:00 UTC (on 2 of the last 14 days)"), "\(usage.message)")

        try advance(toNext: 7, 44)
        usleep(300_000)
        #expect(try host.send(.history()).records?.count == 2, "not before the lead")
        _ = try host.call(.clock(advance: 120))
        let records = try host.waitForHistory(count: 3)
        #expect(records[0].task(refresh)?.outcome == .succeeded, "\(records[0])")
    }
}

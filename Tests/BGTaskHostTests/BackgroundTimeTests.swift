@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// Background time (`UIApplication.beginBackgroundTask`) in real launches of an app written
/// around an app delegate (Tests/Fixtures/BackgroundTime): it keeps a launch going past its last
/// task, its expiration handler runs on the main thread before the kill, and the record lists
/// each assertion with its outcome.
@Suite struct BackgroundTimeTests {
    private func launch(_ task: String, _ extra: [String] = []) throws -> (RunRecord, String) {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("BackgroundTime", info: "Tests/Fixtures/BackgroundTime/Info.plist")
        let (record, _) = try scratch.run(bundle, ["--task", "com.example.bgtime.\(task)"] + extra)
        return (record, try record.logText())
    }

    @Test func anAssertionKeepsTheLaunchGoingPastItsLastTask() throws {
        let (record, log) = try launch("linger")
        #expect(record.succeeded, "\(record)")
        #expect(log.contains("bgtime: didFinishLaunching, delegate set: true"))
        #expect(log.contains("bgtime: upload done"), "the work under background time ran: \(log)")
        let assertion = try #require(record.backgroundTime?.first)
        #expect(record.backgroundTime?.count == 1)
        #expect(assertion.name == "upload" && assertion.outcome == .ended && assertion.expiredMs == nil)
        let completed = try #require(record.tasks.first?.completedMs)
        let ended = try #require(assertion.endedMs)
        #expect(ended >= completed + 250, "ended \(ended) ms, task completed \(completed) ms")
        #expect(record.wallMs >= ended)
        #expect(record.description.contains("background time 'upload' ended"))
    }

    @Test func theExpirationHandlerRunsOnTheMainThreadAndMayEndIt() throws {
        let (record, log) = try launch("expire", ["--budget", "1s", "--grace", "2s"])
        #expect(record.termination == .exited, "\(record)")
        #expect(log.contains("bgtime: sync expired on the main thread: true"))
        let assertion = try #require(record.backgroundTime?.first)
        #expect(assertion.outcome == .endedAfterExpiration && assertion.expirationHandled == true)
        let expired = try #require(assertion.expiredMs)
        #expect(expired >= 1000 && expired < 1900, "expired at \(expired) ms for a 1 s budget")
        #expect((assertion.endedMs ?? 0) >= expired)
    }

    @Test func anAssertionNeverEndedIsKilledAtTheGraceAndTheRecordSaysWhy() throws {
        let (record, log) = try launch("hold", ["--budget", "500ms", "--grace", "300ms"])
        #expect(record.termination == .watchdog, "\(record)")
        #expect(log.contains("bgtime: hold expired, not ending it"))
        #expect(record.error?.contains("1 background-time assertion(s) not ended (endBackgroundTask)") == true, "\(record.error ?? "")")
        let assertion = try #require(record.backgroundTime?.first)
        #expect(assertion.outcome == .notEnded && assertion.name == nil && assertion.expirationHandled == true)
        // The task itself succeeded: the kill is the assertion's.
        #expect(record.tasks.first?.outcome == .succeeded)
    }

    @Test func theApplicationObjectReportsTheLaunch() throws {
        let (record, log) = try launch("state", ["--budget", "20s"])
        #expect(record.succeeded, "\(record)")
        // A background launch: state 2 (.background), refresh 2 (.available), and the budget's
        // remaining time.
        let line = try #require(log.split(separator: "\n").first { $0.hasPrefix("bgtime: state ") })
        let fields = line.split(separator: " ")
        #expect(fields[2] == "2," && fields[4] == "2,", "\(line)")
        let remaining = try #require(Double(fields[6]))
        #expect(remaining > 15 && remaining <= 20, "\(line)")
        #expect(log.contains("bgtime: identifiers 1 2, invalid 0"))
        #expect(record.backgroundTime?.map(\.outcome) == [.ended, .ended])
    }

    /// `backgroundRefreshStatus` follows the host's switches: the app's own, then the device's.
    @Test func backgroundRefreshStatusFollowsTheHostsSwitches() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [TestBundle(library: "BackgroundTime", info: "Tests/Fixtures/BackgroundTime/Info.plist", name: "BackgroundTime.app")])
        defer { _ = host.stop() }
        func status() throws -> String {
            let result = try host.cli(["simulate-launch", "com.example.bgtime.state", "--force", "--json"])
            let record = try #require(try? RunRecord.decode(Data(result.stdout.utf8)), "\(result.stderr)")
            let line = try #require(try record.logText().split(separator: "\n").first { $0.hasPrefix("bgtime: state ") })
            return String(line.split(separator: " ")[4].dropLast())
        }
        #expect(try status() == "2")
        #expect(try host.cli(["device", "--app", "com.example.bgtime", "--refresh", "off"]).status == 0)
        #expect(try status() == "1")
        #expect(try host.cli(["device", "--app", "com.example.bgtime", "--refresh", "on"]).status == 0)
        #expect(try status() == "2")
        #expect(try host.cli(["device", "--refresh", "off"]).status == 0)
        #expect(try status() == "1")
    }
}

/// An opened app leaving the foreground, as iOS tells it: `applicationDidBecomeActive` after
/// launching, then `applicationWillResignActive`, `applicationDidEnterBackground` (and their
/// notifications) when it leaves, where it takes background time to save; the launch ends only
/// after that work.
@Suite struct ApplicationStateTests {
    @Test func anOpenedAppHearsItEnterTheBackgroundAndSavesUnderBackgroundTime() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [TestBundle(library: "BackgroundTime", info: "Tests/Fixtures/BackgroundTime/Info.plist", name: "BackgroundTime.app")])
        defer { host.stop() }
        let opened = try host.cli(["open", "com.example.bgtime", "--wait", "--json"])
        let record = try RunRecord.decode(Data(opened.stdout.utf8))
        #expect(record.termination == .suspended, "the app's process is suspended after it: \(record)")
        let lines = try record.logText().split(separator: "\n").map(String.init).filter { $0.hasPrefix("bgtime: ") }
        let expected = [
            "bgtime: didFinishLaunching, delegate set: true",
            "bgtime: didBecomeActive, state 0",
            "bgtime: willResignActive",
            "bgtime: didEnterBackground, state 2, remaining under 60 s: true",
            "bgtime: didEnterBackgroundNotification",
            "bgtime: saved",
        ]
        #expect(lines == expected, "\(lines)")
        let names = record.backgroundTime?.map { $0.name ?? "" } ?? []
        #expect(names.contains("enter-background") && names.contains("save"), "\(names)")
        #expect(record.backgroundTime?.allSatisfy { $0.outcome == .ended } == true, "\(record.backgroundTime ?? [])")
    }
}

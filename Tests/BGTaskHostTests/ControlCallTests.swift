import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// Every command's typed answer (`ControlCall`), read from a real host's answers: what each
/// command must carry is there, and a refusal comes back as the `ControlFailure` it is.
@Suite struct ControlCallTests {
    @Test func everyCommandGetsItsTypedAnswerFromARealHost() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }
        let client = ControlClient(stateDirectory: scratch.state)
        let feed = "com.example.feed", refresh = "com.example.feed.refresh"

        try client.call(.status)
        let page = try client.call(.apps())
        #expect(page.apps.map(\.identifier) == [feed] && page.invalid.isEmpty && page.next == nil)
        let first = try client.call(.apps(limit: 1))
        #expect(first.apps.count == 1)

        try client.call(.submit(app: feed, request: TaskRequest(kind: .refresh, identifier: refresh), delay: 900))
        #expect(try client.call(.pending(app: feed)).map(\.request.identifier) == [refresh])
        let why = try client.call(.why(identifier: refresh))
        #expect(why.request?.state == .pending && why.request?.blockers.map(\.code) == ["not-due"])
        #expect(why.push == nil && why.transfer == nil)
        #expect(try client.call(.cancel(app: feed, identifier: refresh)) == 1)
        #expect(try client.call(.cancel(app: feed, identifier: refresh)) == 0)
        try client.call(.submit(app: feed, request: TaskRequest(kind: .refresh, identifier: refresh), delay: 900))
        #expect(try client.call(.cancelAll(app: feed)) == 1)

        let conditions = try client.call(.device(DeviceChanges([.power: .off])))
        #expect(conditions.externalPower == false)
        let clock = try client.call(.clock())
        #expect(clock.mode == .virtual)
        let advanced = try client.call(.clock(advance: 60))
        #expect(abs(advanced.now.timeIntervalSince(clock.now) - 60) < 1)

        let launch = try client.call(.simulateLaunch(identifier: refresh, app: feed, force: true, kind: .refresh))
        #expect(launch.record?.launchID == launch.launchID)
        #expect(launch.record?.task(refresh)?.outcome == .succeeded)
        let history = try client.call(.history(app: feed))
        #expect(history.records.map(\.launchID) == [launch.launchID] && history.omitted == 0)
        #expect(try client.call(.evict(app: feed)) == true, "the launch left the app suspended (the iOS lifecycle)")
        #expect(try client.call(.evict(app: feed)) == false)

        #expect(try client.call(.progress).isEmpty)
        let notifications = try client.call(.notifications(app: feed))
        #expect(notifications.notifications.isEmpty)
        #expect(try client.call(.pendingNotifications(app: feed)).notifications.isEmpty)
        #expect(try client.call(.pushes()).isEmpty)
        let token = try client.call(.deviceToken(app: feed))
        #expect(token.count == 64 && token.allSatisfy(\.isHexDigit))
        #expect(try client.call(.transfers()).transfers.isEmpty)

        // Refusals are the host's failure, typed.
        #expect(throws: ControlFailure.self) { try client.call(.simulateExpire(identifier: refresh)) }
        #expect(throws: ControlFailure.self) { try client.call(.cancelTask(identifier: "no.such.task")) }
        do {
            _ = try client.call(.deviceToken(app: "com.example.absent"))
            Issue.record("a device token for an app that is not installed")
        } catch {
            #expect(error.code == .notFound, "\(error)")
        }
    }

    @Test func anAnswerWithoutWhatItsCommandCarriesIsNamed() throws {
        do {
            _ = try ControlCall.pending().answer(ControlResponse())
            Issue.record("an answer without 'pending' was read")
        } catch {
            #expect(error.code == .internalError && error.message.contains("'pending'"), "\(error)")
        }
        do {
            _ = try ControlCall.simulateLaunch(identifier: "x").answer(ControlResponse())
            Issue.record("a waited launch without its record was read")
        } catch {
            #expect(error.message.contains("'record'"), "\(error)")
        }
        // A refusal is thrown as the failure it carries, whatever the command.
        let refused = ControlResponse.failure(.notPermitted, "not in BGTaskSchedulerPermittedIdentifiers")
        #expect(throws: ControlFailure(.notPermitted, "not in BGTaskSchedulerPermittedIdentifiers")) {
            try ControlCall.submit(app: "a", request: TaskRequest(kind: .refresh, identifier: "x")).answer(refused)
        }
        // A host that cannot be reached is `unavailable`.
        let nowhere = ControlClient(stateDirectory: URL(fileURLWithPath: "/nonexistent-bgtask-state"))
        #expect(throws: ControlFailure.self) { try nowhere.call(.status) }
    }
}

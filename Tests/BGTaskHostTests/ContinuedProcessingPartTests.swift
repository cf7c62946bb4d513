@testable import BGTaskHost
import BGTaskModel
import Foundation
import Testing

/// The continued-processing part on its own: slots, the queue, strategies, progress, stalls and
/// cancellation, as decisions the host then carries out (ContinuedProcessingTests drives the same
/// through a real host).
@Suite struct ContinuedProcessingPartTests {
    static func request(_ name: String, fail: Bool = false) -> TaskRequest {
        TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.\(name)", title: name, strategyFail: fail)
    }

    @Test func slotsThenTheQueueThenRefusals() {
        var part = ContinuedProcessing(slots: 1, stallInterval: 60)
        let t0 = Date()
        let first = part.admit(Self.request("a"), in: "L1")
        #expect(first == .start)
        part.started(Self.request("a"), task: 1, in: "L1", app: "com.example.app", at: t0)
        let again = part.admit(Self.request("a"), in: "L1")
        #expect(again == .refused(.init(status: .immediateRunIneligible, message: "'com.example.app.export.a' is already running or queued")))
        let second = part.admit(Self.request("b"), in: "L1")
        #expect(second == .queued)
        if case .refused(let rejection) = part.admit(Self.request("c", fail: true), in: "L1") {
            #expect(rejection.status == .immediateRunIneligible && rejection.message.contains("strategy is .fail"))
        } else {
            Issue.record("a .fail request with no free slot was not refused")
        }
        #expect(part.holds("L1"))
        let none = part.nextToStart(isRunning: { _ in true })
        #expect(none == nil, "no free slot yet")
        let endedOnce = part.ended(1, in: "L1", at: t0)
        let endedTwice = part.ended(1, in: "L1", at: t0)
        #expect(endedOnce && !endedTwice, "ended once")
        let next = part.nextToStart(isRunning: { _ in true })
        #expect(next?.request.identifier == "com.example.app.export.b")
    }

    @Test func queuedRequestsOfAnEndedLaunchAreDropped() {
        var part = ContinuedProcessing(slots: 1, stallInterval: 60)
        part.started(Self.request("a"), task: 1, in: "L1", app: "a", at: Date())
        let queued = part.admit(Self.request("b"), in: "L2")
        #expect(queued == .queued)
        part.launchEnded("L2", at: Date())
        _ = part.ended(1, in: "L1", at: Date())
        let next = part.nextToStart(isRunning: { _ in true })
        #expect(next == nil, "the queued request died with its launch")
    }

    @Test func progressStallsAndCancellation() {
        var part = ContinuedProcessing(slots: 2, stallInterval: 10)
        let t0 = Date(timeIntervalSince1970: 1_000)
        part.started(Self.request("a"), task: 1, in: "L1", app: "a", at: t0)
        part.started(Self.request("b"), task: 2, in: "L1", app: "a", at: t0)
        part.progress(1, in: "L1", completed: 3, total: 10, at: t0.addingTimeInterval(8))
        part.title(1, in: "L1", title: "Exporting", subtitle: "3 of 10")
        let stalled = part.stalled(at: t0.addingTimeInterval(12))
        #expect(stalled.map(\.status.task) == [2], "only the task whose progress stood still")
        let stalledAgain = part.stalled(at: t0.addingTimeInterval(13))
        #expect(stalledAgain.isEmpty, "each stall is reported once")
        let cancelled = part.cancel("com.example.app.export.a")
        #expect(cancelled == .running(launchID: "L1", task: 1))
        let unknown = part.cancel("com.example.app.export.zzz")
        #expect(unknown == nil)
        let shown = part.statuses(at: t0)
        #expect(shown.map(\.task) == [1, 2])
        #expect(shown[0].title == "Exporting" && shown[0].completed == 3 && shown[0].expiring)
        _ = part.ended(2, in: "L1", at: t0)
        let soon = part.statuses(at: t0.addingTimeInterval(1))
        #expect(soon.contains { $0.task == 2 && $0.ended }, "shown a moment after it ended")
        let later = part.statuses(at: t0.addingTimeInterval(4))
        #expect(!later.contains { $0.task == 2 }, "then gone")
    }
}

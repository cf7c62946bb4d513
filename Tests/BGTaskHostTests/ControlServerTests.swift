@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// The control socket on the supervision loops: connections hold no thread of their own, and a
/// launch by hand that answers with its record holds none while it runs. In SupervisorTests
/// (serialized): these hold sockets for seconds, which the descriptor-leak test beside them
/// would count as its own.
extension SupervisorTests {
    /// Raw frames on a connection of one's own (ResourceBoundsTests' helpers).
    var wire: ResourceBoundsTests { ResourceBoundsTests() }

    /// Threads of `pid` now.
    static func threadCount(of pid: pid_t) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []).count
    }

    static func threadList(of pid: pid_t) -> String {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.compactMap { Int($0) }.sorted().map { tid in
            ((try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8)) ?? "?").trimmingCharacters(in: .whitespacesAndNewlines)
        }.joined(separator: ", ")
    }

    @Test func sixtyOpenConnectionsTakeNoThreadEach() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }
        // Served once, so the control workers have started.
        #expect(try host.send(.status).ok)
        let baseline = Self.threadCount(of: host.pid)
        var held: [Int32] = []
        defer { held.forEach { close($0) } }
        for _ in 0..<60 {
            let fd = try wire.connectControl(scratch.state)
            held.append(fd)
            try wire.sendFrame(#"{"verb":"status"}"#, to: fd)
            #expect(try wire.readAnswer(fd)?.ok == true)
        }
        // Sixty connections open and idle, each served: the same threads, and the control
        // workers the pool may have grown to (a thread each made 60 more).
        let during = Self.threadCount(of: host.pid)
        #expect(during <= baseline + ControlServer.workers.size, "\(during) threads with 60 connections open, \(baseline) before: \(Self.threadList(of: host.pid))")
        // And each still answers on the connection it has.
        for fd in held.prefix(5) {
            try wire.sendFrame(#"{"verb":"clock"}"#, to: fd)
            #expect(try wire.readAnswer(fd)?.clock != nil)
        }
    }

    @Test func launchesByHandWaitingForTheirRecordsHoldNoThread() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        // An opened app stays in the foreground 2 s: `open --wait` answers only then.
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--max-launches", "4", "--foreground-stay", "2s"],
                                           installing: [.feed])
        defer { host.stop() }
        /// Twelve opens waiting for their records at once (more than the four control workers),
        /// each on a connection of its own; `during` runs while they wait.
        func twelveOpens(during: () throws -> Void) throws -> [RunRecord] {
            let answers = LockedAnswers()
            let group = DispatchGroup()
            for _ in 0..<12 {
                group.enter()
                Thread.detachNewThread {
                    defer { group.leave() }
                    answers.append(try? ControlClient(stateDirectory: scratch.state).send(.open(app: "com.example.feed", wait: true)))
                }
            }
            usleep(1_000_000)
            try during()
            #expect(group.wait(timeout: .now() + 30) == .success, "the opens were not answered")
            let records = answers.all.compactMap { $0?.record }
            #expect(records.count == 12, "\(answers.all)")
            return records
        }
        // Once, so that the host's pools (control workers, launch workers, brokers) have grown.
        _ = try twelveOpens {}
        let baseline = Self.threadCount(of: host.pid)
        let records = try twelveOpens { () throws in
            // While they wait, the host answers at once, with the threads it had: none per
            // waiting client (a thread each made twelve more).
            let started = ContinuousClock.now
            #expect(try host.send(.status).ok)
            #expect(ContinuousClock.now - started < .seconds(1), "a status took \(ContinuousClock.now - started) while twelve opens waited")
            let during = Self.threadCount(of: host.pid)
            #expect(during <= baseline + 2, "\(during) threads while twelve opens wait, \(baseline) before: \(Self.threadList(of: host.pid))")
        }
        #expect(Set(records.map(\.launchID)).count == 12)
        #expect(records.allSatisfy { $0.app == "com.example.feed" && $0.reason == "foreground" }, "\(records)")
    }
}

private final class LockedAnswers: @unchecked Sendable {
    private let lock = NSLock()
    private var answers: [ControlResponse?] = []
    func append(_ answer: ControlResponse?) { lock.withLock { answers.append(answer) } }
    var all: [ControlResponse?] { lock.withLock { answers } }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskSystem
import BGTaskModel
import Foundation
import Testing

/// SIGKILL the host at any moment: no acknowledged request is lost or duplicated, a launch that
/// was running is recorded as host-lost with its tasks pending again, and no process of the old
/// host is left.
@Suite struct HostCrashTests {
    /// Apps made from the Misbehaving library with generated Info.plists: 10 processing
    /// identifiers each (the per-app limit).
    func installApps(_ host: HostProcess, count: Int) throws -> [(app: String, identifiers: [String])] {
        var apps: [(String, [String])] = []
        for index in 0..<count {
            let app = "com.example.crash\(index)"
            let identifiers = (0..<10).map { "\(app).p\($0)" }
            let info = host.scratch.url.appendingPathComponent("crash\(index).plist")
            try """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
            <key>CFBundleIdentifier</key><string>\(app)</string>
            <key>CFBundleExecutable</key><string>libMisbehaving.so</string>
            <key>BGTaskSchedulerPermittedIdentifiers</key><array>\(identifiers.map { "<string>\($0)</string>" }.joined())</array>
            <key>UIBackgroundModes</key><array><string>processing</string></array>
            </dict></plist>
            """.write(to: info, atomically: true, encoding: .utf8)
            let bundle = host.plugins.appendingPathComponent("Crash\(index).app")
            let made = try runCLI(["bundle", "--library", Products.library("Misbehaving"), "--info", info.path, "--output", bundle.path])
            try #require(made.status == 0, "\(made.stderr)")
            apps.append((app, identifiers))
        }
        return apps
    }

    @Test func acknowledgedSubmissionsSurviveSIGKILLExactlyOnce() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        let apps = try installApps(host, count: 4)
        let all = apps.flatMap { app in app.identifiers.map { (app.app, $0) } }
        let acknowledged = LockedSet(), refusals = LockedSet()
        let later = Date().addingTimeInterval(3600).timeIntervalSince1970

        for round in 0..<5 {
            try host.start()
            // Submit from two threads until the host dies under them.
            let done = DispatchGroup()
            for worker in 0..<2 {
                done.enter()
                DispatchQueue.global().async {
                    defer { done.leave() }
                    for (offset, (app, identifier)) in all.enumerated() where offset % 2 == worker {
                        let request = TaskRequest(kind: .processing, identifier: identifier, earliestBeginDate: later + Double(round))
                        let response: ControlResponse
                        do {
                            response = try host.send(.submit(app: app, request: request))
                        } catch {
                            // The host died under this submission: its fate is unknown.
                            refusals.insert("\(error)")
                            return
                        }
                        if response.ok {
                            acknowledged.insert("\(app) \(identifier) \(round)")
                        } else {
                            refusals.insert("\(response.error?.code ?? "?"): \(response.error?.message ?? "?")")
                        }
                    }
                }
            }
            usleep(UInt32.random(in: 5_000...60_000))
            host.crash()
            done.wait()
        }

        try host.start()
        defer { host.stop() }
        let pending = try host.send(.pending()).pending ?? []
        let keys = pending.map { "\($0.app) \($0.request.identifier)" }
        #expect(Set(keys).count == keys.count, "a request is duplicated: \(keys)")
        // Each identifier's latest acknowledged round is the one that must be pending (or a
        // later round whose acknowledgement was lost with the host).
        var latest: [String: Int] = [:]
        for entry in acknowledged.values {
            let parts = entry.split(separator: " ")
            let key = "\(parts[0]) \(parts[1])"
            latest[key] = max(latest[key] ?? -1, Int(parts[2])!)
        }
        #expect(!latest.isEmpty, "no submission was acknowledged before a kill; refusals: \(refusals.values)")
        for (key, round) in latest {
            let stored = pending.first { "\($0.app) \($0.request.identifier)" == key }
            #expect(stored != nil, "acknowledged request \(key) (round \(round)) was lost")
            if let date = stored?.request.earliestBeginDate {
                #expect(date >= later + Double(round), "\(key): an older submission replaced round \(round)")
            }
        }
    }

    @Test func aLaunchRunningWhenTheHostDiesIsHostLostAndItsTaskPendingAgain() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "60s"], installing: [.misbehaving])

        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.never"]).status == 0)
        var launchID: String?
        for _ in 0..<250 where launchID == nil {
            launchID = (try host.send(.apps()).apps ?? []).first?.running
            if launchID == nil { usleep(20_000) }
        }
        let id = try #require(launchID)
        // Hold the request back after the restart, to inspect it.
        #expect(try host.cli(["device", "--refresh", "off"]).status == 0)
        // The host lists the launch as soon as it starts it; the runner names itself a moment later.
        var runners = processes(withLaunchID: id)
        for _ in 0..<250 where runners.isEmpty {
            usleep(20_000)
            runners = processes(withLaunchID: id)
        }
        let runner = try #require(runners.first, "the launch's runner is running")
        host.crash()

        // The runner notices its host is gone and ends itself and everything it started.
        let deadline = Date().addingTimeInterval(10)
        while !processes(withLaunchID: id).isEmpty && Date() < deadline { usleep(20_000) }
        #expect(processes(withLaunchID: id).isEmpty, "processes of the dead host's launch are still running (runner \(runner))")

        try host.start()
        defer { host.stop() }
        let history = try host.send(.history()).records ?? []
        let lost = try #require(history.first { $0.launchID == id })
        #expect(lost.termination == .hostLost)
        #expect(lost.task("com.example.misbehaving.never")?.outcome == .unfinished)
        let pending = try host.send(.pending()).pending ?? []
        #expect(pending.map(\.request.identifier) == ["com.example.misbehaving.never"])
        let why = try #require(try host.send(.why(identifier: "com.example.misbehaving.never")).why)
        #expect(why.blockers.map(\.code).contains("refresh-disabled"))
    }

    /// Live processes of this launch (by their title or environment).
    func processes(withLaunchID id: String) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap(pid_t.init).filter { processExists($0) && ProcessTree.launchID(of: $0) == id }
    }
}

final class LockedSet: @unchecked Sendable {
    private let lock = NSLock()
    private var set = Set<String>()
    func insert(_ value: String) { _ = lock.withLock { set.insert(value) } }
    var values: Set<String> { lock.withLock { set } }
}

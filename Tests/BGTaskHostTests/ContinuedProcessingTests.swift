@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

@Suite struct ContinuedProcessingTests {
    @Test func anExportStartedInTheForegroundRunsWithLiveProgress() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }
        // Some stories to export: six refreshes, 30 items, 1.5 s of exporting (50 ms each): time
        // for a watcher polling every 100 ms to see several updates on a loaded machine.
        for _ in 0..<6 {
            #expect(try host.cli(["simulate-launch", "com.example.feed.refresh", "--force", "--type", "refresh"]).status == 0)
        }

        // The watcher first (it waits for the export to appear), so that it sees every update
        // however long the open takes on a loaded machine.
        let watched = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var watcher: CLIResult?
        DispatchQueue.global().async {
            watcher = try? host.cli(["progress", "--wait", "20s"])
            watched.signal()
        }
        let opened = try host.cli(["open", "com.example.feed", "--event", #"{"action": "export"}"#])
        #expect(opened.status == 0, "\(opened.stderr)")
        watched.wait()
        let progress = try #require(watcher)
        #expect(progress.status == 0)
        let lines = progress.stdout.split(separator: "\n")
        #expect(lines.count >= 3, "one line per update: \(progress.stdout)")
        #expect(lines.contains { $0.contains("com.example.feed.export.archive") && $0.contains("Exporting feed") && $0.contains("of 30 stories") })
        #expect(lines.contains { $0.contains("100%") || $0.contains("30/30") }, "\(progress.stdout)")

        let records = try host.waitForHistory(count: 7)
        let foreground = try #require(records.first { $0.reason == "foreground" })
        #expect(foreground.termination == .suspended)
        let export = try #require(foreground.task("com.example.feed.export.archive"))
        #expect(export.type == .continuedProcessing)
        #expect(export.outcome == .succeeded)
        #expect(foreground.submitted.map(\.identifier).contains("com.example.feed.export.archive"))
        let exported = try JSONSerialization.jsonObject(with: Data(contentsOf: scratch.state.appendingPathComponent("containers/com.example.feed/export.json"))) as? [Any]
        #expect(exported?.count == 30)
    }

    @Test func stalledProgressExpiresAndTheUserCanCancel() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--stall", "500ms", "--max-continued", "1"], installing: [.misbehaving])
        defer { host.stop() }

        // One slot: "stall" runs, "slow" waits in the queue, "eager" (strategy .fail) is refused.
        #expect(try host.cli(["open", "com.example.misbehaving", "--event", #"{"continued": ["stall", "slow"]}"#]).status == 0)
        // "stall" holds the slot before "eager" asks for it (`open` returns before the launch
        // has submitted anything).
        var stalling = false
        for _ in 0..<500 where !stalling {
            stalling = (try host.send(.progress).continued ?? []).contains { $0.identifier == "com.example.misbehaving.continued.stall" }
            if !stalling { usleep(10_000) }
        }
        #expect(stalling, "the stall task started")
        let failed = try host.cli(["open", "com.example.misbehaving", "--event", #"{"continued": ["eager"], "strategy": "fail"}"#, "--wait", "--json"])
        let refusedLaunch = try RunRecord.decode(Data(failed.stdout.utf8))
        let refusedLog = try refusedLaunch.logText()
        #expect(refusedLog.contains("submit com.example.misbehaving.continued.eager failed: code 4"), "immediateRunIneligible: \(refusedLog)")

        // The stalled task is expired after 500 ms without progress; then "slow" gets the slot,
        // and the user cancels it.
        var cancelled = false
        for _ in 0..<300 where !cancelled {
            cancelled = try host.cli(["cancel-task", "com.example.misbehaving.continued.slow"]).status == 0
                && true
            if !cancelled { usleep(20_000) }
        }
        #expect(cancelled)
        let records = try host.waitForHistory(count: 2)
        let launch = try #require(records.first { $0.task("com.example.misbehaving.continued.stall") != nil })
        #expect(launch.task("com.example.misbehaving.continued.stall")?.outcome == .expired)
        #expect(launch.task("com.example.misbehaving.continued.slow")?.outcome == .expired, "cancel runs the expiration handler")
        #expect(launch.termination == .suspended)
    }

    @Test func gpuTasksNeedTheEntitlementAndAGPU() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        _ = try host.cli(["device", "--gpu", "on"])
        let result = try host.cli(["open", "com.example.misbehaving", "--event", #"{"continued": ["fast"], "gpu": true}"#, "--wait", "--json"])
        let record = try RunRecord.decode(Data(result.stdout.utf8))
        let log = try record.logText()
        #expect(log.contains("failed: code 3"), "notPermitted without the GPU entitlement: \(log)")
        #expect(log.contains("continued-processing.gpu"))
    }

    @Test func continuedRequestsComeFromTheForeground() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let result = try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.continued.fast", "--type", "continued-processing"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("submitted from the foreground"), "\(result.stderr)")
    }
}

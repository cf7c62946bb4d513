import BackgroundTasksTestKit
import BGTaskHost
import BGTaskControl
import Foundation
import Testing

/// The out-of-process kit: a real `bgtask host` on a temporary state directory, with the Feed
/// example's bundle (assembled from the built library by `bgtask bundle`).
@Suite struct TestHostTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Feed.app, assembled by the real CLI from the library built next to the tests.
    static func feedBundle(in directory: URL) throws -> URL {
        let cli = try TestHost.defaultExecutable()
        let output = directory.appendingPathComponent("Feed.app")
        let process = Process()
        process.executableURL = cli
        process.arguments = ["bundle", "--library", cli.deletingLastPathComponent().appendingPathComponent("libFeed.so").path,
                             "--info", packageRoot.appendingPathComponent("Plugins/Feed/Info.plist").path, "--output", output.path]
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "bgtask bundle failed")
        return output
    }

    @Test(.timeLimit(.minutes(1))) func aHostRunsTheFeedOnItsVirtualClockAndStopsWithItsProcesses() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-testhost-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let host = try TestHost(bundles: [try Self.feedBundle(in: scratch)])
        try host.start()
        defer { host.stop() }

        try host.submit(TaskRequest(kind: .refresh, identifier: "com.example.feed.refresh"), app: "com.example.feed", earliestIn: .seconds(15 * 60))
        #expect(try host.pending(app: "com.example.feed").map(\.request.identifier) == ["com.example.feed.refresh"])
        try host.advanceClock(by: .seconds(15 * 60))
        let records = try host.waitForRecords(count: 1)
        #expect(records[0].reason == "scheduled")
        #expect(records[0].tasks.first?.outcome == .succeeded)

        // A launch by hand, its record returned; then a verb by name through send(_:).
        let forced = try #require(try host.simulateLaunch("com.example.feed.cleanup", app: "com.example.feed", force: true, type: .processing))
        #expect(forced.tasks.map(\.identifier) == ["com.example.feed.cleanup"])
        let status = try host.send(.status)
        #expect(status.ok)
        let unknown = try host.send(wire: ControlRequest(verb: "no-such-verb"))
        #expect(!unknown.ok && unknown.failure?.code == .unknownVerb)

        #expect(host.isRunning)
        #expect(host.stop() == 0)
        #expect(!host.isRunning)
        #expect(host.stop() == nil, "stopping twice is harmless")
    }
}

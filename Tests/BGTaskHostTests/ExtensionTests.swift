@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

@Suite struct ExtensionTests {
    /// Feed.app with its share extension in PlugIns/Share.appex, moved into the host's plugins.
    func installFeedWithExtension(_ host: HostProcess) throws {
        let appex = try host.scratch.bundle("FeedShare", info: "Plugins/FeedShare/Info.plist", name: "Share.appex")
        let staged = host.scratch.url.appendingPathComponent("staged-Feed.app")
        let made = try runCLI(["bundle", "--library", Products.library("Feed"), "--info", Products.packageRoot.appendingPathComponent("Plugins/Feed/Info.plist").path,
                               "--extension", appex.path, "--output", staged.path])
        try #require(made.status == 0, "\(made.stderr)")
        try FileManager.default.moveItem(at: staged, to: host.plugins.appendingPathComponent("Feed.app"))
    }

    /// A host running Feed.app with its share extension.
    func startedHostWithFeedExtension(_ scratch: Scratch) throws -> HostProcess {
        let host = try HostProcess(scratch: scratch)
        try installFeedWithExtension(host)
        try host.start()
        return host
    }

    @Test func aRequestAnExtensionSubmitsIsRunByItsApp() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try startedHostWithFeedExtension(scratch)
        defer { host.stop() }
        #expect(try host.send(.apps()).apps?.first?.extensions == ["com.example.feed.share"])

        let result = try host.cli(["extension", "run", "com.example.feed.share", "--event", #"{"url": "https://example.com/story"}"#, "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        let record = try RunRecord.decode(Data(result.stdout.utf8))
        #expect(record.reason == "extension")
        #expect(record.app == "com.example.feed.share")
        #expect(record.termination == .exited)
        #expect(record.refusedRegistrations == ["com.example.feed.refresh"], "an extension cannot register")
        #expect(record.submitted.map(\.identifier) == ["com.example.feed.refresh"])
        let log = try record.logText()
        #expect(log.contains("share: register returned false"))
        #expect(log.contains("extensions cannot register launch handlers"))

        // The request is the app's, and the app is launched to run it.
        let history = try host.waitForHistory(count: 2)
        let appLaunch = try #require(history.first { $0.app == "com.example.feed" })
        #expect(appLaunch.reason == "scheduled")
        #expect(appLaunch.task("com.example.feed.refresh")?.outcome == .succeeded)
        #expect(appLaunch.pid != record.pid, "the app runs in its own process, not the extension's")
        let shared = try String(contentsOf: scratch.state.appendingPathComponent("containers/com.example.feed.share/shared-links.txt"), encoding: .utf8)
        #expect(shared == "https://example.com/story\n")
    }

    @Test func anExtensionCanOnlySubmitWhatItsAppPermits() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try startedHostWithFeedExtension(scratch)
        defer { host.stop() }
        // Low Power Mode makes the refresh the extension asks for unavailable: the error reaches it.
        _ = try host.cli(["device", "--low-power", "on"])
        let refused = try host.cli(["extension", "run", "com.example.feed.share", "--event", #"{"url": "https://example.com"}"#, "--json"])
        let record = try RunRecord.decode(Data(refused.stdout.utf8))
        #expect(record.termination == .launchFailed)
        #expect(record.error?.contains("Low Power Mode") == true, "\(record.error ?? "")")
        #expect(try host.send(.pending()).pending?.isEmpty == true)

        let bad = try host.cli(["extension", "run", "com.example.feed.share", "--event", #"{"nope": 1}"#, "--json"])
        #expect(try RunRecord.decode(Data(bad.stdout.utf8)).error?.contains("expected an event like") == true)
        let unknown = try host.cli(["extension", "run", "com.example.other.share"])
        #expect(unknown.stderr.contains("[not-found]"))
    }
}

import BGTaskHost
import BGTaskModel
import Foundation
import Testing

/// Background URL sessions from the app's side (docs/sdk.md, "Background URL sessions"): the
/// Downloader fixture is Apple's DownloadManager pattern, unchanged.
@Suite struct BackgroundSessionTests {
    static let downloader = TestBundle(library: "Downloader", info: "Tests/Fixtures/Downloader/Info.plist", name: "Downloader.app")

    /// Writes the fixture's instructions next to its Info.plist (it reads them from `Bundle.main`).
    static func configure(_ bundle: URL, _ config: [String: Any]) throws {
        let data = try JSONSerialization.data(withJSONObject: config)
        try data.write(to: bundle.appendingPathComponent("config.json"))
    }

    /// Without a host (`bgtask run`), nothing can carry a background task: the app's delegate
    /// hears so at once, as an URLError, and the launch's log says why. It also shows the hook
    /// on URLSession's initializer saw the app's session (the attach is logged).
    @Test func withoutAHostTheDelegateIsToldAtOnce() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Downloader", info: Self.downloader.info)
        try Self.configure(bundle, ["downloads": ["http://127.0.0.1:9/never"]])
        let (record, _) = try scratch.run(bundle, ["--task", "com.example.downloader.wait:refresh"])
        #expect(record.task("com.example.downloader.wait")?.outcome == .succeeded)
        let log = try record.logText()
        #expect(log.contains("background session com.example.downloader.background: the host did not attach it"), "\(log)")
        #expect(log.contains("downloader: started file0 task 1"), "\(log)")
        #expect(log.contains("downloader: complete file0 error -1004"), "\(log)")
    }
}

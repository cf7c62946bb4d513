import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// The example apps of Plugins/ (one per background API: the README's tour, Examples/tour.sh)
/// run and do what they say, with the libraries this test build made: once with `bgtask run`
/// where a task starts them, and under a host as the tour drives them.
@Suite struct ExamplesTests {
    /// `NAME.app` of `Plugins/NAME` (with its share extension `Plugins/EXTENSION` in
    /// PlugIns/Share.appex), assembled by `bgtask bundle` into `directory`; `info` replaces
    /// the Info.plist's text.
    static func bundle(_ name: String, extension share: String? = nil, in scratch: Scratch, into directory: URL,
                       info: ((String) -> String)? = nil) throws -> URL {
        var plist = Products.packageRoot.appendingPathComponent("Plugins/\(name)/Info.plist")
        if let info {
            let text = try String(contentsOf: plist, encoding: .utf8)
            plist = scratch.url.appendingPathComponent("\(name)-Info.plist")
            try info(text).write(to: plist, atomically: true, encoding: .utf8)
        }
        var extensionArguments: [String] = []
        if let share {
            let appex = try scratch.bundle(share, info: "Plugins/\(share)/Info.plist", name: "\(name)-Share.appex")
            let named = scratch.url.appendingPathComponent("\(name)-PlugIns/Share.appex")
            try FileManager.default.createDirectory(at: named.deletingLastPathComponent(), withIntermediateDirectories: true)
            try FileManager.default.moveItem(at: appex, to: named)
            extensionArguments = ["--extension", named.path]
        }
        let staged = scratch.url.appendingPathComponent("staged-\(name).app")
        let made = try runCLI(["bundle", "--library", Products.library(name), "--info", plist.path, "--output", staged.path] + extensionArguments)
        try #require(made.status == 0, "bgtask bundle \(name): \(made.stderr)")
        let bundle = directory.appendingPathComponent("\(name).app")
        try FileManager.default.moveItem(at: staged, to: bundle)
        return bundle
    }

    /// The examples a task starts, each launched once by `bgtask run`, the one-shot.
    @Test func eachExampleATaskStartsRunsOnce() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let apps = scratch.url.appendingPathComponent("apps")
        try FileManager.default.createDirectory(at: apps, withIntermediateDirectories: true)

        let export = try Self.bundle("Export", in: scratch, into: apps)
        let (exported, _) = try scratch.run(export, ["--task", "com.example.export.album"])
        #expect(exported.task("com.example.export.album")?.type == .continuedProcessing)
        #expect(exported.succeeded, "\(exported)")
        #expect(try exported.logText().contains("export: exported 20 of 20 photos"))

        let weather = try Self.bundle("Weather", in: scratch, into: apps)
        let (forecast, _) = try scratch.run(weather, ["--task", "com.example.weather.refresh", "--notifications", "on"])
        #expect(forecast.succeeded, "\(forecast)")
        #expect(forecast.notificationsAdded == ["rain-alert"], "\(forecast)")
        #expect(forecast.submitted.map(\.identifier) == ["com.example.weather.refresh"], "the refresh schedules the next one")
        #expect(try forecast.logText().contains("weather: notified \"Rain expected\""))

        let reader = try Self.bundle("Reader", extension: "ReaderShare", in: scratch, into: apps)
        let (read, _) = try scratch.run(reader, ["--task", "com.example.reader.refresh"])
        #expect(read.succeeded, "\(read)")
        #expect(try read.logText().contains("reader: saved 0 article(s)"), "the group's container is there, its list empty")
    }

    /// Every example under one host, driven as Examples/tour.sh drives them: the user opens an
    /// app, a server pushes, an extension shares, the host carries a download.
    @Test func theExamplesUnderAHost() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let server = TransferTestServer()
        try server.start()
        defer { server.stop() }
        let host = try HostProcess(scratch: scratch)
        for name in ["Export", "Notes", "Mail", "Weather"] {
            _ = try Self.bundle(name, in: scratch, into: host.plugins)
        }
        _ = try Self.bundle("Reader", extension: "ReaderShare", in: scratch, into: host.plugins)
        _ = try Self.bundle("Episodes", in: scratch, into: host.plugins) {
            $0.replacingOccurrences(of: "http://127.0.0.1:8000/episode-42.mp3", with: server.url("/bytes/300000"))
        }
        try host.start()
        defer { host.stop() }
        #expect(try host.cli(["device", "--power", "on", "--network", "on"]).status == 0)

        // Continued processing: opened, the app submits its export, which runs with progress.
        let opened = try host.cli(["open", "com.example.export", "--wait", "--json"])
        let export = try RunRecord.decode(Data(opened.stdout.utf8))
        #expect(export.reason == "foreground" && export.succeeded, "\(export)")
        #expect(export.task("com.example.export.album")?.outcome == .succeeded)

        // Background time: the note is saved under an assertion, ended before time ran out.
        let notes = try RunRecord.decode(Data(try host.cli(["open", "com.example.notes", "--wait", "--json"]).stdout.utf8))
        let save = try #require(notes.backgroundTime?.first { $0.name == "Save note" }, "\(notes)")
        #expect(save.outcome == .ended)
        #expect(try notes.logText().contains("notes: saved the note"))

        // A background push: delivered to the delegate, whose completion handler says new data.
        let payload = scratch.url.appendingPathComponent("push.json")
        try #"{"aps": {"content-available": 1}, "mailbox": "INBOX"}"#.write(to: payload, atomically: true, encoding: .utf8)
        #expect(try host.cli(["push", "com.example.mail", payload.path]).status == 0)
        let mail = try Self.record(host) { $0.app == "com.example.mail" }
        #expect(mail.reason == "remote-notification" && mail.push?.result == "new-data", "\(mail)")
        #expect(try mail.logText().contains("mail: fetched 1 new message(s) in INBOX"))

        // A local notification, allowed by the operator.
        #expect(try host.cli(["device", "--app", "com.example.weather", "--notifications", "on"]).status == 0)
        #expect(try host.cli(["submit", "com.example.weather", "com.example.weather.refresh"]).status == 0)
        let weather = try Self.record(host) { $0.app == "com.example.weather" }
        #expect(weather.succeeded && weather.notificationsAdded == ["rain-alert"], "\(weather)")

        // The share extension writes into the app group; the app's refresh reads it there.
        let shared = try host.cli(["extension", "run", "com.example.reader.share", "--event", #"{"url": "https://example.com/a"}"#, "--json"])
        #expect(try RunRecord.decode(Data(shared.stdout.utf8)).submitted.map(\.identifier) == ["com.example.reader.refresh"], "\(shared.stdout)")
        let reader = try Self.record(host) { $0.app == "com.example.reader" }
        #expect(reader.succeeded, "\(reader)")
        #expect(try reader.logText().contains("reader: saved 1 article(s) for offline reading: https://example.com/a"))

        // A download the host carries: the app is told of the file (while it runs, or woken
        // for its session's events), and moves it into Documents.
        #expect(try host.cli(["submit", "com.example.episodes", "com.example.episodes.refresh"]).status == 0)
        let started = try Self.record(host) { $0.task("com.example.episodes.refresh") != nil }
        #expect(started.succeeded, "\(started)")
        let saved = "episodes: saved 300000, 300000 bytes"
        let delivered = try Self.record(host) { $0.app == "com.example.episodes" && ((try? $0.logText())?.contains(saved) ?? false) }
        #expect(delivered.transfers?.delivered.count == 1, "\(delivered)")
        let file = scratch.state.appendingPathComponent("containers/com.example.episodes/Documents/300000")
        #expect((try? FileManager.default.attributesOfItem(atPath: file.path)[.size] as? Int) == 300_000)
    }

    /// The newest record that matches, waiting (at most 30 s) for it.
    static func record(_ host: HostProcess, where matches: (RunRecord) -> Bool) throws -> RunRecord {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let found = (try host.send(.history(limit: 100)).records ?? []).first(where: matches) { return found }
            usleep(50_000)
        }
        throw HostTestError("no such record within 30 s: \((try? host.send(.history(limit: 100)).records) ?? [])")
    }
}

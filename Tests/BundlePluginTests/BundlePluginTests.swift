import BGTaskHost
import BGTaskControl
import Foundation
import Testing

/// `swift package bgtask-bundle`'s decisions (BundlePlan.swift, the plugin's own file linked in
/// here) on this package's examples, and the commands it makes, run with the real `bgtask` on the
/// libraries built next to the tests: the bundle they assemble validates and runs.
@Suite struct BundlePluginTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let products = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()

    /// The candidates the plugin finds in this package: dynamic library products with an
    /// Info.plist beside their sources.
    static let candidates = [
        BundleCandidate(product: "Feed", infoPlist: root.appendingPathComponent("Plugins/Feed/Info.plist")),
        BundleCandidate(product: "FeedShare", infoPlist: root.appendingPathComponent("Plugins/FeedShare/Info.plist")),
        BundleCandidate(product: "Counter", infoPlist: root.appendingPathComponent("Plugins/Counter/Info.plist")),
    ]

    @Test func optionsAreParsedAndMisuseIsNamed() throws {
        let options = try BundleOptions.parse(["--product", "Feed", "--extension=FeedShare", "-c", "release", "--output", "out"])
        #expect(options == BundleOptions(products: ["Feed"], extensions: ["FeedShare"], info: nil, output: "out", configuration: "release"))
        #expect(try BundleOptions.parse([]) == BundleOptions())
        #expect(throws: BundleOptions.Invalid.self) { try BundleOptions.parse(["--product"]) }
        #expect(throws: BundleOptions.Invalid.self) { try BundleOptions.parse(["-c", "fast"]) }
        #expect(throws: BundleOptions.Invalid.self) { try BundleOptions.parse(["--info", "x.plist"]) }
        #expect(throws: BundleOptions.Invalid.self) { try BundleOptions.parse(["--frobnicate"]) }
    }

    @Test func appsAndTheirExtensionsAreFoundFromTheirInfoPlists() throws {
        let share = try #require(Self.candidates.first { $0.product == "FeedShare" })
        #expect(share.isExtension && share.identifier == "com.example.feed.share")
        // No --product: every app, never an extension on its own.
        #expect(try BundlePlan.apps(BundleOptions(), candidates: Self.candidates).map(\.product) == ["Feed", "Counter"])
        let feed = try BundlePlan.apps(BundleOptions(products: ["Feed"]), candidates: Self.candidates)[0]
        #expect(try BundlePlan.extensions(of: feed, BundleOptions(), candidates: Self.candidates).map(\.product) == ["FeedShare"])
        let counter = try BundlePlan.apps(BundleOptions(products: ["Counter"]), candidates: Self.candidates)[0]
        #expect(try BundlePlan.extensions(of: counter, BundleOptions(), candidates: Self.candidates).isEmpty)
        #expect(throws: BundleOptions.Invalid.self) { try BundlePlan.apps(BundleOptions(products: ["Nope"]), candidates: Self.candidates) }
    }

    @Test(.timeLimit(.minutes(1))) func theCommandsAssembleABundleThatRuns() throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-bundleplugin-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: scratch) }
        let staging = scratch.appendingPathComponent("staging"), output = scratch.appendingPathComponent("out")
        try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        let feed = Self.candidates[0]
        let extensions = try BundlePlan.extensions(of: feed, BundleOptions(), candidates: Self.candidates)
        let commands = BundlePlan.commands(app: feed, library: Self.products.appendingPathComponent("libFeed.so").path,
                                           extensions: extensions.map { ($0, Self.products.appendingPathComponent("lib\($0.product).so").path) },
                                           output: output, staging: staging)
        #expect(commands.count == 2)
        for command in commands {
            let (status, text) = try run(command)
            try #require(status == 0, "bgtask \(command.joined(separator: " ")): \(text)")
        }
        let bundle = try BundleReader.read(output.appendingPathComponent("Feed.app"))
        #expect(bundle.identifier == "com.example.feed")
        #expect(bundle.extensions.map(\.identifier) == ["com.example.feed.share"])

        let (status, text) = try run(["run", output.appendingPathComponent("Feed.app").path, "--task", "com.example.feed.refresh:refresh",
                                      "--state", scratch.appendingPathComponent("state").path, "--json"])
        #expect(status == 0, "\(text)")
        let record = try RunRecord.decode(Data(text.utf8))
        #expect(record.tasks.first?.outcome == .succeeded)
    }

    /// Runs the `bgtask` built next to the tests and waits for it; its stdout (stderr on failure).
    func run(_ arguments: [String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = Self.products.appendingPathComponent("bgtask")
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let errors = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: process.terminationStatus == 0 ? data : data + errors, as: UTF8.self))
    }
}

@testable import BGTaskHost
import BGTaskControl
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Fixture support (file-private: other test files define their own helpers)

/// A plugin directory for one test, and a sibling directory to assemble bundles in before
/// they are moved in; `remove()` both in a `defer`.
private struct PCFixture {
    let base: URL
    /// The plugin directory.
    let plugins: URL
    /// Where bundles are built before a `rename(2)` drops them into `plugins` (same file system).
    let staging: URL

    init() throws {
        base = FileManager.default.temporaryDirectory
            .appendingPathComponent("PluginCatalogTests-\(UUID().uuidString)", isDirectory: true)
        plugins = base.appendingPathComponent("plugins", isDirectory: true)
        staging = base.appendingPathComponent("staging", isDirectory: true)
        try FileManager.default.createDirectory(at: plugins, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
    }

    func remove() {
        // Give back any permission a test took away, so that removal works for non-root too.
        if let walker = FileManager.default.enumerator(atPath: base.path) {
            for case let relative as String in walker {
                chmod(base.appendingPathComponent(relative).path, 0o755)
            }
        }
        try? FileManager.default.removeItem(at: base)
    }

    /// The build products directory (the fixture plugins are built there): the directory of the
    /// running test executable.
    static let productsDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()

    /// A real ELF shared library (not a plugin, but the catalog never loads one).
    static var realLibrary: URL { productsDirectory.appendingPathComponent("libNoEntry.so") }

    /// An Info.plist, as docs/bundle-format.md describes it.
    static func infoPlist(identifier: String, executable: String = "libPlugin.so",
                          permitted: [String] = [], modes: [String] = ["fetch"], isExtension: Bool = false) -> String {
        func strings(_ values: [String]) -> String {
            "<array>" + values.map { "<string>\($0)</string>" }.joined() + "</array>"
        }
        let extensionKey = isExtension
            ? "<key>NSExtension</key><dict><key>NSExtensionPointIdentifier</key><string>com.apple.share-services</string></dict>"
            : ""
        return """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0">
            <dict>
            <key>CFBundleIdentifier</key><string>\(identifier)</string>
            <key>CFBundleExecutable</key><string>\(executable)</string>
            <key>BGTaskSchedulerPermittedIdentifiers</key>\(strings(permitted))
            <key>UIBackgroundModes</key>\(strings(modes))
            \(extensionKey)
            </dict>
            </plist>

            """
    }

    /// Writes a complete bundle at `url` (an `.app` or an `.appex`): Info.plist and the real
    /// library as `libPlugin.so`.
    @discardableResult
    static func writeBundle(at url: URL, identifier: String, permitted: [String] = [],
                            isExtension: Bool = false) throws -> URL {
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        try writeInfo(at: url, identifier: identifier, permitted: permitted, isExtension: isExtension)
        try copyLibrary(into: url)
        return url
    }

    static func writeInfo(at bundle: URL, identifier: String, permitted: [String] = [], isExtension: Bool = false) throws {
        let text = infoPlist(identifier: identifier, permitted: permitted, isExtension: isExtension)
        try Data(text.utf8).write(to: bundle.appendingPathComponent("Info.plist"))
    }

    static func copyLibrary(into bundle: URL) throws {
        try #require(FileManager.default.fileExists(atPath: realLibrary.path),
                     "no libNoEntry.so next to the test executable in \(productsDirectory.path): run swift build --build-tests")
        try FileManager.default.copyItem(at: realLibrary, to: bundle.appendingPathComponent("libPlugin.so"))
    }

    /// A bundle assembled in `staging`, then moved into the plugin directory with one
    /// `rename(2)` (atomic: the watcher sees it appear whole).
    @discardableResult
    func dropIn(_ name: String, identifier: String, permitted: [String] = []) throws -> URL {
        let built = try Self.writeBundle(at: staging.appendingPathComponent(name), identifier: identifier, permitted: permitted)
        let target = plugins.appendingPathComponent(name)
        try #require(rename(built.path, target.path) == 0, "rename failed: \(String(cString: strerror(errno)))")
        return target
    }
}

/// What a watcher's `onChange` saw: each call rescans the plugin directory, as the host does.
/// Waiting is on a semaphore with a deadline, never a sleep loop.
private final class PCChanges: @unchecked Sendable {
    private let directory: URL
    private let lock = NSLock()
    private var catalogs: [PluginCatalog] = []
    private let signal = DispatchSemaphore(value: 0)

    init(directory: URL) { self.directory = directory }

    /// The watcher's callback.
    func record() {
        let catalog = PluginCatalog.scan(directory)
        lock.lock()
        catalogs.append(catalog)
        lock.unlock()
        signal.signal()
    }

    var count: Int {
        lock.lock()
        defer { lock.unlock() }
        return catalogs.count
    }

    /// Waits until a call after the `since`-th one scanned a catalog that satisfies `predicate`;
    /// that catalog, or nil after `timeout`.
    func waitFor(since: Int, timeout: Duration = PCChanges.timeout, _ predicate: (PluginCatalog) -> Bool) -> PluginCatalog? {
        let deadline = DispatchTime.now() + Self.interval(timeout)
        while true {
            lock.lock()
            let seen = catalogs.count > since ? Array(catalogs[since...]) : []
            lock.unlock()
            if let match = seen.first(where: predicate) { return match }
            if signal.wait(timeout: deadline) == .timedOut {
                lock.lock()
                defer { lock.unlock() }
                return catalogs.count > since ? catalogs[since...].first(where: predicate) : nil
            }
        }
    }

    /// Waits for a call after the `since`-th one; false after `timeout`.
    func waitForCall(since: Int, timeout: Duration = PCChanges.timeout) -> Bool {
        waitFor(since: since, timeout: timeout) { _ in true } != nil
    }

    /// The number of calls once `duration` has passed (wakes on each call, keeps waiting).
    func count(after duration: Duration) -> Int {
        let deadline = DispatchTime.now() + Self.interval(duration)
        while signal.wait(timeout: deadline) == .success {}
        return count
    }

    /// How long a change may take to be reported (the debounce is 100 ms; the rest is slack
    /// for a loaded machine running other suites in parallel).
    static let timeout: Duration = .seconds(2)

    static func interval(_ duration: Duration) -> DispatchTimeInterval {
        .milliseconds(Int(duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000))
    }
}

private let debounce: Duration = .milliseconds(100)

// MARK: - Scan

@Suite struct PluginCatalogTests {
    @Test func scanSortsValidInvalidAndIgnoredEntries() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let dir = fixture.plugins

        let feed = try PCFixture.writeBundle(at: dir.appendingPathComponent("Feed.app"), identifier: "com.example.feed",
                                             permitted: ["com.example.feed.refresh", "com.example.feed.export.*"])
        try PCFixture.writeBundle(at: feed.appendingPathComponent("PlugIns/Share.appex"), identifier: "com.example.feed.share",
                                  isExtension: true)
        try PCFixture.writeBundle(at: dir.appendingPathComponent("Counter.app"), identifier: "com.example.counter",
                                  permitted: ["com.example.counter.tick", "com.example.shared"])
        try PCFixture.writeBundle(at: dir.appendingPathComponent("Alpha.app"), identifier: "com.example.alpha",
                                  permitted: ["com.example.shared"])
        // Invalid: a bad identifier, a missing library, a plain file named like a bundle.
        let bad = try PCFixture.writeBundle(at: dir.appendingPathComponent("Bad.app"), identifier: "feed")
        let noLibrary = dir.appendingPathComponent("NoLibrary.app")
        try FileManager.default.createDirectory(at: noLibrary, withIntermediateDirectories: true)
        try PCFixture.writeInfo(at: noLibrary, identifier: "com.example.nolibrary")
        let file = dir.appendingPathComponent("File.app")
        try Data("not a bundle".utf8).write(to: file)
        // Ignored: not `*.app` (even a valid bundle), and a stray extension at the top.
        try Data("hello".utf8).write(to: dir.appendingPathComponent("README.txt"))
        try PCFixture.writeBundle(at: dir.appendingPathComponent("Disabled.app.off"), identifier: "com.example.disabled")
        try PCFixture.writeBundle(at: dir.appendingPathComponent("Loose.appex"), identifier: "com.example.loose", isExtension: true)
        try FileManager.default.createDirectory(at: dir.appendingPathComponent("Stuff"), withIntermediateDirectories: true)

        let catalog = PluginCatalog.scan(dir)
        #expect(Set(catalog.apps.keys) == ["com.example.feed", "com.example.counter", "com.example.alpha"])
        #expect(Set(catalog.invalid.keys) == [bad.path, noLibrary.path, file.path])
        #expect(catalog.apps["com.example.feed"]?.url.path == feed.path)
        #expect(catalog.apps["com.example.feed"]?.extensions.map(\.identifier) == ["com.example.feed.share"])

        let badError = try #require(catalog.invalid[bad.path])
        #expect(badError.code == .invalidBundle)
        #expect(badError.key == "CFBundleIdentifier")
        #expect(badError.description.contains(bad.appendingPathComponent("Info.plist").path))
        #expect(catalog.invalid[noLibrary.path]?.key == "CFBundleExecutable")
        #expect(catalog.invalid[file.path]?.description.contains("directory") == true)

        // Lookups.
        #expect(catalog.app(containingBundle: "com.example.feed")?.identifier == "com.example.feed")
        #expect(catalog.app(containingBundle: "com.example.feed.share")?.identifier == "com.example.feed")
        #expect(catalog.app(containingBundle: "com.example.counter")?.identifier == "com.example.counter")
        #expect(catalog.app(containingBundle: "com.example.feed.other") == nil)
        #expect(catalog.app(containingBundle: "com.example.disabled") == nil)
        #expect(catalog.app(permitting: "com.example.feed.refresh")?.identifier == "com.example.feed")
        #expect(catalog.app(permitting: "com.example.feed.export.job-1")?.identifier == "com.example.feed")
        #expect(catalog.app(permitting: "com.example.counter.tick")?.identifier == "com.example.counter")
        // Two apps permit it: the first by identifier (alpha < counter), whatever the names.
        #expect(catalog.app(permitting: "com.example.shared")?.identifier == "com.example.alpha")
        #expect(catalog.app(permitting: "com.example.feed.export") == nil)
        #expect(catalog.app(permitting: "com.example.unknown") == nil)

        // A scan is a function of the directory.
        #expect(PluginCatalog.scan(dir) == catalog)
    }

    @Test func duplicateIdentifiersFirstByNameWins() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let dir = fixture.plugins
        // Created in the opposite order of their names: the name decides, not the creation.
        let second = try PCFixture.writeBundle(at: dir.appendingPathComponent("B-Feed.app"), identifier: "com.example.feed")
        let first = try PCFixture.writeBundle(at: dir.appendingPathComponent("A-Feed.app"), identifier: "com.example.feed",
                                              permitted: ["com.example.feed.refresh"])
        let third = try PCFixture.writeBundle(at: dir.appendingPathComponent("C-Feed.app"), identifier: "com.example.feed")
        // An app whose identifier is an earlier app's extension's is a duplicate too.
        let host = try PCFixture.writeBundle(at: dir.appendingPathComponent("D-Host.app"), identifier: "com.example.host")
        try PCFixture.writeBundle(at: host.appendingPathComponent("PlugIns/Share.appex"), identifier: "com.example.host.share",
                                  isExtension: true)
        let clash = try PCFixture.writeBundle(at: dir.appendingPathComponent("E-Clash.app"), identifier: "com.example.host.share")

        let catalog = PluginCatalog.scan(dir)
        #expect(Set(catalog.apps.keys) == ["com.example.feed", "com.example.host"])
        #expect(catalog.apps["com.example.feed"]?.url.path == first.path)
        #expect(catalog.apps["com.example.feed"]?.permittedIdentifiers == ["com.example.feed.refresh"])
        #expect(Set(catalog.invalid.keys) == [second.path, third.path, clash.path])
        for loser in [second, third] {
            let error = try #require(catalog.invalid[loser.path])
            #expect(error.code == .invalidBundle)
            #expect(error.key == "CFBundleIdentifier")
            #expect(error.description.contains(first.path), "does not name the winner: \(error)")
            #expect(error.description.contains(loser.path), "does not name the loser: \(error)")
            #expect(error.description.contains("com.example.feed"), "does not name the identifier: \(error)")
        }
        let clashError = try #require(catalog.invalid[clash.path])
        #expect(clashError.description.contains(host.appendingPathComponent("PlugIns/Share.appex").path), "\(clashError)")
        #expect(clashError.description.contains(clash.path), "\(clashError)")
        #expect(catalog.app(containingBundle: "com.example.host.share")?.identifier == "com.example.host")
    }

    @Test func missingOrUnreadableDirectory() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }

        let missing = fixture.plugins.appendingPathComponent("nope")
        let catalog = PluginCatalog.scan(missing)
        #expect(catalog.apps.isEmpty)
        #expect(Array(catalog.invalid.keys) == [missing.path])
        let error = try #require(catalog.invalid[missing.path])
        #expect(error.errno == ENOENT)
        #expect(error.file == missing.path)
        #expect(error.description.contains(missing.path))
        #expect(error.description.contains(String(cString: strerror(ENOENT))))

        let file = fixture.base.appendingPathComponent("plain-file")
        try Data("x".utf8).write(to: file)
        let notADirectory = PluginCatalog.scan(file)
        #expect(notADirectory.apps.isEmpty)
        #expect(notADirectory.invalid[file.path]?.errno == ENOTDIR)

        #expect(PluginCatalog.scan(fixture.plugins) == PluginCatalog(), "an empty directory is an empty catalog")
    }

    @Test func unreadableBundleIsInvalid() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let locked = try PCFixture.writeBundle(at: fixture.plugins.appendingPathComponent("Locked.app"), identifier: "com.example.locked")
        try PCFixture.writeBundle(at: fixture.plugins.appendingPathComponent("Open.app"), identifier: "com.example.open")
        try #require(chmod(locked.path, 0) == 0)

        let catalog = PluginCatalog.scan(fixture.plugins)
        #expect(catalog.apps["com.example.open"] != nil, "one unreadable bundle does not hide the others")
        // Root ignores permissions: for root the bundle is readable, and valid. The unreadable
        // case can only be checked by a user that permissions apply to.
        if getuid() == 0 {
            #expect(catalog.apps["com.example.locked"] != nil)
        } else {
            #expect(catalog.apps["com.example.locked"] == nil)
            let error = try #require(catalog.invalid[locked.path])
            #expect(error.errno == EACCES)
            #expect(error.description.contains(locked.path))
        }
    }

    // MARK: - Watcher

    @Test func bundleMovedInIsSeenAndThenWatched() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let changes = PCChanges(directory: fixture.plugins)
        let watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) { changes.record() }
        defer { watcher.stop() }

        let bundle = try fixture.dropIn("Feed.app", identifier: "com.example.feed")
        let dropped = changes.waitFor(since: 0) { $0.apps["com.example.feed"] != nil }
        #expect(dropped != nil, "no onChange with the bundle after it was moved in (\(changes.count) calls)")

        // The bundle moved in is watched itself: a file written into it is a change.
        let mark = changes.count
        try PCFixture.writeInfo(at: bundle, identifier: "com.example.feed", permitted: ["com.example.feed.refresh"])
        let rewritten = changes.waitFor(since: mark) { $0.apps["com.example.feed"]?.permittedIdentifiers == ["com.example.feed.refresh"] }
        #expect(rewritten != nil, "no onChange after rewriting the Info.plist of a bundle moved in")
    }

    @Test func bundleCopiedInFileByFile() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let changes = PCChanges(directory: fixture.plugins)
        let watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) { changes.record() }
        defer { watcher.stop() }

        // The bundle directory first, alone: reported (an invalid bundle, for now).
        let bundle = fixture.plugins.appendingPathComponent("Feed.app")
        try FileManager.default.createDirectory(at: bundle, withIntermediateDirectories: false)
        let empty = changes.waitFor(since: 0) { $0.invalid[bundle.path] != nil }
        #expect(empty != nil, "no onChange after mkdir of a bundle directory")

        // Then its files, after that call: only the watch on the bundle directory sees them.
        let mark = changes.count
        try PCFixture.writeInfo(at: bundle, identifier: "com.example.feed")
        try PCFixture.copyLibrary(into: bundle)
        let complete = changes.waitFor(since: mark) { $0.apps["com.example.feed"] != nil }
        #expect(complete != nil, "no onChange with the complete bundle after its files were written")

        // An extension copied in the same way, into a PlugIns/ made after the bundle.
        let mark2 = changes.count
        let appex = bundle.appendingPathComponent("PlugIns/Share.appex")
        try FileManager.default.createDirectory(at: appex, withIntermediateDirectories: true)
        #expect(changes.waitForCall(since: mark2), "no onChange after PlugIns/Share.appex was made")
        let mark3 = changes.count
        try PCFixture.writeInfo(at: appex, identifier: "com.example.feed.share", isExtension: true)
        try PCFixture.copyLibrary(into: appex)
        let withExtension = changes.waitFor(since: mark3) {
            $0.apps["com.example.feed"]?.extensions.map(\.identifier) == ["com.example.feed.share"]
        }
        #expect(withExtension != nil, "no onChange with the extension after its files were written")
    }

    @Test func bundleRemoved() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let bundle = try PCFixture.writeBundle(at: fixture.plugins.appendingPathComponent("Feed.app"), identifier: "com.example.feed")
        try PCFixture.writeBundle(at: fixture.plugins.appendingPathComponent("Other.app"), identifier: "com.example.other")
        let changes = PCChanges(directory: fixture.plugins)
        let watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) { changes.record() }
        defer { watcher.stop() }

        try FileManager.default.removeItem(at: bundle)
        let removed = changes.waitFor(since: 0) { $0.apps["com.example.feed"] == nil && $0.apps["com.example.other"] != nil }
        #expect(removed != nil, "no onChange after a bundle was removed")

        // Moved out (renamed away) is a removal too, and the moved bundle is no longer watched.
        let mark = changes.count
        let away = fixture.staging.appendingPathComponent("Other.app")
        try #require(rename(fixture.plugins.appendingPathComponent("Other.app").path, away.path) == 0)
        let movedOut = changes.waitFor(since: mark) { $0.apps.isEmpty }
        #expect(movedOut != nil, "no onChange after a bundle was moved out")
        let mark2 = changes.count
        try PCFixture.writeInfo(at: away, identifier: "com.example.other", permitted: ["com.example.other.x"])
        #expect(changes.count(after: debounce * 4) == mark2, "a bundle moved out of the directory is still watched")
    }

    @Test func infoPlistRewrittenInExistingBundle() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        // Present before the watcher starts: watched from the start.
        let bundle = try PCFixture.writeBundle(at: fixture.plugins.appendingPathComponent("Feed.app"), identifier: "com.example.feed")
        let appex = try PCFixture.writeBundle(at: bundle.appendingPathComponent("PlugIns/Share.appex"),
                                              identifier: "com.example.feed.share", isExtension: true)
        let changes = PCChanges(directory: fixture.plugins)
        let watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) { changes.record() }
        defer { watcher.stop() }

        // Rewritten in place (IN_CLOSE_WRITE).
        try PCFixture.writeInfo(at: bundle, identifier: "com.example.feed", permitted: ["com.example.feed.one"])
        #expect(changes.waitFor(since: 0) { $0.apps["com.example.feed"]?.permittedIdentifiers == ["com.example.feed.one"] } != nil,
                "no onChange after the Info.plist was rewritten in place")

        // Replaced atomically (a temporary file renamed over it: IN_MOVED_TO).
        let mark = changes.count
        let text = PCFixture.infoPlist(identifier: "com.example.feed", permitted: ["com.example.feed.two"])
        try Data(text.utf8).write(to: bundle.appendingPathComponent("Info.plist"), options: .atomic)
        #expect(changes.waitFor(since: mark) { $0.apps["com.example.feed"]?.permittedIdentifiers == ["com.example.feed.two"] } != nil,
                "no onChange after the Info.plist was replaced atomically")

        // An extension's Info.plist, two levels down.
        let mark2 = changes.count
        try PCFixture.writeInfo(at: appex, identifier: "com.example.feed.share", permitted: ["com.example.feed.share.task"], isExtension: true)
        #expect(changes.waitFor(since: mark2) {
            $0.apps["com.example.feed"]?.extensions.first?.permittedIdentifiers == ["com.example.feed.share.task"]
        } != nil, "no onChange after an extension's Info.plist was rewritten")

        // Permissions changed (IN_ATTRIB).
        let mark3 = changes.count
        try #require(chmod(bundle.appendingPathComponent("libPlugin.so").path, 0o600) == 0)
        #expect(changes.waitForCall(since: mark3), "no onChange after chmod of a file in the bundle")
    }

    @Test func aBurstIsOneCallNotTwenty() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let existing = try PCFixture.writeBundle(at: fixture.plugins.appendingPathComponent("Feed.app"), identifier: "com.example.feed")
        let changes = PCChanges(directory: fixture.plugins)
        let burstDebounce: Duration = .milliseconds(200)
        let watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: burstDebounce) { changes.record() }
        defer { watcher.stop() }

        // 20 bundles built aside, then moved in back to back.
        let names = (1...20).map { "Burst\($0).app" }
        for (index, name) in names.enumerated() {
            try PCFixture.writeBundle(at: fixture.staging.appendingPathComponent(name), identifier: "com.example.burst\(index + 1)")
        }
        for name in names {
            try #require(rename(fixture.staging.appendingPathComponent(name).path, fixture.plugins.appendingPathComponent(name).path) == 0)
        }
        let all = changes.waitFor(since: 0) { $0.apps.count == 21 }
        #expect(all != nil, "no onChange with all 20 bundles")
        let afterMoves = changes.count(after: burstDebounce * 3)
        #expect((1...3).contains(afterMoves), "20 moves made \(afterMoves) calls")

        // 20 rewrites of one Info.plist, back to back.
        let mark = changes.count
        for round in 1...20 {
            try PCFixture.writeInfo(at: existing, identifier: "com.example.feed", permitted: ["com.example.feed.r\(round)"])
        }
        let last = changes.waitFor(since: mark) { $0.apps["com.example.feed"]?.permittedIdentifiers == ["com.example.feed.r20"] }
        #expect(last != nil, "no onChange after 20 rewrites")
        let afterRewrites = changes.count(after: burstDebounce * 3) - mark
        #expect((1...3).contains(afterRewrites), "20 rewrites made \(afterRewrites) calls")
    }

    @Test func noCallAfterStop() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let changes = PCChanges(directory: fixture.plugins)
        let watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) { changes.record() }

        try fixture.dropIn("Feed.app", identifier: "com.example.feed")
        #expect(changes.waitForCall(since: 0), "the watcher reports before it is stopped")

        // A change still inside its debounce when stop() is called is never reported.
        try fixture.dropIn("Other.app", identifier: "com.example.other")
        watcher.stop()
        let atStop = changes.count
        watcher.stop() // idempotent
        try fixture.dropIn("Third.app", identifier: "com.example.third")
        try FileManager.default.removeItem(at: fixture.plugins.appendingPathComponent("Feed.app"))
        #expect(changes.count(after: debounce * 5) == atStop, "onChange called after stop() returned")
    }

    @Test func stopFromInsideOnChangeAndDroppingTheWatcher() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let changes = PCChanges(directory: fixture.plugins)
        final class Box: @unchecked Sendable { var watcher: PluginDirectoryWatcher? }
        let box = Box()
        box.watcher = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) {
            box.watcher?.stop() // on the watcher's own thread: must not deadlock
            changes.record()
        }
        try fixture.dropIn("Feed.app", identifier: "com.example.feed")
        #expect(changes.waitForCall(since: 0), "no onChange")
        try fixture.dropIn("Other.app", identifier: "com.example.other")
        #expect(changes.count(after: debounce * 5) == 1, "onChange called after stop() from inside it")
        box.watcher = nil

        // A watcher dropped without stop() stops itself (deinit) and calls no more.
        let dropped = PCChanges(directory: fixture.plugins)
        var watcher: PluginDirectoryWatcher? = try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) { dropped.record() }
        #expect(watcher != nil)
        watcher = nil
        try fixture.dropIn("Third.app", identifier: "com.example.third")
        #expect(dropped.count(after: debounce * 5) == 0, "a released watcher still calls onChange")
    }

    @Test func initFailureNamesTheDirectory() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        let missing = fixture.plugins.appendingPathComponent("missing")
        do {
            let watcher = try PluginDirectoryWatcher(directory: missing) {}
            watcher.stop()
            Issue.record("a watcher on a missing directory was created")
        } catch {
            #expect(error.file == missing.path)
            #expect(error.errno == ENOENT)
            #expect(error.description.contains(missing.path))
        }
        let file = fixture.base.appendingPathComponent("plain-file")
        try Data("x".utf8).write(to: file)
        #expect(throws: BGTaskError.self) { try PluginDirectoryWatcher(directory: file) {}.stop() }
    }

    @Test func stoppedWatchersCloseTheirDescriptors() throws {
        let fixture = try PCFixture()
        defer { fixture.remove() }
        /// This process's inotify descriptors (other tests' watchers, running in parallel, count
        /// too: hence the margin below).
        func inotifyDescriptors() -> Int {
            let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            return fds.filter { fd in
                (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")) == "anon_inode:inotify"
            }.count
        }
        let before = inotifyDescriptors()
        for _ in 0..<40 {
            try PluginDirectoryWatcher(directory: fixture.plugins, debounce: debounce) {}.stop()
        }
        #expect(inotifyDescriptors() < before + 20, "40 stopped watchers left their inotify descriptors open")
    }

    @Test func pollTimeoutsRoundUp() {
        #expect(PluginWatchLoop.milliseconds(.zero) == 0)
        #expect(PluginWatchLoop.milliseconds(.nanoseconds(1)) == 1)
        #expect(PluginWatchLoop.milliseconds(.milliseconds(150)) == 150)
        #expect(PluginWatchLoop.milliseconds(.microseconds(150_001)) == 151)
        #expect(PluginWatchLoop.milliseconds(.seconds(3)) == 3000)
        #expect(PluginWatchLoop.milliseconds(.seconds(-1)) == 0)
    }
}

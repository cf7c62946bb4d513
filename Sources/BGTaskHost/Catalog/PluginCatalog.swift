import BGTaskControl
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The bundles in the plugin directory, validated. Rebuilt by `scan()`; `PluginDirectoryWatcher`
/// says when to rescan.
public struct PluginCatalog: Sendable, Equatable {
    /// Valid apps by bundle identifier.
    public var apps: [String: PluginBundle]
    /// Entries that failed validation (or could not be read), by path, with the error.
    public var invalid: [String: BGTaskError]

    public init(apps: [String: PluginBundle] = [:], invalid: [String: BGTaskError] = [:]) {
        self.apps = apps
        self.invalid = invalid
    }

    /// Reads every `*.app` directly inside `directory`. Other entries are ignored; an
    /// unreadable entry or directory is reported in `invalid` (keyed by its path), never thrown.
    /// Two bundles with one identifier: the first by name wins, the other is invalid.
    public static func scan(_ directory: URL) -> PluginCatalog {
        var catalog = PluginCatalog()
        let names: [String]
        do {
            names = try DirectoryListing.names(in: directory.path)
        } catch {
            catalog.invalid[directory.path] = BGTaskError(
                .system, file: directory.path, errno: error.errno,
                "cannot read the plugin directory: \(error.detail)")
            return catalog
        }

        // Every identifier claimed so far (apps and their valid extensions), with the path of
        // the bundle that has it: an extension is a bundle too, so an app whose identifier is an
        // earlier app's extension's (or whose extension's is an earlier bundle's) is a duplicate.
        var owners: [String: String] = [:]
        for name in names.filter({ $0.hasSuffix(".app") }).sorted() {
            let url = directory.appendingPathComponent(name)
            let path = url.path
            if let problem = unreadableDirectory(path) {
                catalog.invalid[path] = problem
                continue
            }
            let bundle: PluginBundle
            do {
                bundle = try BundleReader.read(url)
            } catch {
                catalog.invalid[path] = error
                continue
            }
            let claimed = [bundle] + bundle.extensions
            if let clash = claimed.first(where: { owners[$0.identifier] != nil }), let owner = owners[clash.identifier] {
                let whose = clash.kind == .app ? "" : " (the identifier of its extension \(clash.url.lastPathComponent))"
                catalog.invalid[path] = BGTaskError(
                    .invalidBundle, file: clash.infoPlistURL.path, key: "CFBundleIdentifier",
                    "'\(clash.identifier)'\(whose) is also the identifier of \(owner); the bundle first by name is kept, so \(path) is ignored")
                continue
            }
            for claimant in claimed { owners[claimant.identifier] = claimant.url.path }
            catalog.apps[bundle.identifier] = bundle
        }
        return catalog
    }

    /// The app whose bundle, or whose extension, has this identifier.
    public func app(containingBundle identifier: String) -> PluginBundle? {
        if let app = apps[identifier] { return app }
        return sortedApps.first { app in app.extensions.contains { $0.identifier == identifier } }
    }

    /// The app whose BGTaskSchedulerPermittedIdentifiers permits `taskIdentifier` (first by id).
    public func app(permitting taskIdentifier: String) -> PluginBundle? {
        sortedApps.first { $0.permits(taskIdentifier) }
    }

    /// The valid apps in identifier order.
    private var sortedApps: [PluginBundle] {
        apps.sorted { $0.key < $1.key }.map(\.value)
    }

    /// The error for a bundle directory this process may not list or enter (`chmod 000`), or nil.
    /// BundleReader would otherwise report such a bundle as missing its Info.plist. Entries that
    /// are not directories (or do not resolve) are left to BundleReader, which says what they
    /// are. Root passes `access(2)` whatever the mode, and can indeed read the bundle.
    static func unreadableDirectory(_ path: String) -> BGTaskError? {
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else { return nil }
        guard access(path, R_OK | X_OK) != 0 else { return nil }
        return BGTaskError(.invalidBundle, file: path, errno: errno,
                           "the bundle directory cannot be read (it needs read and search permission)")
    }
}

/// Directory listing with the errno of a failure (FileManager's errors lose it).
enum DirectoryListing {
    /// The entries of `path`, without `.` and `..`, in no particular order.
    static func names(in path: String) throws(BGTaskError) -> [String] {
        guard let stream = opendir(path) else {
            throw BGTaskError(.system, file: path, errno: errno, "opendir failed")
        }
        defer { closedir(stream) }
        var names: [String] = []
        while true {
            errno = 0
            guard let entry = readdir(stream) else {
                let error = errno
                if error != 0 { throw BGTaskError(.system, file: path, errno: error, "readdir failed") }
                return names
            }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
    }
}

/// Watches a plugin directory with inotify: the directory itself and each bundle inside it
/// (files copied in after the bundle directory was created, Info.plist rewritten, a bundle
/// moved in or out). Calls `onChange` on its own thread, debounced (`debounce` after the last
/// event), never more than once per burst. Linux only.
public final class PluginDirectoryWatcher: @unchecked Sendable {
    private let loop: PluginWatchLoop
    private let finished = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var stopped = false

    public init(directory: URL, debounce: Duration = .milliseconds(150), onChange: @escaping @Sendable () -> Void) throws(BGTaskError) {
        let loop = try PluginWatchLoop(directory: directory, debounce: debounce, onChange: onChange)
        self.loop = loop
        let finished = self.finished
        // The thread holds the loop, not the watcher, so dropping the watcher stops it (deinit).
        let thread = Thread {
            loop.run()
            finished.signal()
        }
        thread.name = "bgtask.plugin-watcher"
        thread.start()
    }

    deinit { stop() }

    /// Stops watching and joins the thread; `onChange` is not called after it returns.
    public func stop() {
        lock.lock()
        let already = stopped
        stopped = true
        lock.unlock()
        guard !already else { return }
        loop.requestStop()
        // Called from `onChange` (on the watcher's own thread): joining would deadlock. The loop
        // ends as soon as `onChange` returns and calls it no more; it closes its descriptors.
        if loop.isRunningOnLoopThread { return }
        finished.wait()
    }
}

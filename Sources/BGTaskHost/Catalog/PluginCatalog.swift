import Foundation

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
    public static func scan(_ directory: URL) -> PluginCatalog { fatalError("unimplemented") }

    /// The app whose bundle, or whose extension, has this identifier.
    public func app(containingBundle identifier: String) -> PluginBundle? { fatalError("unimplemented") }

    /// The app whose BGTaskSchedulerPermittedIdentifiers permits `taskIdentifier` (first by id).
    public func app(permitting taskIdentifier: String) -> PluginBundle? { fatalError("unimplemented") }
}

/// Watches a plugin directory with inotify: the directory itself and each bundle inside it
/// (files copied in after the bundle directory was created, Info.plist rewritten, a bundle
/// moved in or out). Calls `onChange` on its own thread, debounced (`debounce` after the last
/// event), never more than once per burst. Linux only.
public final class PluginDirectoryWatcher: @unchecked Sendable {
    public init(directory: URL, debounce: Duration = .milliseconds(150), onChange: @escaping @Sendable () -> Void) throws(BGTaskError) {
        fatalError("unimplemented")
    }

    /// Stops watching and joins the thread; `onChange` is not called after it returns.
    public func stop() { fatalError("unimplemented") }
}

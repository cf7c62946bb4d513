import BGTaskABI
import CBGTaskPluginABI
import Foundation

// The app's container and its app groups, as iOS code reaches them. In a launch the host lays
// the container out as iOS does (Documents, Library/Caches, Library/Application Support,
// Library/Preferences, tmp) and points Foundation's own lookups into it: NSHomeDirectory(),
// FileManager's urls(for:in:) for documents, caches and application support,
// NSTemporaryDirectory() and UserDefaults resolve there without anything from this module.
// What Linux's Foundation lacks altogether is added here.

extension FileManager {
    /// The shared container of the app group `groupIdentifier`: one directory for the app and
    /// every extension that names the group in its `com.apple.security.application-groups`
    /// entitlement; nil when this bundle does not name it (or outside a launch).
    public func containerURL(forSecurityApplicationGroupIdentifier groupIdentifier: String) -> URL? {
        guard let (api, host) = HostConnection.current.connection, api.has(\.app_group_container),
              let path = groupIdentifier.withCString({ api.app_group_container(host, $0) }) else { return nil }
        return URL(fileURLWithPath: String(cString: path), isDirectory: true)
    }
}

// Apple's Foundation has these; Linux's does not (swift-foundation declares them only in
// Apple's build), so iOS code that uses them would not compile.
extension URL {
    /// The app's `Documents` directory.
    public static var documentsDirectory: URL {
        FileManager.default.urls(for: .documentDirectory, in: .userDomainMask).first
            ?? homeDirectory.appendingPathComponent("Documents", isDirectory: true)
    }

    /// The app's `Library` directory. (`FileManager.urls(for: .libraryDirectory, in:)` is empty
    /// on Linux: its Foundation maps no library directory; use this, or the home directory's
    /// `Library`.)
    public static var libraryDirectory: URL {
        homeDirectory.appendingPathComponent("Library", isDirectory: true)
    }

    /// The app's `Library/Caches` directory.
    public static var cachesDirectory: URL {
        FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask).first
            ?? libraryDirectory.appendingPathComponent("Caches", isDirectory: true)
    }

    /// The app's `Library/Application Support` directory.
    public static var applicationSupportDirectory: URL {
        FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
            ?? libraryDirectory.appendingPathComponent("Application Support", isDirectory: true)
    }
}

import BGTaskWire
import Glibc

/// The launch's bundle and plugin library, opened by the launch while it still has the host's
/// uid, and reached through those descriptors when the app's own uid cannot reach them by path:
/// a bundle may live in a private directory of the operator's (0700), and the file the host
/// validated is the file that runs.
enum PluginLibrary {
    /// The bundle directory (O_PATH) and the library (for reading), or -1.
    nonisolated(unsafe) static var bundleDescriptor: Int32 = -1
    nonisolated(unsafe) static var libraryDescriptor: Int32 = -1

    /// O_PATH (the same on every Linux architecture; Glibc's module does not export it).
    static let openPath: Int32 = 0o10000000

    /// Opens the bundle and its library. A failure is not reported here: the load says why,
    /// by path.
    /// Async-signal-safe: yes (open only); called before `Sandbox.becomeApp`.
    static func open(_ assignment: LaunchAssignment) {
        bundleDescriptor = Glibc.open(assignment.bundlePath, openPath | O_DIRECTORY | O_CLOEXEC)
        libraryDescriptor = Glibc.open(assignment.executablePath, O_RDONLY | O_CLOEXEC)
    }

    /// The path the launch knows its executable by (`Bundle.main`, the loader), as its own uid:
    /// the real one when that uid reaches the very file that was opened (the same device and
    /// inode); otherwise the same file beneath `/proc/self/fd/BUNDLE`, a path that reaches the
    /// bundle whatever the directories above it allow (Landlock still checks the real
    /// hierarchy: the bundle's rule covers it), so `Bundle.main` reads its Info.plist and
    /// resources there; the library's own descriptor when the executable is not in the bundle.
    /// Called after `Sandbox.becomeApp`.
    static func executablePath(_ assignment: LaunchAssignment) -> String {
        let path = assignment.executablePath
        guard libraryDescriptor >= 0 else { return path }
        var opened = stat()
        var byPath = stat()
        if fstat(libraryDescriptor, &opened) == 0, stat(path, &byPath) == 0,
           opened.st_dev == byPath.st_dev, opened.st_ino == byPath.st_ino, access(path, R_OK) == 0 {
            close(bundleDescriptor)
            bundleDescriptor = -1
            return path
        }
        let prefix = assignment.bundlePath.hasSuffix("/") ? assignment.bundlePath : assignment.bundlePath + "/"
        if bundleDescriptor >= 0, path.hasPrefix(prefix) {
            // Kept open for the launch's life: Bundle.main reads beneath it.
            return "/proc/self/fd/\(bundleDescriptor)/" + path.dropFirst(prefix.count)
        }
        return "/proc/self/fd/\(libraryDescriptor)"
    }

    /// Loads the library at `path` (from `executablePath`); the library's descriptor is closed
    /// after: the mapping keeps the file.
    /// Async-signal-safe: no — dlopen; the launch's main thread, once.
    static func load(_ path: String) -> UnsafeMutableRawPointer? {
        defer {
            if libraryDescriptor >= 0 { close(libraryDescriptor) }
            libraryDescriptor = -1
        }
        return dlopen(path, RTLD_NOW | RTLD_LOCAL)
    }
}

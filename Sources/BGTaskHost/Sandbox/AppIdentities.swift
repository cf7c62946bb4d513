import Foundation
import Glibc

/// The unprivileged uid each app runs as when the host is root, and the gid of each app group,
/// allocated once per identifier and kept across restarts (as Android gives each app its own
/// uid). An app's extensions run as their app's uid: on iOS an app and its extensions are one
/// user, and their shared containers and group defaults rely on it. A group's gid is every
/// member's supplementary group, for app groups shared between different apps.
///
/// Kept in `STATE/app-ids` (mode 0600), one `uid|gid KIND IDENTIFIER` line each, appended under
/// an flock so that a host and a `bgtask run` on the same state directory agree. Thread-safe.
public final class AppIdentities: @unchecked Sendable {
    /// The first uid (and gid) handed out; far above any login user's and systemd's dynamic range.
    public static let firstID: UInt32 = 7_000_000
    /// How many identifiers there may be.
    public static let capacity: UInt32 = 1_000_000

    public let path: String
    private let lock = NSLock()
    private var ids: [String: UInt32] = [:]
    private var loaded = false
    /// The table's size when this process last read or wrote it (-1: unknown).
    private var knownSize: Int64 = -1

    public init(stateDirectory: URL) {
        path = stateDirectory.appendingPathComponent("app-ids").path
    }

    /// The uid of app `bundleIdentifier` (an extension: its app's).
    public func uid(forApp bundleIdentifier: String) throws(BGTaskError) -> UInt32 {
        try id(for: "app " + bundleIdentifier)
    }

    /// The gid of app group `identifier`.
    public func gid(forGroup identifier: String) throws(BGTaskError) -> UInt32 {
        try id(for: "group " + identifier)
    }

    private func id(for key: String) throws(BGTaskError) -> UInt32 {
        lock.lock()
        defer { lock.unlock() }
        if !loaded, let existing = try? read() {
            ids = existing
            loaded = true
        }
        if let id = ids[key] { return id }
        // Another process may have allocated since: under the file's lock, read again, then append.
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw BGTaskError(.system, file: path, errno: errno, "cannot open the app identity table") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX) == 0 else { throw BGTaskError(.system, file: path, errno: errno, "cannot lock the app identity table") }
        // Read again only when another process appended since this one last read or wrote
        // it (the table only grows): a host making a thousand apps' first launches read the
        // whole table a thousand times.
        var info = stat()
        if fstat(fd, &info) != 0 || Int64(info.st_size) != knownSize {
            ids = (try? read()) ?? ids
            knownSize = fstat(fd, &info) == 0 ? Int64(info.st_size) : -1
        }
        loaded = true
        if let id = ids[key] { return id }
        let next = (ids.values.max().map { $0 + 1 }) ?? Self.firstID
        guard next < Self.firstID + Self.capacity else {
            throw BGTaskError(.system, file: path, "every one of the \(Self.capacity) app identities is taken")
        }
        let line = Array("\(next) \(key)\n".utf8)
        guard line.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == line.count, fsync(fd) == 0 else {
            throw BGTaskError(.system, file: path, errno: errno, "cannot write the app identity table")
        }
        ids[key] = next
        if knownSize >= 0 { knownSize += Int64(line.count) }
        return next
    }

    private func read() throws -> [String: UInt32] {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        var ids: [String: UInt32] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ", maxSplits: 1)
            if parts.count == 2, let id = UInt32(parts[0]) { ids[String(parts[1])] = id }
        }
        return ids
    }

    /// Gives `path` and everything beneath it to `uid`:`gid`, without following a link (lchown):
    /// a container made by an earlier launch that ran as root, or by hand. Only when the
    /// directory itself is not the app's yet, so the usual launch pays one stat.
    static func giveContainer(_ path: String, uid: UInt32, gid: UInt32) {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid != uid || info.st_gid != gid else { return }
        lchown(path, uid, gid)
        guard let walker = FileManager.default.enumerator(atPath: path) else { return }
        while let relative = walker.nextObject() as? String {
            lchown(path + "/" + relative, uid, gid)
        }
    }

    /// Directories already opened for traversal by this process.
    private static let traversable = LockedValue(Set<String>())

    /// Adds traverse permission (x, not r) for group and others to each directory that exists,
    /// once per process: app uids must pass through the state directory to their containers.
    static func allowTraversal(_ directories: [String]) {
        for directory in directories where !traversable.withLock({ $0.contains(directory) }) {
            let fd = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { continue }
            var info = stat()
            if fstat(fd, &info) == 0, info.st_mode & 0o011 != 0o011 { fchmod(fd, (info.st_mode & 0o7777) | 0o011) }
            close(fd)
            _ = traversable.withLock { $0.insert(directory) }
        }
    }

    /// An app group's shared container: root's, group `gid`'s, setgid (what members make in it is
    /// the group's) and closed to others.
    static func giveGroupContainer(_ path: String, subdirectories: [String], gid: UInt32) {
        for directory in [path] + subdirectories.map({ path + "/" + $0 }) {
            // Through a descriptor of the directory itself: never a link's target.
            let fd = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            var info = stat()
            guard fstat(fd, &info) == 0 else { continue }
            if info.st_gid != gid || info.st_uid != 0 { fchown(fd, 0, gid) }
            if info.st_mode & 0o7777 != 0o2770 { fchmod(fd, 0o2770) }
        }
    }
}

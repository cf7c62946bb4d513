import BGTaskControl
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
    package static func giveContainer(_ path: String, uid: UInt32, gid: UInt32) {
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

    /// Gives group and others traverse permission (x) and nothing else (no r, no w) on each
    /// directory that exists, once per process: app uids must pass through the state directory,
    /// `containers/` and `groups/` to their own, but may not list them, nor watch them with
    /// inotify (which needs read permission, and which Landlock does not govern): another app's
    /// container names and activity are not theirs to see. (`containers/` was made 0755.)
    package static func allowTraversal(_ directories: [String]) {
        for directory in directories where !traversable.withLock({ $0.contains(directory) }) {
            let fd = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { continue }
            var info = stat()
            if fstat(fd, &info) == 0, info.st_mode & 0o077 != 0o011 { fchmod(fd, (info.st_mode & 0o7700) | 0o011) }
            close(fd)
            _ = traversable.withLock { $0.insert(directory) }
        }
    }

    /// An app group's shared container: root's, group `gid`'s, setgid (what members make in it is
    /// the group's) and closed to others.
    package static func giveGroupContainer(_ path: String, subdirectories: [String], gid: UInt32) {
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

/// Who may have an app group's container: the host's answer, not the bundle's. Naming a group
/// in `com.apple.security.application-groups` is a claim any bundle can write (so is a team
/// identifier, and so is a bundle identifier: nothing here is signed), so the host ties each
/// group to an owner and grants it only to apps tied to that owner:
///
/// - **the owner**: the first app to launch with the group (an extension counts as its app),
///   kept in `STATE/app-group-owners` (the host's, 0600, one `GROUP APP` line each, appended
///   under an flock, never rewritten);
/// - **its extensions**: an extension is its app's (same uid, same bundle on disk), and shares
///   every group its app has;
/// - **the operator's grant**: a line `GROUP APP [APP...]` in `STATE/app-group-grants`, a file
///   the operator writes (it must belong to the host's uid or root and be writable by no one
///   else, or it is ignored); the way two apps of one developer share a group, as one signing
///   team does on iOS.
///
/// Anyone else is refused, with the reason in the record (`app_groups_refused`) and in
/// `bgtask validate --state`. Thread-safe.
public final class AppGroupOwners: @unchecked Sendable {
    public let ownersPath: String
    public let grantsPath: String
    private let lock = NSLock()

    public init(stateDirectory: URL) {
        ownersPath = stateDirectory.appendingPathComponent("app-group-owners").path
        grantsPath = stateDirectory.appendingPathComponent("app-group-grants").path
    }

    /// What an app may have of the groups it names.
    public struct Decision: Sendable, Equatable {
        public var granted: [String] = []
        /// Group → why it was refused.
        public var refused: [String: String] = [:]

        /// The memberwise initializer, for the modules above this one.
        package init(granted: [String] = [], refused: [String: String] = [:]) {
            self.granted = granted
            self.refused = refused
        }
    }

    /// Decides for `app` (an extension: its containing app) and `groups`; an unowned group is
    /// claimed for `app` when `claim` (a launch), and only reported as what would happen when
    /// not (`bgtask validate`).
    public func decide(app: String, groups: [String], claim: Bool) throws(BGTaskError) -> Decision {
        guard !groups.isEmpty else { return Decision() }
        lock.lock()
        defer { lock.unlock() }
        let grants = readGrants()
        var decision = Decision()
        var owners = readOwners()
        var unowned = groups.filter { owners[$0] == nil }
        if claim && !unowned.isEmpty {
            owners = try appendOwners(unowned, app: app)
            unowned = []
        }
        for group in groups {
            guard let owner = owners[group] else {
                decision.granted.append(group)
                continue
            }
            if owner == app || grants[group]?.contains(app) == true {
                decision.granted.append(group)
            } else {
                decision.refused[group] = "app group '\(group)' belongs to \(owner) (the first app to use it, \(ownersPath)); "
                    + "another app has it only by the operator's grant: a line '\(group) \(app)' in \(grantsPath)"
            }
        }
        return decision
    }

    /// Owners as the file says: the first line for a group wins.
    private func readOwners() -> [String: String] {
        guard let text = try? String(contentsOfFile: ownersPath, encoding: .utf8) else { return [:] }
        var owners: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let words = line.split(separator: " ")
            if words.count == 2, owners[String(words[0])] == nil { owners[String(words[0])] = String(words[1]) }
        }
        return owners
    }

    /// Claims `groups` for `app` under the file's lock (another process may have claimed some
    /// since: the file's first line for a group wins), and returns the owners after.
    private func appendOwners(_ groups: [String], app: String) throws(BGTaskError) -> [String: String] {
        let fd = open(ownersPath, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw BGTaskError(.system, file: ownersPath, errno: errno, "cannot open the app group owners") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX) == 0 else { throw BGTaskError(.system, file: ownersPath, errno: errno, "cannot lock the app group owners") }
        var owners = readOwners()
        let lines = groups.filter { owners[$0] == nil }.map { "\($0) \(app)\n" }.joined()
        guard !lines.isEmpty else { return owners }
        let bytes = Array(lines.utf8)
        guard bytes.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == bytes.count, fsync(fd) == 0 else {
            throw BGTaskError(.system, file: ownersPath, errno: errno, "cannot write the app group owners")
        }
        for group in groups where owners[group] == nil { owners[group] = app }
        return owners
    }

    /// The operator's grants, group → apps; none unless the file is the host's uid's or root's
    /// and writable by no one else (`#` starts a comment).
    private func readGrants() -> [String: Set<String>] {
        let fd = open(grantsPath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return [:] }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == geteuid() || info.st_uid == 0,
              info.st_mode & 0o022 == 0, info.st_size < 1 << 20 else { return [:] }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count >= 0 else { return [:] }
        var grants: [String: Set<String>] = [:]
        for line in String(decoding: bytes[..<count], as: UTF8.self).split(separator: "\n") {
            let words = line.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0].split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard words.count >= 2 else { continue }
            grants[String(words[0]), default: []].formUnion(words.dropFirst().map(String.init))
        }
        return grants
    }
}

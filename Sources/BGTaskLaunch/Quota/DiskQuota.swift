import BGTaskControl
import BGTaskModel
import BGTaskSystem
import Foundation
import Glibc
import _BGTaskSystemShims

/// What an app holds on disk: allocated bytes and entries (inodes), in its container, its app
/// groups' containers and what the host stages for it (transfers).
public struct DiskUse: Sendable, Equatable {
    public var bytes: UInt64
    public var inodes: UInt64
    /// False when a walk stopped at `DiskAccounting.entryLimit` (the use is then more).
    public var complete: Bool

    public init(bytes: UInt64 = 0, inodes: UInt64 = 0, complete: Bool = true) {
        self.bytes = bytes
        self.inodes = inodes
        self.complete = complete
    }

    public static func + (a: DiskUse, b: DiskUse) -> DiskUse {
        DiskUse(bytes: a.bytes + b.bytes, inodes: a.inodes + b.inodes, complete: a.complete && b.complete)
    }

    public var description: String { "\(RunRecord.mib(bytes)) in \(inodes) file(s)\(complete ? "" : " or more")" }
}

/// An app's disk quota (`--disk-quota`, `--disk-quota-inodes`): what its container, its groups'
/// containers and its transfer staging may hold together. 0: no bound of that kind.
public struct DiskQuota: Sendable, Equatable {
    public var bytes: UInt64
    public var inodes: UInt64

    public init(bytes: UInt64 = DiskQuota.defaultBytes, inodes: UInt64 = DiskQuota.defaultInodes) {
        self.bytes = bytes
        self.inodes = inodes
    }

    /// 1 GiB and 100,000 files: far over what a background task's app keeps (an iOS app's
    /// container is a few MiB to a few hundred), far under what fills a disk or its inode table.
    public static let defaultBytes: UInt64 = 1 << 30
    public static let defaultInodes: UInt64 = 100_000
    public static let none = DiskQuota(bytes: 0, inodes: 0)

    public var isOn: Bool { bytes > 0 || inodes > 0 }

    /// Why `use` is over this quota, or nil.
    public func exceeded(by use: DiskUse) -> String? {
        var over: [String] = []
        if bytes > 0 && use.bytes > bytes { over.append("\(RunRecord.mib(use.bytes)), over its quota of \(RunRecord.mib(bytes)) (--disk-quota)") }
        if inodes > 0 && use.inodes > inodes { over.append("\(use.inodes) files, over its quota of \(inodes) (--disk-quota-inodes)") }
        return over.isEmpty ? nil : "its containers hold " + over.joined(separator: " and ")
    }
}

/// Accounting of disk use by walking directories, for filesystems without project quotas (the
/// host's only enforcement today; `ProjectQuotas.probe` says what the filesystem offers).
public enum DiskAccounting {
    /// Entries a walk visits at most (a walk of 10,000 entries took about 5 ms: see
    /// docs/records-and-limits.md); past it, the use is "or more", which is over any quota of
    /// inodes smaller than it.
    public static let entryLimit: Int64 = 1_000_000

    /// What the directories hold (a missing one holds nothing), links not followed, other
    /// filesystems not entered.
    public static func measure(_ directories: [String], entryLimit: Int64 = DiskAccounting.entryLimit) -> DiskUse {
        var total = DiskUse()
        for directory in directories {
            var entries: Int64 = 0
            var complete: Int32 = 1
            let bytes = bgtask_directory_usage_entries(directory, entryLimit, &entries, &complete)
            guard bytes >= 0 else { continue }
            total = total + DiskUse(bytes: UInt64(bytes), inodes: UInt64(max(0, entries)), complete: complete != 0)
        }
        return total
    }

    /// The directories an app's quota covers: its container and its app groups' containers.
    /// A group's container counts whole to every app that has the group (a share cannot be
    /// told apart by file: the conservative count).
    package static func directories(of plan: LaunchPlan) -> [String] {
        [plan.dataDirectory.path] + plan.bundle.appGroups.map { AppContainer.groupDirectory(root: plan.groupsDirectory.path, identifier: $0) }
    }

    /// The seam for what the host keeps for an app outside its containers (transfer staging):
    /// the transfers part sets it; nil counts nothing.
    ///
    /// A class around the closure, not the closure itself in the `LockedValue`: a function
    /// value passed `inout` through the generic `withLock` is reabstracted on the way in and
    /// back on the way out, so each read wrapped the stored closure in two more thunks. After a
    /// few thousand quota looks a call went 30,000 frames deep and overflowed a supervision
    /// loop's stack (1,000 launches with quotas on; `bgtask-bench --only scale`).
    package final class StagingMeter: Sendable {
        package let measure: @Sendable (String) -> DiskUse
        package init(_ measure: @escaping @Sendable (String) -> DiskUse) { self.measure = measure }
    }

    package static let stagingUse = LockedValue<StagingMeter?>(nil)

    package static func staging(of app: String) -> DiskUse {
        stagingUse.withLock { $0 }?.measure(app) ?? DiskUse()
    }

    /// What an app holds against its quota: a walk of its directories, and its staging.
    package static func use(of directories: [String], app: String) -> DiskUse {
        measure(directories) + staging(of: app)
    }

    /// What a launch's app holds against its quota.
    package static func use(of plan: LaunchPlan) -> DiskUse {
        use(of: directories(of: plan), app: plan.bundle.identifier)
    }
}

/// The disk quota, watched for one running launch. A walk of the containers is what costs
/// (milliseconds per 10,000 files), so it is not done on a clock alone: the filesystem's own
/// counters of used blocks and inodes (`statvfs`, a microsecond, shared by every launch for
/// 5 ms) are read every `lookInterval`, and the containers are walked when the filesystem
/// grew by more than half of what the app had left under its quota at its last walk (it
/// could then be over), and at least every `walkInterval`, never more often than 50 times the
/// last walk's cost (2 % of a core at most, whatever the app does).
package struct DiskQuotaWatch {
    package let quota: DiskQuota
    package let directories: [String]
    package let app: String
    /// How often the filesystem's counters are read (the supervisor's periodic check, 100 ms:
    /// a thousand sleeping launches read them 200 times a second together, see
    /// `filesystemUsed`).
    package let lookInterval: UInt64
    package static let walkInterval: UInt64 = 1_000_000_000
    package private(set) var nextCheckNs: UInt64
    private var nextWalkNs: UInt64
    private var earliestWalkNs: UInt64 = 0
    private var filesystemAtWalk: (bytes: UInt64, inodes: UInt64)?
    /// The last walk's result (with staging).
    package private(set) var use: DiskUse
    /// The most the walks found.
    package private(set) var peak: DiskUse

    package init(quota: DiskQuota, directories: [String], app: String, startNs: UInt64, use: DiskUse, lookInterval: UInt64) {
        self.quota = quota
        self.lookInterval = lookInterval
        self.directories = directories
        self.app = app
        self.use = use
        peak = use
        nextCheckNs = startNs + lookInterval
        nextWalkNs = startNs + Self.walkInterval
        filesystemAtWalk = directories.first.flatMap { Self.filesystemUsed($0, now: startNs) }
    }

    package var isOn: Bool { quota.isOn && !directories.isEmpty }

    /// Looks when due. Returns why the launch must be killed, or nil.
    package mutating func check(at now: UInt64) -> String? {
        guard isOn, now >= nextCheckNs else { return nil }
        nextCheckNs = now + lookInterval
        var due = now >= nextWalkNs
        if !due, let before = filesystemAtWalk, let current = Self.filesystemUsed(directories[0], now: now) {
            let grewBytes = current.bytes > before.bytes ? current.bytes - before.bytes : 0
            let grewInodes = current.inodes > before.inodes ? current.inodes - before.inodes : 0
            let bytesLeft = quota.bytes > use.bytes ? quota.bytes - use.bytes : 0
            let inodesLeft = quota.inodes > use.inodes ? quota.inodes - use.inodes : 0
            if quota.bytes > 0 && grewBytes > bytesLeft / 2 { due = true }
            if quota.inodes > 0 && grewInodes > inodesLeft / 2 { due = true }
        }
        guard due, now >= earliestWalkNs else { return nil }
        if deferWalks {
            walkWanted = true
            return nil
        }
        return walked(Self.walk(directories, app: app, now: now), at: now)
    }

    /// On a supervision loop a walk is not made where it is due: `walkWanted` says one is, the
    /// launch has it made on a worker (`walk`), and hands the result back (`walked`). A walk of a
    /// container of a million files takes a second; on the loop it would stall every launch
    /// the loop supervises.
    package var deferWalks = false
    package var walkWanted = false

    /// What a walk found: the app's use, the filesystem's counters at its start, its cost.
    package struct Walk: Sendable {
        package var use: DiskUse
        package var filesystem: (bytes: UInt64, inodes: UInt64)?
        package var costNs: UInt64

        /// The memberwise initializer, for the modules above this one.
        package init(use: DiskUse, filesystem: (bytes: UInt64, inodes: UInt64)? = nil, costNs: UInt64) {
            self.use = use
            self.filesystem = filesystem
            self.costNs = costNs
        }
    }

    /// The walk itself (any thread; it blocks for as long as the containers take).
    package static func walk(_ directories: [String], app: String, now: UInt64) -> Walk {
        let walkStart = bgtask_monotonic_ns()
        let filesystem = filesystemUsed(directories[0], now: now, fresh: true)
        let use = DiskAccounting.use(of: directories, app: app)
        return Walk(use: use, filesystem: filesystem, costNs: bgtask_monotonic_ns() - walkStart)
    }

    /// A walk's result kept: why the launch must be killed, or nil. The next walk comes after
    /// `walkInterval`, and no sooner than 50 times the walk's cost after this one.
    package mutating func walked(_ walk: Walk, at now: UInt64) -> String? {
        walkWanted = false
        filesystemAtWalk = walk.filesystem
        use = walk.use
        peak = DiskUse(bytes: max(peak.bytes, use.bytes), inodes: max(peak.inodes, use.inodes), complete: peak.complete && use.complete)
        earliestWalkNs = now + walk.costNs * 50
        nextWalkNs = max(now + Self.walkInterval, earliestWalkNs)
        return quota.exceeded(by: use)
    }

    /// Used blocks (bytes) and inodes of the filesystem holding `path`, shared for 5 ms by
    /// every launch whose container is in the same directory.
    package static func filesystemUsed(_ path: String, now: UInt64, fresh: Bool = false) -> (bytes: UInt64, inodes: UInt64)? {
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? path
        if !fresh, let cached = shared.withLock({ $0[directory] }), now < cached.at + 5_000_000 { return cached.used }
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return nil }
        let used = (bytes: UInt64(info.f_blocks - info.f_bfree) * UInt64(info.f_frsize), inodes: UInt64(info.f_files - info.f_ffree))
        shared.withLock { $0[directory] = (now, used) }
        return used
    }

    private static let shared = LockedValue([String: (at: UInt64, used: (bytes: UInt64, inodes: UInt64))]())
}

/// Whether the filesystem of a directory offers project quotas (ext4 or xfs mounted with
/// `prjquota`), from /proc/self/mountinfo: the kernel's own enforcement of a per-directory
/// quota. Said by `bgtask doctor` and in every record (`disk.enforcement`).
public enum ProjectQuotas {
    /// The mount holding `path`: its filesystem type, and whether it has project quotas.
    public static func probe(_ path: String) -> (filesystem: String, mountPoint: String, projectQuotas: Bool)? {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return nil }
        var resolved = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let real = realpath(path, &resolved) != nil ? String(decoding: resolved.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : path
        var best: (filesystem: String, mountPoint: String, projectQuotas: Bool)?
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard fields.count >= 7, let dash = fields.firstIndex(of: "-"), dash > 4, dash + 1 < fields.count else { continue }
            let mountPoint = String(fields[4]).replacingOccurrences(of: "\\040", with: " ")
            guard real == mountPoint || real.hasPrefix(mountPoint == "/" ? "/" : mountPoint + "/") else { continue }
            if let best, best.mountPoint.count > mountPoint.count { continue }
            let filesystem = String(fields[dash + 1])
            let options = (fields[5].split(separator: ",") + (dash + 3 < fields.count ? fields[dash + 3].split(separator: ",") : []))
            let quotas = options.contains { $0 == "prjquota" || $0 == "pquota" || $0 == "prjjquota" || $0.hasPrefix("prjjquota=") }
            best = (filesystem, mountPoint, quotas)
        }
        return best
    }

    /// How quotas are enforced on `path`'s filesystem, for the record and `bgtask doctor`.
    public static func enforcement(_ path: String) -> String {
        guard let mount = probe(path) else { return "accounting (the filesystem of \(path) could not be identified)" }
        if mount.projectQuotas {
            return "accounting (\(mount.filesystem) at \(mount.mountPoint) offers project quotas; this host does not set them yet)"
        }
        return "accounting (\(mount.filesystem) at \(mount.mountPoint) has no project quotas: ext4 or xfs mounted with prjquota gives them)"
    }

    package static let cached = LockedValue([String: String]())

    /// `enforcement`, asked once per directory.
    package static func cachedEnforcement(_ path: String) -> String {
        if let known = cached.withLock({ $0[path] }) { return known }
        let text = enforcement(path)
        cached.withLock { $0[path] = text }
        return text
    }
}

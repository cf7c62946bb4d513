import BGTaskControl
import BGTaskLaunch
import BGTaskModel
import BGTaskSystem
import Foundation
import Glibc
import _BGTaskSystemShims

/// What the transfers the host carries may cost it, per app and all apps together
/// (docs/transfers.md, "What transfers may cost the host"). The host acts for the app outside
/// its confined process here: every connection, descriptor, staged byte and buffer is the
/// app's, and bounded, so that one app's thousand downloads cannot take the descriptors,
/// the disk or the memory the host's own work (launches, logs, the control socket, commits)
/// needs.
package struct TransferBounds: Sendable {
    /// Attempts running at once for one app (6, as browsers open per host): each holds a
    /// connection, its spool file and an upload's body, and up to `perAttemptBufferBytes` of
    /// memory. The app's other transfers wait, queued (`queuedHold`), not refused.
    package var runningPerApp = 6
    /// Transfers of one app kept and not yet delivered (queued, running, finished): past it a
    /// create is refused with `tooManyQueued`.
    package var queuedPerApp = TransferLimits.activePerApp
    /// Bytes one app's transfers may hold in the host's staging (spool files: partial
    /// downloads, copied upload bodies): a download that would pass it fails (`stagingCap`).
    package var stagingBytesPerApp: UInt64 = TransferBounds.defaultStagingBytesPerApp
    /// Free space kept on the staging filesystem: the host's `--disk-reserve`. A write of a
    /// download's or an upload body's staging that would leave less fails that transfer
    /// (`diskReserve`), never the host. 0: none.
    package var diskReserveBytes: UInt64 = LaunchLimits.defaultDiskReserveBytes
    /// Transfers (all apps together) use at most 1/`descriptorShareDivisor` of the host's
    /// RLIMIT_NOFILE: 1/4, 256 of the 1,024 the shipped systemd unit gives (85 attempts).
    package var descriptorShareDivisor = 4

    package init(runningPerApp: Int = 6, queuedPerApp: Int = TransferLimits.activePerApp,
                 stagingBytesPerApp: UInt64 = TransferBounds.defaultStagingBytesPerApp,
                 diskReserveBytes: UInt64 = LaunchLimits.defaultDiskReserveBytes, descriptorShareDivisor: Int = 4) {
        self.runningPerApp = runningPerApp
        self.queuedPerApp = queuedPerApp
        self.stagingBytesPerApp = stagingBytesPerApp
        self.diskReserveBytes = diskReserveBytes
        self.descriptorShareDivisor = descriptorShareDivisor
    }

    package static let defaultStagingBytesPerApp: UInt64 = 1 << 30
    /// Descriptors one attempt holds at most: its connection, its spool file, an upload
    /// body's read.
    package static let descriptorsPerAttempt = 3
    /// Memory an attempt holds at most: the spool's write buffer
    /// (`TransferDelegate.maximumBuffered`, and one body part over it), or a data task's body.
    package static var perAttemptBufferBytes: Int { TransferDelegate.maximumBuffered + 64 * 1024 + TransferLimits.inlineBodyBytes }

    /// Names a refusal carries first, so that an app, `bgtask why` and a test can tell them apart.
    package static let stagingCapName = "over the app's staging cap"
    package static let diskReserveName = "under the host's disk reserve"
    package static let tooManyQueuedName = "too many transfers"

    /// The host's open descriptors now (counted in /proc/self/fd; without a descriptor to
    /// spare, by asking each number).
    package static func openDescriptors(limit: Int) -> Int {
        Int(bgtask_open_descriptors(0, Int32(clamping: limit), nil, 0))
    }

    /// Attempts all apps together may run: their descriptors within the share.
    package func runningLimit(descriptorLimit: Int) -> Int {
        max(1, descriptorLimit / descriptorShareDivisor / Self.descriptorsPerAttempt)
    }

    /// Why an attempt may not start for descriptors now, or nil. `running`: attempts of all
    /// apps. Measured twice, when an attempt is about to start: the attempts' own count
    /// against the share (3 descriptors each), and the host's open descriptors
    /// (/proc/self/fd: pooled idle connections, launches, logs, everything) against 3/4 of
    /// RLIMIT_NOFILE — past it no transfer starts, so the last quarter stays the host's.
    package func descriptorHold(running: Int) -> String? {
        let limit = Descriptors.limit()
        let most = runningLimit(descriptorLimit: limit)
        if running >= most {
            return "queued: transfers of all apps run \(running) attempts, the most the host's descriptors allow (1/\(descriptorShareDivisor) of RLIMIT_NOFILE \(limit), \(Self.descriptorsPerAttempt) each)"
        }
        let ceiling = limit - limit / descriptorShareDivisor
        let open = Self.openDescriptors(limit: limit)
        if open + Self.descriptorsPerAttempt > ceiling {
            return "queued: the host has \(open) descriptors open of RLIMIT_NOFILE \(limit); transfers wait while it is over \(ceiling), the reserve kept for launches, logs, the control socket and commits"
        }
        return nil
    }

    package func queuedHold(app: String, running: Int) -> String? {
        guard running >= runningPerApp else { return nil }
        return "queued: \(app) has \(running) transfers running, the most the host runs at once for one app (the rest wait their turn)"
    }
}

/// Why a transfer's staging may not grow: the app's staging cap or the host's disk reserve.
package struct StagingRefusal: Error, CustomStringConvertible {
    package var description: String

    package static func cap(app: String, wanted: UInt64, held: UInt64, cap: UInt64) -> StagingRefusal {
        StagingRefusal(description: "\(TransferBounds.stagingCapName): \(app)'s transfers would hold \(size(held + wanted)) in the host's staging, over its cap of \(size(cap))")
    }

    package static func reserve(path: String, free: UInt64, wanted: UInt64, reserve: UInt64) -> StagingRefusal {
        StagingRefusal(description: "\(TransferBounds.diskReserveName): writing \(size(wanted)) more to \(path) would leave its filesystem under the reserve of \(size(reserve)) (--disk-reserve; \(size(free)) free)")
    }

    /// MiB, or bytes under one (a write of a few KiB is not "0.0 MiB").
    package static func size(_ bytes: UInt64) -> String { bytes < 1 << 20 ? "\(bytes) bytes" : RunRecord.mib(bytes) }

    package var transferError: TransferError { TransferError(code: TransferError.cannotWriteToFileCode, message: description) }

    /// The memberwise initializer, for the modules above this one.
    package init(description: String) {
        self.description = description
    }
}

/// What each app's transfers hold in the host's staging (its spool files), charged before a
/// byte is written there; the seam per-app disk quotas account staging through
/// (`BackgroundTransfers.stagingUsage(app:)`). Thread-safe: the engine's writes (thread pool),
/// the part's queue and the copy queue charge it.
package final class StagingLedger: @unchecked Sendable {
    private let lock = NSLock()
    private var held: [String: (app: String, bytes: UInt64)] = [:]
    private var byApp: [String: (bytes: UInt64, files: Int)] = [:]
    package let bounds: TransferBounds
    /// A directory on the staging filesystem (the spool directory), for statvfs.
    package let directory: String

    package init(bounds: TransferBounds, directory: String) {
        self.bounds = bounds
        self.directory = directory
    }

    /// Lets transfer `id` of `app` hold `bytes` in staging (no change when it holds as many
    /// already): nil, or why not (the app's cap).
    package func grow(_ id: String, app: String, to bytes: UInt64) -> StagingRefusal? {
        lock.lock()
        defer { lock.unlock() }
        let before = held[id]?.bytes ?? 0
        guard bytes > before else { return nil }
        let growth = bytes - before
        let appHeld = byApp[app]?.bytes ?? 0
        if appHeld + growth > bounds.stagingBytesPerApp {
            return .cap(app: app, wanted: growth, held: appHeld, cap: bounds.stagingBytesPerApp)
        }
        setLocked(id, app: app, bytes)
        return nil
    }

    /// Whether `bytes` more may be written to the staging filesystem: nil, or why not (the
    /// host's disk reserve). Asked (statvfs) before every write: the reserve is the host's,
    /// whoever else fills the disk meanwhile.
    package func checkDisk(adding bytes: UInt64) -> StagingRefusal? {
        guard bounds.diskReserveBytes > 0, bytes > 0 else { return nil }
        let free = DiskReserveWatch.availableBytes(directory)
        guard free < bounds.diskReserveBytes || free - bounds.diskReserveBytes < bytes else { return nil }
        return .reserve(path: directory, free: free, wanted: bytes, reserve: bounds.diskReserveBytes)
    }

    /// Sets what `id` holds (a spool found at start, a download started over: 0).
    package func set(_ id: String, app: String, _ bytes: UInt64) {
        lock.lock()
        defer { lock.unlock() }
        setLocked(id, app: app, bytes)
    }

    private func setLocked(_ id: String, app: String, _ bytes: UInt64) {
        let before = held[id]
        held[id] = (app, bytes)
        var total = byApp[app] ?? (0, 0)
        total.bytes = total.bytes - (before?.bytes ?? 0) + bytes
        if before == nil { total.files += 1 }
        byApp[app] = total
    }

    /// `id`'s spool is gone (finished, delivered: moved into the container, which is the app's).
    package func release(_ id: String) {
        lock.lock()
        defer { lock.unlock() }
        guard let before = held.removeValue(forKey: id) else { return }
        var total = byApp[before.app] ?? (0, 0)
        total.bytes -= min(total.bytes, before.bytes)
        total.files -= 1
        byApp[before.app] = total.files <= 0 ? nil : total
    }

    package func usage(app: String) -> (bytes: UInt64, inodes: Int) {
        lock.lock()
        defer { lock.unlock() }
        let total = byApp[app] ?? (0, 0)
        return (total.bytes, total.files)
    }
}

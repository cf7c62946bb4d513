import BGTaskControl
import BGTaskSystem
import Foundation
import Glibc
import _BGTaskSystemShims

/// The host's own reserve of disk in its state directory, so that a full disk (an app that
/// filled it, or anything else) never loses a run record or an acknowledged request:
///
/// - **Ballast** (`STATE/reserve/ballast`, `--store-reserve`, 8 MiB by default): a file whose
///   blocks are allocated (`posix_fallocate`). When SQLite says the disk is full
///   (SQLITE_FULL, ENOSPC or EDQUOT) in a write of the host's own bookkeeping (a launch's
///   record, its begin, a cancellation, the recovery of a crashed launch), the store truncates
///   the ballast to nothing and runs the write again, into the space it gave back
///   (`PendingRequestStore.write`). New submissions are refused ("disk full: ...") while the
///   ballast is released: never acknowledged and then lost, and never spending the space the
///   records need. The ballast is allocated again once the filesystem has room for it twice
///   over (`restoreIfRoom`, looked at before each submission, at most every 100 ms).
/// - **Log ballast** (`STATE/reserve/log-ballast`, as large): the same, for launch logs, given
///   out in grants of `logGrant` (256 KiB), at most one per launch: a log write that finds the
///   disk full shrinks the ballast by a grant and allocates that much to the log at once
///   (`grantLogSpace`), then writes again. Another app's launch keeps its log after one app
///   filled the disk, and the filler's own log cannot take more than its grant. Apart from
///   the store's, so that logs can never spend what records need.
/// - **Spare inodes** (`STATE/reserve/spare-NN`, 64 empty files): a launch log made when the
///   filesystem has no inode left takes one (renamed to the log's name, never replacing
///   anything: no new inode is needed, where a hard link costs one on tmpfs; `LaunchLog`). The database needs none: its file,
///   its -wal and its -shm exist while the host runs, and temporary tables stay in memory.
///
/// Its file keeps its inode when released (truncated, not removed), so restoring it never
/// needs one either. Thread-safe.
public final class StoreReserve: @unchecked Sendable {
    public let directory: String
    public let ballastPath: String
    public let logBallastPath: String
    public let bytes: UInt64
    public static let defaultBytes: UInt64 = 8 << 20
    public static let spareInodes = 64
    package static let restoreLookInterval: UInt64 = 100_000_000

    private struct State {
        var held = false
        var releasedBecause: String?
        var lastLookNs: UInt64 = 0
        var releases = 0
    }

    private let state = LockedValue(State())

    /// Nothing is made on disk until `prepare`.
    public init(stateDirectory: URL, bytes: UInt64 = StoreReserve.defaultBytes) {
        directory = stateDirectory.appendingPathComponent("reserve", isDirectory: true).path
        ballastPath = directory + "/ballast"
        logBallastPath = directory + "/log-ballast"
        self.bytes = bytes
    }

    /// Makes the reserve directory (0700), allocates the ballast and makes the spare inodes.
    /// Returns a warning when the reserve could not be made whole (the host runs on, with
    /// what it has, and says so).
    public func prepare() -> String? {
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            return "cannot make the host's disk reserve \(directory): \(String(cString: strerror(errno))); a full disk may then lose run records"
        }
        let spares = replenishSpareInodes()
        let ballast = allocate()
        let logBallast = allocateLogBallast()
        return [ballast, logBallast, spares].compactMap { $0 }.first
    }

    /// True while the ballast's blocks are given back (the disk was full).
    public var isReleased: Bool { state.withLock { !$0.held && $0.releasedBecause != nil } }

    /// How many times the ballast was released (tests, the log).
    public var releases: Int { state.withLock { $0.releases } }

    /// Gives the ballast's blocks back (the disk is full and a record must be written). False
    /// when there was nothing to give (already released, or never allocated).
    package func release(because reason: String) -> Bool {
        state.withLock { current -> Bool in
            guard current.held else { return false }
            let fd = open(ballastPath, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { return false }
            defer { close(fd) }
            guard ftruncate(fd, 0) == 0 else { return false }
            current.held = false
            current.releasedBecause = reason
            current.releases += 1
            return true
        }
    }

    /// When released and the filesystem has room for the ballast twice over: allocates it
    /// again. Looks at most every 100 ms. Returns whether the ballast is held (or there is no
    /// ballast to hold), that is, whether new submissions may be taken.
    package func restoreIfRoom() -> Bool {
        let now = bgtask_monotonic_ns()
        let due = state.withLock { current -> Bool in
            guard current.releasedBecause != nil, !current.held else { return false }
            guard now >= current.lastLookNs + Self.restoreLookInterval else { return false }
            current.lastLookNs = now
            return true
        }
        if due {
            var info = statvfs()
            if statvfs(directory, &info) == 0, UInt64(info.f_bavail) * UInt64(info.f_frsize) >= bytes * 3, allocate() == nil {
                _ = allocateLogBallast()
                _ = replenishSpareInodes()
            }
        }
        return !isReleased
    }

    /// Why new submissions are refused while the ballast is released.
    package func fullMessage(operation: String) -> String {
        let why = state.withLock { $0.releasedBecause } ?? "the filesystem has no space left"
        return "disk full: cannot \(operation): the state directory's filesystem is full (\(why)); the host's reserve (\(RunRecord.mib(bytes)), \(ballastPath)) is kept for run records and acknowledged requests until space returns"
    }

    /// Allocates the ballast's blocks (the file kept: its inode is not needed again). nil, or
    /// why it could not.
    private func allocate() -> String? {
        guard bytes > 0 else { return nil }
        let fd = open(ballastPath, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            return "cannot make the host's disk reserve \(ballastPath): \(String(cString: strerror(errno))); a full disk may then lose run records"
        }
        defer { close(fd) }
        let result = posix_fallocate(fd, 0, off_t(bytes))
        guard result == 0 else {
            ftruncate(fd, 0)
            state.withLock { $0.held = false; if $0.releasedBecause == nil { $0.releasedBecause = "the reserve could not be allocated: \(String(cString: strerror(result)))" } }
            return "cannot allocate the host's disk reserve of \(RunRecord.mib(bytes)) at \(ballastPath): \(String(cString: strerror(result))); submissions are refused until it can be"
        }
        fsync(fd)
        state.withLock {
            $0.held = true
            $0.releasedBecause = nil
        }
        return nil
    }

    /// Allocates the log ballast (see the type's comment). nil, or why it could not.
    private func allocateLogBallast() -> String? {
        guard bytes > 0 else { return nil }
        let fd = open(logBallastPath, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "cannot make the host's disk reserve for logs \(logBallastPath): \(String(cString: strerror(errno)))" }
        defer { close(fd) }
        let result = posix_fallocate(fd, 0, off_t(bytes))
        guard result == 0 else {
            ftruncate(fd, 0)
            return "cannot allocate the host's disk reserve for logs at \(logBallastPath): \(String(cString: strerror(result)))"
        }
        return nil
    }

    /// What one launch's log may take from the log ballast.
    package static let logGrant: Int = 256 * 1024

    /// A launch's log found the disk full: moves `logGrant` bytes from the log ballast beside
    /// its directory (`STATE/logs` → `STATE/reserve/log-ballast`) to the log (`log`, allocated
    /// from `offset` on without changing its size). True when the log has them. Restored with
    /// the store's ballast (`restoreIfRoom`).
    package static func grantLogSpace(reserve: String, to log: Int32, at offset: Int64) -> Bool {
        let fd = open(reserve + "/log-ballast", O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_size >= logGrant, ftruncate(fd, info.st_size - off_t(logGrant)) == 0 else { return false }
        return bgtask_allocate_keeping_size(log, offset, Int64(logGrant)) == 0
    }

    /// The host needs a new inode of its own (its control socket) and the filesystem has none
    /// free: one spare is removed, which frees one.
    public func freeInodeIfNoneLeft() {
        var info = statvfs()
        guard statvfs(directory, &info) == 0, info.f_files > 0, info.f_ffree == 0 else { return }
        for index in (0..<Self.spareInodes).reversed() where unlink(directory + "/" + Self.spareName(index)) == 0 { return }
    }

    /// Makes the missing spare inodes (empty files), only while the filesystem has four times
    /// as many free: never taking the last ones (the host's control socket, an app's files).
    /// nil, or why not all could be made.
    private func replenishSpareInodes() -> String? {
        var info = statvfs()
        if statvfs(directory, &info) == 0, info.f_files > 0, UInt64(info.f_ffree) < UInt64(4 * Self.spareInodes) {
            return "the filesystem of \(directory) has \(info.f_ffree) free inodes: the host's spare inodes for logs are made once it has \(4 * Self.spareInodes)"
        }
        var failure: String?
        for index in 0..<Self.spareInodes {
            let path = directory + "/" + Self.spareName(index)
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if fd >= 0 {
                close(fd)
            } else if errno != EEXIST, failure == nil {
                failure = "cannot make the host's spare inodes in \(directory): \(String(cString: strerror(errno)))"
            }
        }
        return failure
    }

    package static func spareName(_ index: Int) -> String { index < 10 ? "spare-0\(index)" : "spare-\(index)" }

    /// Gives a spare inode the name `name` in the directory `directoryFD` (a launch's log, made
    /// when the filesystem has no inode left): renamed to it, never replacing what is there.
    /// The reserve is `reserve` beside the directory (`STATE/logs` → `STATE/reserve`). Returns
    /// an open descriptor (write-only) of the file, or -1 when no spare is left.
    package static func takeSpareInode(reserve: String, into directoryFD: Int32, name: String) -> Int32 {
        let reserveFD = open(reserve, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard reserveFD >= 0 else { return -1 }
        defer { close(reserveFD) }
        for index in (0..<spareInodes).reversed() {
            let spare = spareName(index)
            guard bgtask_rename_noreplace(reserveFD, spare, directoryFD, name) == 0 else {
                if errno == EEXIST { return -1 }
                continue
            }
            let fd = openat(directoryFD, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
            if fd >= 0 { return fd }
        }
        return -1
    }
}

import BGTaskControl
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The database's write-ahead log (`bgtask.sqlite-wal`), synced on its own.
///
/// `synchronous = FULL` syncs the log inside the commit, before the commit is visible to other
/// connections. A submission needs the sync only before its acknowledgement, not before the
/// scheduling pass may see it: submissions are committed with `synchronous = NORMAL` (visible at
/// once, durable against the host's crash), the pass is started, and then this syncs the log,
/// which is what FULL would have done at the commit. Every frame written before the call is on
/// disk when it returns; frames already checkpointed into the database were synced by the
/// checkpoint (SQLite syncs the log before a checkpoint and the database after it).
///
/// SQLite takes no locks on the log itself (its locks are on the database and the `-shm`
/// file), so a descriptor of our own cannot disturb them.
package final class WriteAheadLog: @unchecked Sendable {
    package let path: String
    private let descriptor = LockedValue<Int32>(-1)
    /// Tests replace the sync (a failing or a slow disk); nil: `fdatasync`.
    package var syncOverride: (@Sendable () throws(BGTaskError) -> Void)?

    package init(databasePath: String) { path = databasePath + "-wal" }

    deinit {
        let fd = descriptor.withLock { $0 }
        if fd >= 0 { close(fd) }
    }

    /// Syncs what the log holds to disk.
    package func sync() throws(BGTaskError) {
        if let syncOverride { return try syncOverride() }
        let fd = try openedDescriptor()
        if fdatasync(fd) != 0 {
            throw BGTaskError(.system, file: path, "cannot sync the database's write-ahead log: \(String(cString: strerror(errno)))")
        }
    }

    /// The log's descriptor, opened once and again if SQLite removed the file (it does when
    /// its last connection closes; the pool keeps its writer open, so only in theory).
    private func openedDescriptor() throws(BGTaskError) -> Int32 {
        let result = descriptor.withLock { fd -> Result<Int32, BGTaskError> in
            if fd >= 0 {
                var status = stat()
                if fstat(fd, &status) == 0 && status.st_nlink > 0 { return .success(fd) }
                close(fd)
                fd = -1
            }
            let opened = open(path, O_RDONLY | O_CLOEXEC)
            guard opened >= 0 else {
                return .failure(BGTaskError(.system, file: path, "cannot open the database's write-ahead log to sync it: \(String(cString: strerror(errno)))"))
            }
            fd = opened
            return .success(opened)
        }
        return try result.get()
    }
}

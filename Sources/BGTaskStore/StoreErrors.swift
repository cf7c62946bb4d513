import BGTaskControl
import Foundation
import GRDB

/// Turns what GRDB, SQLite and the JSON coders throw into `BGTaskError`s that name the database
/// file, the operation, and what a person can do about it.
/// A row whose contents bgtask never writes (an unknown task kind, say).
package struct StoreCorruption: Error, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}

package enum StoreErrors {
    package static func wrap(_ error: any Error, file: String, operation: String) -> BGTaskError {
        if let error = error as? BGTaskError { return error }
        if let error = error as? DatabaseError {
            // Named first: a client told "disk full" knows the request was not kept and why.
            let full = isDiskFull(error) ? "disk full: " : ""
            return BGTaskError(.system, file: file, "\(full)cannot \(operation): \(explain(error))")
        }
        if error is DecodingError || error is RowDecodingError || error is StoreCorruption {
            return BGTaskError(.system, file: file, "cannot \(operation): the database holds a value that cannot be decoded (\(error)); the file was changed by something other than bgtask, move it aside to start empty")
        }
        return BGTaskError(.system, file: file, "cannot \(operation): \(error)")
    }

    /// SQLite could not write for want of space: SQLITE_FULL (ENOSPC), or a write or a shared
    /// memory resize that failed (SQLite reports EDQUOT so). What the host's reserve is for
    /// (`PendingRequestStore.withReserve`).
    package static func isDiskFull(_ error: any Error) -> Bool {
        guard let error = error as? DatabaseError else { return false }
        if error.resultCode == .SQLITE_FULL { return true }
        return error.extendedResultCode == .SQLITE_IOERR_WRITE || error.extendedResultCode == .SQLITE_IOERR_SHMSIZE
    }

    /// A sentence for a SQLite error: what it means here, then SQLite's own words.
    package static func explain(_ error: DatabaseError) -> String {
        let sqlite = error.message.map { "SQLite: \($0)" } ?? "SQLite result code \(error.extendedResultCode.rawValue)"
        switch error.resultCode {
        case .SQLITE_NOTADB:
            return "the file is not an SQLite database (\(sqlite)); move it aside to start empty"
        case .SQLITE_CORRUPT:
            return "the database is corrupt (\(sqlite)); move it aside to start empty"
        case .SQLITE_READONLY:
            return "the database cannot be written (\(sqlite)); make the file, its -wal and -shm files and its directory writable by this user"
        case .SQLITE_CANTOPEN:
            return "the database cannot be opened (\(sqlite)); check that its directory exists and is writable by this user"
        case .SQLITE_PERM, .SQLITE_AUTH:
            return "access to the database was denied (\(sqlite))"
        case .SQLITE_FULL:
            return "the disk is full (\(sqlite))"
        case .SQLITE_IOERR:
            return "an I/O error occurred (\(sqlite))"
        case .SQLITE_BUSY, .SQLITE_LOCKED:
            return "the database stayed locked by another connection or process longer than the busy timeout (\(sqlite))"
        case .SQLITE_CONSTRAINT:
            return "a constraint of the database was violated (\(sqlite))"
        default:
            return sqlite
        }
    }
}

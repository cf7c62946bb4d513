import BGTaskControl
import BGTaskModel
import Foundation
import GRDB


extension PendingRequestStore {
    /// Delivered transfers kept per app as records; older ones are deleted when one is created.
    package static let transferHistoryPerApp = 200

    /// Keeps a new transfer (durably: `synchronous = FULL`), unless the app already has
    /// `activeLimit` transfers not yet delivered: then false and nothing is written.
    public func createTransfer(_ transfer: StoredTransfer, activeLimit: Int) throws(BGTaskError) -> Bool {
        transferWrites.withLock { $0 += 1 }
        return try write("keep transfer \(transfer.id) of \(transfer.app)") { db in
            let active = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM transfer WHERE app = ? AND state != 'delivered'",
                                          arguments: [transfer.app]) ?? 0
            guard active < activeLimit else { return false }
            try db.execute(sql: """
                INSERT INTO transfer (id, app, bundle, session, task_identifier, kind, request, state, held_by, bytes_received,
                    bytes_expected, bytes_sent, bytes_expected_to_send, validator, spool, response, body, error, file, not_before,
                    created_at, finished_at, attempts, resumed, launched_for, delivered_in_launch, delivered_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, arguments: StatementArguments([transfer.id, transfer.app, transfer.bundle, transfer.info.session, transfer.info.taskIdentifier,
                                   transfer.info.kind.rawValue, try Self.json(transfer.request)] + Self.mutableColumns(transfer)
                                   + [transfer.info.createdAt, transfer.info.finishedAt, transfer.info.attempts, transfer.info.resumed,
                                      transfer.launchedFor, transfer.deliveredInLaunch, transfer.deliveredAt]))
            try db.execute(sql: """
                DELETE FROM transfer WHERE app = ? AND state = 'delivered' AND id NOT IN
                    (SELECT id FROM transfer WHERE app = ? AND state = 'delivered' ORDER BY created_at DESC LIMIT ?)
                """, arguments: [transfer.app, transfer.app, Self.transferHistoryPerApp])
            return true
        }
    }

    /// Writes everything that changes about a transfer (durably).
    public func saveTransfer(_ transfer: StoredTransfer) throws(BGTaskError) {
        transferWrites.withLock { $0 += 1 }
        try write("save transfer \(transfer.id)") { db in
            try db.execute(sql: """
                UPDATE transfer SET state = ?, held_by = ?, bytes_received = ?, bytes_expected = ?, bytes_sent = ?,
                    bytes_expected_to_send = ?, validator = ?, spool = ?, response = ?, body = ?, error = ?, file = ?, not_before = ?,
                    finished_at = ?, attempts = ?, resumed = ?, launched_for = ?, delivered_in_launch = ?, delivered_at = ?
                WHERE id = ?
                """, arguments: StatementArguments(try Self.mutableColumns(transfer) + [
                    transfer.info.finishedAt, transfer.info.attempts, transfer.info.resumed, transfer.launchedFor,
                    transfer.deliveredInLaunch, transfer.deliveredAt, transfer.id]))
        }
    }

    /// Bytes moved so far: written lazily (a lost write costs nothing, the spool file's length
    /// is the truth on resume).
    public func saveTransferProgress(id: String, received: Int64, expected: Int64, sent: Int64) throws(BGTaskError) {
        transferWrites.withLock { $0 += 1 }
        try write("save the progress of transfer \(id)") { db in
            try db.execute(sql: "UPDATE transfer SET bytes_received = ?, bytes_expected = ?, bytes_sent = ? WHERE id = ? AND state = 'running'",
                           arguments: [received, expected, sent, id])
        }
    }

    /// Marks finished transfers as announced by the `background-transfer` launch `launchID`.
    public func markTransfersLaunched(_ ids: [String], launchID: String) throws(BGTaskError) {
        transferWrites.withLock { $0 += 1 }
        try write("note the launch for transfers") { db in
            for id in ids {
                try db.execute(sql: "UPDATE transfer SET launched_for = ? WHERE id = ?", arguments: [launchID, id])
            }
        }
    }

    public func transfer(id: String) throws(BGTaskError) -> StoredTransfer? {
        try read("read transfer \(id)") { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM transfer WHERE id = ?"), arguments: [id]).map(Self.transfer)
        }
    }

    /// The transfers of `app` (or every app), newest first, at most `limit`.
    public func transfers(app: String?, limit: Int) throws(BGTaskError) -> [StoredTransfer] {
        try read("read the transfers") { db in
            if let app {
                return try Row.fetchAll(db, sql: "SELECT * FROM transfer WHERE app = ? ORDER BY created_at DESC, id LIMIT ?",
                                        arguments: [app, limit]).map(Self.transfer)
            }
            return try Row.fetchAll(db, sql: "SELECT * FROM transfer ORDER BY created_at DESC, id LIMIT ?", arguments: [limit]).map(Self.transfer)
        }
    }

    /// Transfers that move or will move bytes (waiting, running), oldest first.
    public func unfinishedTransfers() throws(BGTaskError) -> [StoredTransfer] {
        try read("read the unfinished transfers") { db in
            try Row.fetchAll(db, sql: "SELECT * FROM transfer WHERE state IN ('waiting', 'running') ORDER BY created_at, id").map(Self.transfer)
        }
    }

    /// Transfers not yet delivered to the app (any state but `delivered`), oldest first; of one
    /// app's session, or of every app.
    public func undeliveredTransfers(app: String? = nil, session: String? = nil) throws(BGTaskError) -> [StoredTransfer] {
        try read("read the undelivered transfers") { db in
            var sql = "SELECT * FROM transfer WHERE state != 'delivered'"
            var arguments: [(any DatabaseValueConvertible)?] = []
            if let app { sql += " AND app = ?"; arguments.append(app) }
            if let session { sql += " AND session = ?"; arguments.append(session) }
            return try Row.fetchAll(db, sql: sql + " ORDER BY created_at, id", arguments: StatementArguments(arguments)).map(Self.transfer)
        }
    }

    private static func mutableColumns(_ transfer: StoredTransfer) throws -> [(any DatabaseValueConvertible)?] {
        let info = transfer.info
        return [info.state.rawValue, info.heldBy, info.bytesReceived, info.bytesExpectedToReceive, info.bytesSent,
                info.bytesExpectedToSend, transfer.validator, transfer.spool, try info.response.map(json), info.body,
                try info.error.map(json), info.file, transfer.notBefore]
    }

    package static func transfer(_ row: Row) throws -> StoredTransfer {
        let request = try JSONDecoder().decode(TransferRequest.self, from: Data((row["request"] as String).utf8))
        var info = TransferInfo(id: row["id"], app: row["app"], request: request,
                                state: TransferState(rawValue: row["state"]) ?? .failed, createdAt: row["created_at"])
        info.heldBy = row["held_by"]
        info.bytesReceived = row["bytes_received"]
        info.bytesExpectedToReceive = row["bytes_expected"]
        info.bytesSent = row["bytes_sent"]
        info.bytesExpectedToSend = row["bytes_expected_to_send"]
        if let response = row["response"] as String? {
            info.response = try JSONDecoder().decode(TransferResponse.self, from: Data(response.utf8))
        }
        info.body = row["body"]
        if let error = row["error"] as String? {
            info.error = try JSONDecoder().decode(TransferError.self, from: Data(error.utf8))
        }
        info.file = row["file"]
        info.finishedAt = row["finished_at"]
        info.attempts = row["attempts"]
        info.resumed = row["resumed"]
        return StoredTransfer(
            info: info, request: request, bundle: row["bundle"], validator: row["validator"], spool: row["spool"],
            notBefore: row["not_before"], launchedFor: row["launched_for"], deliveredInLaunch: row["delivered_in_launch"],
            deliveredAt: row["delivered_at"])
    }
}

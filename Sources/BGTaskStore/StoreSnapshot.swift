import BGTaskControl
import BGTaskModel
import Foundation
import GRDB

/// What the scheduler reads from the store: due apps, their state and requests. A protocol, so
/// the scheduler can be given the real store (`PendingRequestStore`) or a table in a test.
package protocol SchedulingSource {
    func dueApps(at now: Date) throws(BGTaskError) -> [String]
    func appState(_ app: String) throws(BGTaskError) -> AppState
    func pending(app: String?) throws(BGTaskError) -> [StoredRequest]
    func nextDueDate(after now: Date) throws(BGTaskError) -> Date?
}

extension PendingRequestStore: SchedulingSource {}

/// The store's scheduling reads inside one read transaction: a scheduling pass sees one
/// snapshot and pays for one transaction, not one per read (`PendingRequestStore.withSnapshot`).
package struct StoreSnapshot: SchedulingSource {
    package let db: Database
    package let file: String
    /// Reads apps' energy excess and uses (the realistic policy's judgement).
    package var judged = true

    private func reading<T>(_ operation: String, _ body: () throws -> T) throws(BGTaskError) -> T {
        do { return try body() } catch { throw StoreErrors.wrap(error, file: file, operation: operation) }
    }

    package func dueApps(at now: Date) throws(BGTaskError) -> [String] {
        try reading("find the apps with requests due") {
            try String.fetchAll(db.cachedStatement(sql: PendingRequestStore.dueAppsSQL), arguments: [now.timeIntervalSince1970]).sorted()
        }
    }

    package func appState(_ app: String) throws(BGTaskError) -> AppState {
        try reading("read the state of \(app)") { try PendingRequestStore.appState(db, app, judged: judged) }
    }

    package func pending(app: String?) throws(BGTaskError) -> [StoredRequest] {
        try reading("list the pending requests") {
            if let app { return try PendingRequestStore.fetchRequests(db, where: "app = ? AND running_launch IS NULL", [app]) }
            return try PendingRequestStore.fetchRequests(db, where: "running_launch IS NULL", [])
        }
    }

    package func nextDueDate(after now: Date) throws(BGTaskError) -> Date? {
        try reading("find the next due date") {
            try Double.fetchOne(db.cachedStatement(sql: PendingRequestStore.nextDueDateSQL), arguments: [now.timeIntervalSince1970])
                .map(Date.init(timeIntervalSince1970:))
        }
    }
}

extension PendingRequestStore {
    /// Runs `body` with the store's scheduling reads on one snapshot (one read transaction).
    package func withSnapshot<T>(judged: Bool = true, _ body: (StoreSnapshot) throws(BGTaskError) -> T) throws(BGTaskError) -> T {
        let file = databaseURL.path
        var outcome: Result<T, BGTaskError>?
        do {
            try passReader.inDatabase { db in
                try db.inCachedTransaction("DEFERRED") {
                    do throws(BGTaskError) { outcome = .success(try body(StoreSnapshot(db: db, file: file, judged: judged))) } catch { outcome = .failure(error) }
                }
            }
        } catch {
            throw StoreErrors.wrap(error, file: file, operation: "read a snapshot for the scheduling pass")
        }
        return try outcome!.get()
    }
}

import BGTaskControl
import BGTaskModel
import Foundation
import GRDB



extension PendingRequestStore {
    // MARK: Authorization

    public func notificationAppState(_ app: String) throws(BGTaskError) -> NotificationAppState {
        try read("read the notification settings of \(app)") { db in
            guard let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM notification_app WHERE app = ?"), arguments: [app]) else {
                return NotificationAppState(app: app)
            }
            return try Self.notificationAppState(row)
        }
    }

    public func notificationAppStates() throws(BGTaskError) -> [String: NotificationAppState] {
        try read("read the notification settings") { db in
            var states: [String: NotificationAppState] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT * FROM notification_app") {
                let state = try Self.notificationAppState(row)
                states[state.app] = state
            }
            return states
        }
    }

    package static func notificationAppState(_ row: Row) throws -> NotificationAppState {
        var state = NotificationAppState(app: try row.decode(String.self, forColumn: "app"))
        state.allowed = try row.decode(Bool?.self, forColumn: "allowed")
        state.askedAt = try row.decode(Double?.self, forColumn: "asked_at").map(Date.init(timeIntervalSince1970:))
        state.askedOptions = UInt32(truncatingIfNeeded: try row.decode(Int64.self, forColumn: "asked_options"))
        return state
    }

    /// Sets (or clears, nil) the operator's switch for `app`.
    public func setNotificationsAllowed(app: String, _ allowed: Bool?) throws(BGTaskError) {
        try write("set the notification switch of \(app)") { db in
            try db.execute(sql: """
                INSERT INTO notification_app (app, allowed) VALUES (?, ?)
                ON CONFLICT(app) DO UPDATE SET allowed = excluded.allowed
                """, arguments: [app, allowed])
        }
    }

    /// Records that `app` asked for authorization (the first time's date is kept; the options
    /// accumulate).
    public func recordNotificationRequest(app: String, options: UInt32, at date: Date) throws(BGTaskError) {
        try write("record the notification request of \(app)") { db in
            try db.execute(sql: """
                INSERT INTO notification_app (app, asked_at, asked_options) VALUES (?, ?, ?)
                ON CONFLICT(app) DO UPDATE SET asked_at = coalesce(asked_at, excluded.asked_at),
                    asked_options = asked_options | excluded.asked_options
                """, arguments: [app, date.timeIntervalSince1970, Int64(options)])
        }
    }

    // MARK: Requests

    /// Adds (or replaces, by identifier) a pending request due at `fireAt`, in one transaction;
    /// then, as iOS, keeps the app's `keep` requests that fire soonest and discards the rest.
    /// Returns the identifiers discarded (possibly the one just added).
    public func addNotification(app: String, request: NotificationRequest, addedAt: Date, fireAt: Date, launchID: String?,
                                keep: Int = NotificationLimits.pendingPerApp) throws(BGTaskError) -> [String] {
        let json = try encodeJSON(request)
        return try write("add the notification \(request.identifier) of \(app)") { db in
            try db.execute(sql: "DELETE FROM notification WHERE app = ? AND identifier = ? AND state = 'pending'", arguments: [app, request.identifier])
            try db.execute(sql: """
                INSERT INTO notification (app, identifier, state, request, added_at, fire_at, launch_id)
                VALUES (?, ?, 'pending', ?, ?, ?, ?)
                """, arguments: [app, request.identifier, json, addedAt.timeIntervalSince1970, fireAt.timeIntervalSince1970, launchID])
            let count = try Int.fetchOne(db, sql: "SELECT count(*) FROM notification WHERE app = ? AND state = 'pending'", arguments: [app]) ?? 0
            guard count > keep else { return [] }
            let extra = try Row.fetchAll(db, sql: """
                SELECT id, identifier FROM notification WHERE app = ? AND state = 'pending'
                ORDER BY fire_at DESC, id DESC LIMIT ?
                """, arguments: [app, count - keep])
            for row in extra {
                try db.execute(sql: "DELETE FROM notification WHERE id = ?", arguments: [row["id"] as Int64])
            }
            return extra.map { $0["identifier"] as String }
        }
    }

    /// Pending requests (of `app`, or all), soonest first.
    public func pendingNotifications(app: String?) throws(BGTaskError) -> [StoredNotification] {
        try read("read the pending notifications") { db in
            if let app {
                return try Self.notifications(db, "WHERE app = ? AND state = 'pending' ORDER BY fire_at, id", [app])
            }
            return try Self.notifications(db, "WHERE state = 'pending' ORDER BY fire_at, id", [])
        }
    }

    /// Delivered notifications (of `app`, or all) with an id above `after`, oldest first, at
    /// most `limit`; the newest `limit` when `after` is nil.
    public func deliveredNotifications(app: String?, after: Int64? = nil, limit: Int = NotificationLimits.deliveredPerApp) throws(BGTaskError) -> [StoredNotification] {
        try read("read the delivered notifications") { db in
            var conditions = ["state = 'delivered'"]
            var arguments: [DatabaseValueConvertible] = []
            if let app { conditions.append("app = ?"); arguments.append(app) }
            if let after { conditions.append("id > ?"); arguments.append(after) }
            let clause = "WHERE " + conditions.joined(separator: " AND ")
            if after != nil {
                return try Self.notifications(db, "\(clause) ORDER BY id LIMIT ?", arguments + [limit])
            }
            return try Self.notifications(db, "\(clause) ORDER BY id DESC LIMIT ?", arguments + [limit]).reversed()
        }
    }

    /// The delivered notification `id`, or nil.
    public func deliveredNotification(id: Int64) throws(BGTaskError) -> StoredNotification? {
        try read("read delivered notification \(id)") { db in
            try Self.notifications(db, "WHERE state = 'delivered' AND id = ?", [id]).first
        }
    }

    /// Removes pending or delivered notifications of `app` (with these identifiers, or all).
    @discardableResult
    public func removeNotifications(app: String, delivered: Bool, identifiers: [String]?) throws(BGTaskError) -> Int {
        try write("remove notifications of \(app)") { db in
            let state = delivered ? "delivered" : "pending"
            guard let identifiers else {
                try db.execute(sql: "DELETE FROM notification WHERE app = ? AND state = ?", arguments: [app, state])
                return db.changesCount
            }
            var removed = 0
            for chunk in Self.chunks(identifiers) {
                try db.execute(sql: "DELETE FROM notification WHERE app = ? AND state = ? AND identifier IN (\(Self.placeholders(chunk.count)))",
                               arguments: StatementArguments([app, state] + Array(chunk)))
                removed += db.changesCount
            }
            return removed
        }
    }

    /// Pending requests due at `now`, soonest first (at most `limit`).
    public func dueNotifications(at now: Date, limit: Int = 256) throws(BGTaskError) -> [StoredNotification] {
        try read("read the due notifications") { db in
            try Self.notifications(db, "WHERE state = 'pending' AND fire_at <= ? ORDER BY fire_at, id LIMIT ?", [now.timeIntervalSince1970, limit])
        }
    }

    /// The next date a pending request is due.
    public func nextNotificationDate() throws(BGTaskError) -> Date? {
        try read("read the next notification date") { db in
            try Double.fetchOne(db, sql: "SELECT min(fire_at) FROM notification WHERE state = 'pending'").map(Date.init(timeIntervalSince1970:))
        }
    }

    /// Delivers the pending notification `pending` at `now` in one transaction: a delivered row
    /// (replacing a delivered one with its identifier; its id is new, so followers see it), the
    /// pending row moved to `next` (a repeating trigger) or deleted, and the app's delivered
    /// notifications pruned to the newest `keep`. Returns the delivered notification, or nil
    /// when the request is no longer pending (removed meanwhile).
    public func deliverNotification(_ pending: StoredNotification, at now: Date, next: Date?,
                                    keep: Int = NotificationLimits.deliveredPerApp) throws(BGTaskError) -> StoredNotification? {
        try write("deliver the notification \(pending.request.identifier) of \(pending.app)") { db in
            let exists = try Bool.fetchOne(db, sql: "SELECT 1 FROM notification WHERE id = ? AND state = 'pending'", arguments: [pending.id]) ?? false
            guard exists else { return nil }
            if let next {
                try db.execute(sql: "UPDATE notification SET fire_at = ? WHERE id = ?", arguments: [next.timeIntervalSince1970, pending.id])
            } else {
                try db.execute(sql: "DELETE FROM notification WHERE id = ?", arguments: [pending.id])
            }
            try db.execute(sql: "DELETE FROM notification WHERE app = ? AND identifier = ? AND state = 'delivered'",
                           arguments: [pending.app, pending.request.identifier])
            try db.execute(sql: """
                INSERT INTO notification (app, identifier, state, request, added_at, fire_at, delivered_at, launch_id)
                VALUES (?, ?, 'delivered', ?, ?, ?, ?, ?)
                """, arguments: [pending.app, pending.request.identifier, try Self.json(pending.request), pending.addedAt.timeIntervalSince1970,
                                 pending.fireDate?.timeIntervalSince1970, now.timeIntervalSince1970, pending.launchID])
            let id = db.lastInsertedRowID
            try db.execute(sql: """
                DELETE FROM notification WHERE app = ? AND state = 'delivered' AND id NOT IN
                    (SELECT id FROM notification WHERE app = ? AND state = 'delivered' ORDER BY id DESC LIMIT ?)
                """, arguments: [pending.app, pending.app, keep])
            var delivered = pending
            delivered.id = id
            delivered.state = "delivered"
            delivered.deliveredAt = now
            return delivered
        }
    }

    private func encodeJSON(_ request: NotificationRequest) throws(BGTaskError) -> String {
        do { return try Self.json(request) } catch {
            throw BGTaskError(.invalidRequest, "the notification \(request.identifier) cannot be encoded: \(error)")
        }
    }

    package static func notifications(_ db: Database, _ clause: String, _ arguments: [DatabaseValueConvertible]) throws -> [StoredNotification] {
        try Row.fetchAll(db, sql: "SELECT * FROM notification \(clause)", arguments: StatementArguments(arguments)).map { row in
            let json: String = row["request"]
            return StoredNotification(
                id: row["id"], app: row["app"],
                request: try JSONDecoder().decode(NotificationRequest.self, from: Data(json.utf8)),
                state: row["state"],
                addedAt: Date(timeIntervalSince1970: row["added_at"]),
                fireDate: (row["fire_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
                deliveredAt: (row["delivered_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
                launchID: row["launch_id"])
        }
    }
}

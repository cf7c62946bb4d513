import BGTaskControl
import BGTaskModel
import Foundation
import GRDB


extension PendingRequestStore {
    /// Pushes kept per app once settled (delivered or dropped); older ones are deleted.
    package static let pushHistoryPerApp = 200

    /// The app's device token: made once (32 random bytes, as hex) and kept for good, so a
    /// provider's stored token keeps reaching the app across launches and host restarts.
    public func deviceToken(app: String) throws(BGTaskError) -> String {
        if let token = try read("read the device token of \(app)", { db in
            try String.fetchOne(db.cachedStatement(sql: "SELECT token FROM device_token WHERE app = ?"), arguments: [app])
        }) { return token }
        var generator = SystemRandomNumberGenerator()
        let made = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
        return try write("make the device token of \(app)") { db in
            // Another thread may have made one meanwhile: the first one stays.
            try db.execute(sql: "INSERT INTO device_token (app, token, created_at) VALUES (?, ?, ?) ON CONFLICT(app) DO NOTHING",
                           arguments: [app, made, Date().timeIntervalSince1970])
            return try String.fetchOne(db, sql: "SELECT token FROM device_token WHERE app = ?", arguments: [app]) ?? made
        }
    }

    /// The app a device token was made for, or nil.
    public func app(forDeviceToken token: String) throws(BGTaskError) -> String? {
        try read("look up a device token") { db in
            try String.fetchOne(db.cachedStatement(sql: "SELECT app FROM device_token WHERE token = ?"), arguments: [token.lowercased()])
        }
    }

    /// Keeps a push as pending. The app's pushes still pending are dropped as coalesced into it
    /// (iOS keeps the latest background push of an app): their ids.
    @discardableResult
    public func enqueuePush(_ push: StoredPush) throws(BGTaskError) -> [String] {
        try write("keep push \(push.id) for \(push.app)") { db in
            let coalesced = try String.fetchAll(db, sql: "SELECT id FROM push WHERE app = ? AND state = 'pending'", arguments: [push.app])
            try db.execute(
                sql: "UPDATE push SET state = 'dropped', detail = ?, settled_at = ? WHERE app = ? AND state = 'pending'",
                arguments: ["coalesced: a newer push for the app (\(push.id)) replaced it", push.receivedAt.timeIntervalSince1970, push.app])
            try db.execute(sql: """
                INSERT INTO push (id, app, payload, kind, priority, expiration, collapse_id, received_at, state, detail, launch_id, settled_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, arguments: [push.id, push.app, push.payload, push.kind.rawValue, push.priority, push.expiration?.timeIntervalSince1970,
                                 push.collapseID, push.receivedAt.timeIntervalSince1970, push.state.rawValue, push.detail, push.launchID,
                                 push.settledAt?.timeIntervalSince1970])
            // Settled history is bounded per app.
            try db.execute(sql: """
                DELETE FROM push WHERE app = ? AND state != 'pending' AND id NOT IN
                    (SELECT id FROM push WHERE app = ? AND state != 'pending' ORDER BY received_at DESC LIMIT ?)
                """, arguments: [push.app, push.app, Self.pushHistoryPerApp])
            return coalesced
        }
    }

    /// Pending pushes, oldest first.
    public func pendingPushes() throws(BGTaskError) -> [StoredPush] {
        try read("read the pending pushes") { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT * FROM push WHERE state = 'pending' ORDER BY received_at"))
                .map(Self.push)
        }
    }

    /// One push, by id.
    public func push(id: String) throws(BGTaskError) -> StoredPush? {
        try read("read push \(id)") { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM push WHERE id = ?"), arguments: [id]).map(Self.push)
        }
    }

    /// The pushes of `app` (or every app), newest first, at most `limit`.
    public func pushes(app: String?, limit: Int) throws(BGTaskError) -> [StoredPush] {
        try read("read the pushes") { db in
            if let app {
                return try Row.fetchAll(db, sql: "SELECT * FROM push WHERE app = ? ORDER BY received_at DESC LIMIT ?", arguments: [app, limit]).map(Self.push)
            }
            return try Row.fetchAll(db, sql: "SELECT * FROM push ORDER BY received_at DESC LIMIT ?", arguments: [limit]).map(Self.push)
        }
    }

    /// When the app's background pushes delivered since `since` were received... delivered, oldest first.
    public func backgroundPushDeliveries(app: String, since: Date) throws(BGTaskError) -> [Date] {
        try read("count the pushes delivered to \(app)") { db in
            try Double.fetchAll(db, sql: """
                SELECT settled_at FROM push WHERE app = ? AND kind = 'background' AND state = 'delivered' AND settled_at >= ?
                ORDER BY settled_at
                """, arguments: [app, since.timeIntervalSince1970]).map(Date.init(timeIntervalSince1970:))
        }
    }

    /// Settles a pending push: delivered (in `launchID`) or dropped, with `detail`.
    public func settlePush(id: String, _ state: StoredPush.State, detail: String, launchID: String? = nil, at date: Date) throws(BGTaskError) {
        try write("settle push \(id)") { db in
            try db.execute(sql: "UPDATE push SET state = ?, detail = ?, launch_id = ?, settled_at = ? WHERE id = ? AND state = 'pending'",
                           arguments: [state.rawValue, detail, launchID, date.timeIntervalSince1970, id])
        }
    }

    package static func push(_ row: Row) throws -> StoredPush {
        StoredPush(
            id: row["id"], app: row["app"], payload: row["payload"],
            kind: StoredPush.Kind(rawValue: row["kind"]) ?? .background, priority: row["priority"],
            expiration: (row["expiration"] as Double?).map(Date.init(timeIntervalSince1970:)), collapseID: row["collapse_id"],
            receivedAt: Date(timeIntervalSince1970: row["received_at"]),
            state: StoredPush.State(rawValue: row["state"]) ?? .pending, detail: row["detail"], launchID: row["launch_id"],
            settledAt: (row["settled_at"] as Double?).map(Date.init(timeIntervalSince1970:)))
    }
}

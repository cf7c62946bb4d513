import BGTaskControl
import Foundation

/// The overview's two long lists written directly (`RecordJSON`), the rest by `JSONEncoder`:
/// with 1,001 apps and 1,000 running launches, `JSONEncoder` spent about 20 of the overview's
/// 54 ms (p50, `bgtask-bench --only dashboard`) walking them through Codable's containers.
/// The keys and values are those the synthesized `Encodable` writes (DashboardTests decodes
/// both lists back with `JSONDecoder`).
extension Dashboard.Overview {
    func json() throws -> Data {
        var out = RecordJSON(capacity: 512 * (apps.count + running.count) + 4096)
        let encoder = JSONEncoder.control
        let clock = try self.clock.map { try encoder.encode($0) }
        let device = try self.device.map { try encoder.encode($0) }
        let pending = try encoder.encode(self.pending)
        out.object { out in
            out.key("now"); out.date(now)
            if let clock { out.key("clock"); out.json(clock) }
            if let device { out.key("device"); out.json(device) }
            out.key("apps"); out.array(apps) { $0.app($1) }
            out.key("running"); out.array(running) { $0.running($1) }
            out.key("pending"); out.json(pending)
            out.key("actions"); out.bool(actions)
        }
        guard let text = out.text else { return try encoder.encode(self) }
        return Data(text.utf8)
    }
}

extension RecordJSON {
    /// An `AppSummary` as its synthesized `Encodable` writes it.
    package mutating func app(_ app: AppSummary) {
        object { out in
            out.key("identifier"); out.string(app.identifier)
            out.key("path"); out.string(app.path)
            out.key("permittedIdentifiers"); out.strings(app.permittedIdentifiers)
            out.key("backgroundModes"); out.strings(app.backgroundModes)
            out.key("extensions"); out.strings(app.extensions)
            out.field("running", app.running)
            out.key("refreshEnabled"); out.bool(app.refreshEnabled)
            out.key("penaltyLevel"); out.integer(app.penaltyLevel)
            if let until = app.penaltyUntil { out.key("penaltyUntil"); out.date(until) }
            out.key("pending"); out.integer(app.pending)
            out.field("process", app.process)
            out.field("processID", app.processID)
            out.field("processBytes", app.processBytes)
            if let since = app.suspendedSince { out.key("suspendedSince"); out.date(since) }
            out.field("processLaunches", app.processLaunches)
            out.field("lastEviction", app.lastEviction)
            if let at = app.lastEvictionAt { out.key("lastEvictionAt"); out.date(at) }
            out.field("entitlements", app.entitlements)
            out.field("appGroups", app.appGroups)
        }
    }

    /// A `RunningLaunchReport` as its `Encodable` writes it.
    package mutating func running(_ launch: RunningLaunchReport) {
        object { out in
            out.key("launch_id"); out.string(launch.launchID)
            out.key("app"); out.string(launch.app)
            out.key("reason"); out.string(launch.reason)
            out.key("role"); out.string(launch.role)
            out.key("identifiers"); out.strings(launch.identifiers)
            out.key("started_at"); out.date(launch.startedAt)
            out.key("budget_ms"); out.number(launch.budgetMs)
            out.key("grace_ms"); out.number(launch.graceMs)
            out.key("expired"); out.bool(launch.expired)
            out.key("work_over"); out.bool(launch.workOver)
            out.field("pid", launch.pid)
            out.field("resident_bytes", launch.residentBytes)
            out.key("memory_limit_bytes"); out.integer(launch.memoryLimitBytes)
        }
    }
}

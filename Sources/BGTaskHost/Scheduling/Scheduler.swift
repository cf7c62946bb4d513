import BGTaskModel
import Foundation
import GRDB

/// What the scheduler reads from the store: due apps, their state and requests. A protocol, so
/// the scheduler can be given the real store (`PendingRequestStore`) or a table in a test.
protocol SchedulingSource {
    func dueApps(at now: Date) throws(BGTaskError) -> [String]
    func appState(_ app: String) throws(BGTaskError) -> AppState
    func pending(app: String?) throws(BGTaskError) -> [StoredRequest]
    func nextDueDate(after now: Date) throws(BGTaskError) -> Date?
}

extension PendingRequestStore: SchedulingSource {}

/// The store's scheduling reads inside one read transaction: a scheduling pass sees one
/// snapshot and pays for one transaction, not one per read (`PendingRequestStore.withSnapshot`).
struct StoreSnapshot: SchedulingSource {
    let db: Database
    let file: String

    private func reading<T>(_ operation: String, _ body: () throws -> T) throws(BGTaskError) -> T {
        do { return try body() } catch { throw StoreErrors.wrap(error, file: file, operation: operation) }
    }

    func dueApps(at now: Date) throws(BGTaskError) -> [String] {
        try reading("find the apps with requests due") {
            try String.fetchAll(db.cachedStatement(sql: PendingRequestStore.dueAppsSQL), arguments: [now.timeIntervalSince1970]).sorted()
        }
    }

    func appState(_ app: String) throws(BGTaskError) -> AppState {
        try reading("read the state of \(app)") { try PendingRequestStore.appState(db, app) }
    }

    func pending(app: String?) throws(BGTaskError) -> [StoredRequest] {
        try reading("list the pending requests") {
            if let app { return try PendingRequestStore.fetchRequests(db, where: "app = ? AND running_launch IS NULL", [app]) }
            return try PendingRequestStore.fetchRequests(db, where: "running_launch IS NULL", [])
        }
    }

    func nextDueDate(after now: Date) throws(BGTaskError) -> Date? {
        try reading("find the next due date") {
            try Double.fetchOne(db.cachedStatement(sql: PendingRequestStore.nextDueDateSQL), arguments: [now.timeIntervalSince1970])
                .map(Date.init(timeIntervalSince1970:))
        }
    }
}

extension PendingRequestStore {
    /// Runs `body` with the store's scheduling reads on one snapshot (one read transaction).
    func withSnapshot<T>(_ body: (StoreSnapshot) throws(BGTaskError) -> T) throws(BGTaskError) -> T {
        let file = databaseURL.path
        var outcome: Result<T, BGTaskError>?
        do {
            try passReader.inDatabase { db in
                try db.inCachedTransaction("DEFERRED") {
                    do throws(BGTaskError) { outcome = .success(try body(StoreSnapshot(db: db, file: file))) } catch { outcome = .failure(error) }
                }
            }
        } catch {
            throw StoreErrors.wrap(error, file: file, operation: "read a snapshot for the scheduling pass")
        }
        return try outcome!.get()
    }
}

/// The scheduling pass: which apps launch now with which of their requests, when to look again,
/// and whether device conditions must be watched meanwhile. It decides only; the host starts
/// the launches and arms the timers. `Eligibility` says, request by request, what holds it back.
struct Scheduler {
    var eligibility: Eligibility

    struct Decision {
        /// Launches to start now, in order: an app and the requests it runs.
        var launches: [(app: PluginBundle, requests: [StoredRequest])] = []
        /// The earliest moment something may become due or lift (nil: nothing to wait for).
        var wakeAt: Date?
        /// A request waits for power or network: re-read device conditions while it does.
        var watchConditions = false
    }

    /// `running`: apps with a launch now (one launch per app at a time); `catalog`: the valid
    /// bundles; `backingOff`: apps whose last launch could not start, still in their backoff.
    func decide(from source: SchedulingSource, catalog: [String: PluginBundle], running: Set<String>,
                runningCount: Int, maximumLaunches: Int, backingOff: (String) -> Bool) throws(BGTaskError) -> Decision {
        var decision = Decision()
        let now = eligibility.now
        var launching = runningCount
        for app in try source.dueApps(at: now) {
            guard launching < maximumLaunches else { break }
            guard !running.contains(app), let bundle = catalog[app], !backingOff(app) else { continue }
            let state = try source.appState(app)
            var eligible: [StoredRequest] = []
            for stored in try source.pending(app: app) {
                let blockers = eligibility.blockers(for: stored, app: bundle, state: state, appRunning: false).filter(\.blocking)
                if blockers.isEmpty {
                    eligible.append(stored)
                } else {
                    for until in blockers.compactMap(\.until) where until > now { decision.wakeAt = min(decision.wakeAt ?? until, until) }
                    if blockers.contains(where: { $0.knownCode?.liftsWithDeviceConditions == true }) { decision.watchConditions = true }
                }
            }
            if !eligible.isEmpty {
                decision.launches.append((bundle, eligible))
                launching += 1
            }
        }
        if let next = try source.nextDueDate(after: now) { decision.wakeAt = min(decision.wakeAt ?? next, next) }
        return decision
    }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskModel
import Foundation
import GRDB
import Synchronization
import Testing

/// A temporary directory per test; the state directory inside it is created by the store.
private struct StoreScratch {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-store-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    var state: URL { url.appendingPathComponent("state") }
    var databasePath: String { state.appendingPathComponent("bgtask.sqlite").path }

    /// A store on the state directory: each call is a new instance, as after a host restart.
    func open() throws -> PendingRequestStore { try PendingRequestStore(directory: state) }

    func remove() {
        _ = chmod(url.path, 0o755)
        _ = chmod(state.path, 0o755)
        try? FileManager.default.removeItem(at: url)
    }
}

private let t0 = Date(timeIntervalSince1970: 1_800_000_000)
private let feed = "com.example.feed"
private let mail = "com.example.mail"

private func refresh(_ identifier: String, earliest: Date? = nil) -> TaskRequest {
    TaskRequest(kind: .refresh, identifier: identifier, earliestBeginDate: earliest?.timeIntervalSince1970)
}

private func processing(_ identifier: String, earliest: Date? = nil) -> TaskRequest {
    TaskRequest(
        kind: .processing, identifier: identifier, earliestBeginDate: earliest?.timeIntervalSince1970,
        requiresNetworkConnectivity: true, requiresExternalPower: true)
}

/// An in-memory bundle of `identifier` that permits `identifier.tN` for N below `count`.
private func bundle(_ identifier: String, permittingNumbered count: Int) -> PluginBundle {
    var made = bundle(identifier)
    made.permittedIdentifiers = (0..<count).map { "\(identifier).t\($0)" }
    return made
}

/// A bundle built in memory: SubmissionRules only looks at its Info.plist values.
private func bundle(_ identifier: String) -> PluginBundle {
    PluginBundle(
        kind: .app, url: URL(fileURLWithPath: "/nonexistent/\(identifier).app"), identifier: identifier,
        executableName: "libApp.so",
        permittedIdentifiers: ["\(identifier).refresh", "\(identifier).other-refresh", "\(identifier).clean", "\(identifier).clean2", "\(identifier).export.*"],
        backgroundModes: ["fetch", "processing"], mappedHandlers: [], entitlements: [:], extensionPoint: nil,
        extensions: [], invalidExtensions: [])
}

extension PendingRequestStore {
    /// Submits with Apple's rules for an in-memory bundle of `app`; fails the test on rejection.
    fileprivate func submitChecked(_ request: TaskRequest, app: String, at date: Date = t0) throws -> SubmissionRules.Rejection? {
        try submit(app: app, request: request, at: date, rules: .init(app: bundle(app)))
    }

    fileprivate func accept(_ request: TaskRequest, app: String, at date: Date = t0, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let rejection = try submitChecked(request, app: app, at: date)
        #expect(rejection == nil, "rejected: \(rejection?.message ?? "")", sourceLocation: sourceLocation)
    }

    /// Submits without Apple's rules (an identifier the in-memory bundle does not permit).
    fileprivate func put(_ request: TaskRequest, app: String, at date: Date = t0, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let rejection = try submit(app: app, request: request, at: date, rules: nil)
        #expect(rejection == nil, sourceLocation: sourceLocation)
    }

    /// The EXPLAIN QUERY PLAN details of `sql`.
    fileprivate func plan(_ sql: String, _ arguments: StatementArguments = []) throws -> [String] {
        try pool.read { db in
            try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: arguments).map { try $0.decode(String.self, forColumn: "detail") }
        }
    }

    /// Launch ids of `app` in the launch table, running and ended, newest first.
    fileprivate func launchIDs(app: String) throws -> [String] {
        try pool.read { db in
            try String.fetchAll(db, sql: "SELECT id FROM launch WHERE app = ? ORDER BY started_at DESC, id DESC", arguments: [app])
        }
    }

    /// Every row of the request table (pending and running), for duplicate checks.
    fileprivate func allRows() throws -> [StoredRequest] {
        try pool.read { db in try Self.fetchRequests(db, where: "1", []) }
    }
}

private func runRecord(
    _ launchID: String, app: String, startedAt: Date, termination: RunRecord.Termination = .exited,
    tasks: [TaskRequest]
) -> RunRecord {
    RunRecord(
        app: app, launchID: launchID, reason: "scheduled",
        tasks: tasks.map {
            RunRecord.TaskRecord(
                identifier: $0.identifier, type: $0.kind, outcome: termination == .hostLost ? .unfinished : .succeeded,
                startedMs: 10.5, completedMs: termination == .hostLost ? nil : 14.25, expiredMs: nil,
                expirationHandled: nil, success: termination == .hostLost ? nil : true)
        },
        termination: termination, signal: nil, exitStatus: termination == .exited ? 0 : nil,
        error: termination == .hostLost ? "the host stopped during the launch" : nil,
        wallMs: 15.75, cpuMs: 14.5, peakRSSBytes: 29_300_000, memoryLimitBytes: 268_435_456,
        memoryMechanism: "sampler", budgetMs: 30_000, graceMs: 5_000, expiredAtMs: nil, pid: 9840,
        startedAt: startedAt, bundlePath: "/plugins/\(app).app", log: "/state/logs/\(launchID).log",
        registered: tasks.map(\.identifier), refusedRegistrations: ["\(app).nope"],
        submitted: [refresh("\(app).refresh", earliest: startedAt.addingTimeInterval(900))])
}

private func assignments(_ requests: [TaskRequest]) -> [TaskAssignment] {
    requests.enumerated().map { TaskAssignment(task: UInt64($0.offset + 1), identifier: $0.element.identifier, kind: $0.element.kind) }
}

/// Runs `body`, expecting a BGTaskError; returns it.
private func expectStoreError(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) -> BGTaskError? {
    do {
        try body()
        Issue.record("expected a BGTaskError, nothing was thrown", sourceLocation: sourceLocation)
        return nil
    } catch let error as BGTaskError {
        return error
    } catch {
        Issue.record("expected a BGTaskError, got \(type(of: error)): \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

@Suite struct PendingRequestStoreTests {
    // MARK: Opening

    @Test func createsTheDirectoryAndOpensInWALWithFullSyncAndForeignKeys() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try PendingRequestStore(directory: scratch.state.appendingPathComponent("nested/deeper"))
        #expect(store.databaseURL.lastPathComponent == "bgtask.sqlite")
        #expect(FileManager.default.fileExists(atPath: store.databaseURL.path))
        try store.pool.writeWithoutTransaction { db in
            #expect(try String.fetchOne(db, sql: "PRAGMA journal_mode") == "wal")
            #expect(try Int.fetchOne(db, sql: "PRAGMA synchronous") == 2, "synchronous must be FULL (2) on the writer")
            #expect(try Int.fetchOne(db, sql: "PRAGMA foreign_keys") == 1)
            #expect(try Int.fetchOne(db, sql: "PRAGMA busy_timeout") ?? 0 > 0)
            let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table'")
            for table in ["request", "launch", "app_state", "setting"] {
                #expect(tables.contains(table), "missing table \(table)")
            }
        }
    }

    @Test func aGarbageFileNamedBgtaskSqliteThrowsNamingTheFile() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
        try Data(String(repeating: "this is not a database, it is a shopping list\n", count: 100).utf8)
            .write(to: URL(fileURLWithPath: scratch.databasePath))
        let error = expectStoreError { _ = try scratch.open() }
        #expect(error?.code == .system)
        #expect(error?.file == scratch.databasePath)
        #expect(error?.description.contains(scratch.databasePath) == true, "\(String(describing: error))")
        #expect(error?.description.contains("not an SQLite database") == true, "\(String(describing: error))")
        #expect(error?.description.contains("move it aside") == true, "\(String(describing: error))")
    }

    @Test func aCorruptDatabaseThrowsSayingSoInsteadOfCrashing() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        do {
            let store = try scratch.open()
            for index in 0..<200 {
                try store.put(processing("com.example.app\(index).clean", earliest: t0), app: "com.example.app\(index)")
            }
        } // closing the last connection checkpoints the WAL into the file
        // Keep page 1 (the header and schema), overwrite the rest with garbage.
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: scratch.databasePath))
        let size = try handle.seekToEnd()
        #expect(size > 8192)
        try handle.seek(toOffset: 4096)
        try handle.write(contentsOf: Data(repeating: 0xA5, count: Int(size) - 4096))
        try handle.close()

        let error = expectStoreError {
            let store = try scratch.open()
            _ = try store.pending(app: nil)
            _ = try store.dueApps(at: t0)
        }
        #expect(error?.code == .system)
        #expect(error?.file == scratch.databasePath)
        #expect(error?.description.contains(scratch.databasePath) == true, "\(String(describing: error))")
        #expect(error?.description.contains("corrupt") == true, "\(String(describing: error))")
        #expect(error?.description.contains("move it aside") == true, "\(String(describing: error))")
    }

    @Test func aStateDirectoryThatIsAFileThrowsNamingIt() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        try Data("x".utf8).write(to: scratch.state)
        let error = expectStoreError { _ = try scratch.open() }
        #expect(error?.description.contains(scratch.state.path) == true, "\(String(describing: error))")
    }

    // Root ignores file permissions, so these checks cannot fail for root: skipped there.
    @Test("a read-only state directory or database file throws naming it (skipped as root, which ignores permissions)",
          .disabled(if: getuid() == 0, "running as root, which ignores file permissions"))
    func readOnlyDirectoryOrFileThrowsNamingIt() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        do { _ = try scratch.open() } // creates the database, then closes it

        let file = scratch.databasePath
        #expect(chmod(file, 0o444) == 0)
        let fileError = expectStoreError { _ = try scratch.open() }
        #expect(fileError?.file == file)
        #expect(fileError?.description.contains(file) == true, "\(String(describing: fileError))")
        #expect(chmod(file, 0o644) == 0)

        #expect(chmod(scratch.state.path, 0o555) == 0)
        let directoryError = expectStoreError { _ = try scratch.open() }
        #expect(directoryError?.description.contains(scratch.state.path) == true, "\(String(describing: directoryError))")
        #expect(directoryError?.description.contains("not writable") == true, "\(String(describing: directoryError))")
    }

    // MARK: Requests

    @Test func submitReplaceCancelAndPendingOrder() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let full = TaskRequest(
            kind: .continuedProcessing, identifier: "\(feed).export.photos", earliestBeginDate: 1_800_000_123.5,
            requiresNetworkConnectivity: true, requiresExternalPower: false, protectionType: 3,
            title: "Exporting", subtitle: "12 photos", strategyFail: true, requiredResources: 1)
        try store.accept(refresh("\(feed).refresh", earliest: t0.addingTimeInterval(60)), app: feed, at: t0)
        try store.accept(processing("\(feed).clean"), app: feed, at: t0.addingTimeInterval(1))
        #expect(try store.submit(app: feed, request: full, at: t0.addingTimeInterval(2.25), rules: nil) == nil)

        var pending = try store.pending(app: feed)
        #expect(pending.map(\.request.identifier) == ["\(feed).refresh", "\(feed).clean", "\(feed).export.photos"])
        // Every field survives the round trip.
        #expect(pending[2] == StoredRequest(app: feed, request: full, submittedAt: t0.addingTimeInterval(2.25)))
        #expect(pending[0].earliest == t0.addingTimeInterval(60))
        #expect(pending[1].request == processing("\(feed).clean"))
        #expect(pending.allSatisfy { $0.runningLaunch == nil })

        // Submitting an identifier again replaces its pending request: one row, the new values,
        // and it is now the newest submission.
        try store.accept(refresh("\(feed).refresh", earliest: t0.addingTimeInterval(600)), app: feed, at: t0.addingTimeInterval(3))
        pending = try store.pending(app: feed)
        #expect(pending.map(\.request.identifier) == ["\(feed).clean", "\(feed).export.photos", "\(feed).refresh"])
        #expect(pending[2].earliest == t0.addingTimeInterval(600))
        #expect(pending[2].submittedAt == t0.addingTimeInterval(3))
        #expect(try store.pendingRequest(identifier: "\(feed).refresh")?.request.earliestBeginDate == t0.addingTimeInterval(600).timeIntervalSince1970)

        #expect(try store.cancel(app: feed, identifier: "\(feed).clean") == 1)
        #expect(try store.cancel(app: feed, identifier: "\(feed).clean") == 0)
        #expect(try store.cancel(app: feed, identifier: "\(feed).unknown") == 0)
        #expect(try store.pending(app: feed).map(\.request.identifier) == ["\(feed).export.photos", "\(feed).refresh"])
        #expect(try store.pendingRequest(identifier: "\(feed).clean") == nil)

        #expect(try store.cancel(app: feed, identifier: nil) == 2)
        #expect(try store.pending(app: feed).isEmpty)
        #expect(try store.pending(app: nil).isEmpty)
    }

    @Test func checkSeesExistingRequestsAndItsRejectionStoresNothing() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        try store.accept(refresh("\(feed).refresh"), app: feed)
        try store.accept(processing("\(feed).clean"), app: feed)
        try store.accept(refresh("\(mail).refresh"), app: mail)

        // An identifier the app does not permit: rejected, nothing stored.
        let rejection = try store.submitChecked(refresh("\(feed).x"), app: feed)
        #expect(rejection?.status == .notPermitted)
        #expect(try store.pending(app: feed).map(\.request.identifier) == ["\(feed).refresh", "\(feed).clean"])

        // Apple's rules through the store see the app's own requests (not another app's, which
        // has a refresh too): a second refresh identifier is one too many, and the rejection
        // leaves the existing one in place; resubmitting the same identifier is fine.
        let tooMany = try store.submitChecked(refresh("\(feed).other-refresh"), app: feed)
        #expect(tooMany?.status == .tooManyPendingTaskRequests)
        #expect(try store.pending(app: feed).map(\.request.identifier) == ["\(feed).refresh", "\(feed).clean"])
        try store.accept(refresh("\(feed).refresh", earliest: t0.addingTimeInterval(5)), app: feed)
        #expect(try store.pending(app: feed).count == 2)

        // A rejection replaces nothing: with the app's Background App Refresh switched off (its
        // state, read in the same transaction), the pending request with the same identifier stays.
        var state = try store.appState(feed)
        state.refreshEnabled = false
        try store.saveAppState(state)
        let switchedOff = try store.submitChecked(refresh("\(feed).refresh"), app: feed)
        #expect(switchedOff?.status == .unavailable && switchedOff?.message.contains("Background App Refresh is off for \(feed)") == true)
        #expect(try store.pendingRequest(identifier: "\(feed).refresh")?.earliest == t0.addingTimeInterval(5))
    }

    @Test func appsAreIsolated() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let shared = "com.example.shared.refresh"
        try store.accept(refresh("\(mail).refresh"), app: mail, at: t0)
        try store.put(refresh(shared), app: mail, at: t0.addingTimeInterval(1))
        try store.accept(refresh("\(feed).refresh"), app: feed, at: t0.addingTimeInterval(2))
        try store.put(refresh(shared), app: feed, at: t0.addingTimeInterval(3))

        #expect(try store.pending(app: feed).map(\.request.identifier) == ["\(feed).refresh", shared])
        #expect(try store.pending(app: mail).map(\.request.identifier) == ["\(mail).refresh", shared])
        #expect(try store.pending(app: nil).map(\.app) == [mail, mail, feed, feed])
        // Two apps with the same identifier: the first by app name.
        #expect(try store.pendingRequest(identifier: shared)?.app == feed)

        #expect(try store.cancel(app: feed, identifier: shared) == 1)
        #expect(try store.pendingRequest(identifier: shared)?.app == mail)
        #expect(try store.cancel(app: feed, identifier: nil) == 1)
        #expect(try store.pending(app: mail).count == 2)
        #expect(try store.removeApp(mail) == 2)
        #expect(try store.pending(app: nil).isEmpty)
    }

    @Test func dueAppsAndNextDueDate() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        #expect(try store.dueApps(at: t0).isEmpty)
        #expect(try store.nextDueDate(after: t0) == nil)

        try store.accept(refresh("a.x.refresh"), app: "a.x")                                      // nil: due now
        try store.accept(refresh("b.x.refresh", earliest: t0.addingTimeInterval(-60)), app: "b.x") // past
        try store.accept(refresh("c.x.refresh", earliest: t0), app: "c.x")                         // exactly now
        try store.accept(refresh("d.x.refresh", earliest: t0.addingTimeInterval(100)), app: "d.x") // future
        try store.accept(processing("d.x.clean", earliest: t0.addingTimeInterval(50)), app: "d.x") // sooner
        try store.accept(refresh("e.x.refresh", earliest: t0.addingTimeInterval(3600)), app: "e.x")

        #expect(try store.dueApps(at: t0) == ["a.x", "b.x", "c.x"])
        #expect(try store.nextDueDate(after: t0) == t0.addingTimeInterval(50))
        #expect(try store.dueApps(at: t0.addingTimeInterval(60)) == ["a.x", "b.x", "c.x", "d.x"])
        #expect(try store.nextDueDate(after: t0.addingTimeInterval(50)) == t0.addingTimeInterval(100))
        #expect(try store.nextDueDate(after: t0.addingTimeInterval(3600)) == nil)

        // Running requests are not due, and do not set the next date.
        try store.beginLaunch(id: "L-a", app: "a.x", reason: "scheduled", tasks: assignments([refresh("a.x.refresh")]), at: t0)
        try store.beginLaunch(id: "L-d", app: "d.x", reason: "scheduled", tasks: assignments([processing("d.x.clean")]), at: t0)
        #expect(try store.dueApps(at: t0) == ["b.x", "c.x"])
        #expect(try store.nextDueDate(after: t0) == t0.addingTimeInterval(100))
        #expect(try store.dueApps(at: t0.addingTimeInterval(99)) == ["b.x", "c.x"])
        #expect(try store.dueApps(at: t0.addingTimeInterval(100)) == ["b.x", "c.x", "d.x"])
    }

    /// The scheduling pass reads through a connection of its own (`passReader`): it must see
    /// every commit made before the pass, and one pass sees one snapshot, whatever commits
    /// while it runs.
    @Test func theSchedulingSnapshotSeesEveryEarlierCommitAndNoneMadeDuringIt() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        try store.accept(refresh("\(feed).refresh"), app: feed)
        try store.withSnapshot { source throws(BGTaskError) in
            #expect(try source.dueApps(at: t0) == [feed])
            // Committed by the writer while the pass reads: not in this pass.
            do { try store.accept(refresh("\(mail).refresh"), app: mail) } catch { Issue.record("\(error)") }
            try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([refresh("\(feed).refresh")]), at: t0)
            #expect(try source.dueApps(at: t0) == [feed])
            #expect(try source.pending(app: mail).isEmpty)
            #expect(try source.pending(app: feed).map(\.request.identifier) == ["\(feed).refresh"])
        }
        try store.withSnapshot { source throws(BGTaskError) in
            #expect(try source.dueApps(at: t0) == [mail])
            #expect(try source.pending(app: feed).isEmpty)
        }
    }

    /// The registered identifiers of an app's state are decoded once per distinct text: a
    /// changed list is read as changed, and the memory of decoded lists stays bounded.
    @Test func registeredIdentifiersAreReadAnewWhenTheyChangeAndTheirMemoryIsBounded() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        var state = AppState(app: feed)
        state.lastRegistered = ["\(feed).refresh"]
        try store.saveAppState(state)
        #expect(try store.appState(feed).lastRegistered == ["\(feed).refresh"])
        state.lastRegistered = ["\(feed).refresh", "\(feed).clean"]
        try store.saveAppState(state)
        #expect(try store.appState(feed).lastRegistered == ["\(feed).refresh", "\(feed).clean"])
        let limit = PendingRequestStore.registeredCacheSize
        for index in 0..<(limit + 10) {
            #expect(try PendingRequestStore.registeredIdentifiers("[\"x.\(index)\"]") == ["x.\(index)"])
            #expect(PendingRequestStore.registeredCacheCount <= limit)
        }
        #expect(throws: (any Error).self) { try PendingRequestStore.registeredIdentifiers("[\"unterminated") }
    }

    @Test func dueAppsAndNextDueDateSearchAnIndexNeverScanRequests() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        for index in 0..<50 {
            try store.put(refresh("r\(index)", earliest: index % 3 == 0 ? nil : t0.addingTimeInterval(Double(index))), app: "app\(index % 7).x")
        }
        let now = t0.timeIntervalSince1970 + 25
        for (name, sql) in [("dueApps", PendingRequestStore.dueAppsSQL), ("nextDueDate", PendingRequestStore.nextDueDateSQL)] {
            let plan = try store.pool.read { db in
                try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: [now]).map { try $0.decode(String.self, forColumn: "detail") }
            }
            let text = plan.joined(separator: " | ")
            // Every step that reads the table goes through an index.
            #expect(plan.allSatisfy { !$0.contains("request") || $0.contains("USING INDEX") || $0.contains("USING COVERING INDEX") },
                    "\(name): \(text)")
            #expect(text.contains("USING INDEX request_pending_due") || text.contains("USING COVERING INDEX request_pending_due"), "\(name): \(text)")
            #expect(!text.contains("SCAN request"), "\(name): \(text)")
        }
    }

    @Test func pendingCountsCountPendingRequestsPerAppNotRunningOnes() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        #expect(try store.pendingCounts().isEmpty)
        let r = refresh("\(feed).refresh"), c = processing("\(feed).clean"), c2 = processing("\(feed).clean2")
        try store.accept(r, app: feed)
        try store.accept(c, app: feed)
        try store.accept(c2, app: feed)
        try store.accept(refresh("\(mail).refresh"), app: mail)
        try store.accept(processing("\(mail).clean"), app: mail)
        try store.accept(refresh("c.x.refresh"), app: "c.x")
        #expect(try store.pendingCounts() == [feed: 3, mail: 2, "c.x": 1])

        // Requests a launch took are running, not pending; a resubmission during it is pending.
        try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([r, c]), at: t0)
        try store.beginLaunch(id: "L2", app: "c.x", reason: "scheduled", tasks: assignments([refresh("c.x.refresh")]), at: t0)
        #expect(try store.pendingCounts() == [feed: 1, mail: 2])
        try store.accept(refresh(r.identifier, earliest: t0.addingTimeInterval(900)), app: feed)
        #expect(try store.pendingCounts() == [feed: 2, mail: 2])
        #expect(try store.pendingCounts() == Dictionary(grouping: try store.pending(app: nil), by: \.app).mapValues(\.count))

        // Of some apps only: unknown apps and apps with nothing pending are absent.
        #expect(try store.pendingCounts(apps: [mail, "c.x", "nobody.x"]) == [mail: 2])
        #expect(try store.pendingCounts(apps: [feed]) == [feed: 2])
        #expect(try store.pendingCounts(apps: []).isEmpty)
    }

    @Test func pendingCountsOfManyAppsSpanSeveralStatements() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let apps = (0..<(PendingRequestStore.inListSize * 2 + 7)).map { "app\($0).x" }
        try store.pool.write { db in
            for (index, app) in apps.enumerated() {
                for task in 0..<(index % 3) {
                    try PendingRequestStore.insert(db, app: app, request: refresh("\(app).t\(task)"), submittedAt: t0)
                }
            }
        }
        let counts = try store.pendingCounts(apps: apps)
        #expect(counts.count == apps.indices.filter { $0 % 3 != 0 }.count)
        #expect(apps.enumerated().allSatisfy { counts[$0.element, default: 0] == $0.offset % 3 })
        #expect(counts == (try store.pendingCounts()))
    }

    @Test func pendingCountsSearchThePendingIndexNeverTheTable() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        for index in 0..<50 { try store.put(refresh("r\(index)"), app: "app\(index % 7).x") }
        let all = try store.plan(PendingRequestStore.pendingCountsSQL)
        #expect(all == ["SCAN request USING INDEX request_pending_unique"]
                || all == ["SCAN request USING COVERING INDEX request_pending_unique"], "\(all)")
        // The table itself is never read: the index holds app, and its WHERE is the query's.
        let program = try store.pool.read { db in
            try Row.fetchAll(db, sql: "EXPLAIN " + PendingRequestStore.pendingCountsSQL).map { row in
                (opcode: try row.decode(String.self, forColumn: "opcode"), cursor: try row.decode(Int.self, forColumn: "p1"),
                 keyInfo: String.fromDatabaseValue(row["p4"] as DatabaseValue)?.hasPrefix("k(") == true)
            }
        }
        // An index cursor is opened with its key description (p4 "k(...)"), a table's without.
        let tableCursors = Set(program.filter { $0.opcode == "OpenRead" && !$0.keyInfo }.map(\.cursor))
        #expect(!tableCursors.isEmpty && !program.contains { $0.opcode == "Column" && tableCursors.contains($0.cursor) },
                "\(program)")

        let some = try store.plan(PendingRequestStore.pendingCountsSQL(apps: 3), ["app1.x", "app2.x", "nobody"])
        #expect(some.contains { $0.hasPrefix("SEARCH request USING") && $0.contains("INDEX request_pending_unique (app=?)") }, "\(some)")
        #expect(!some.contains { $0.contains("SCAN request") || $0.contains("request_app") }, "\(some)")
    }

    @Test func aDatabaseWithTheFirstSchemaIsMigratedAndKeepsItsRequests() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
        do {
            let pool = try DatabasePool(path: scratch.databasePath)
            try StoreSchema.migrator.migrate(pool, upTo: "v1")
            try pool.write { db in
                try PendingRequestStore.insert(db, app: feed, request: refresh("\(feed).refresh"), submittedAt: t0)
            }
        }
        let store = try scratch.open()
        #expect(try store.pending(app: feed).map(\.request) == [refresh("\(feed).refresh")])
        let plan = try store.pool.read { db in
            try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + PendingRequestStore.dueAppsSQL, arguments: [t0.timeIntervalSince1970])
                .map { try $0.decode(String.self, forColumn: "detail") }.joined(separator: " | ")
        }
        #expect(plan.contains("request_pending_due") && !plan.contains("request_running"), "\(plan)")
    }

    // MARK: Launches

    @Test func beginLaunchTakesRequestsAndAResubmissionDuringItIsANewPendingRow() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let r = refresh("\(feed).refresh"), c = processing("\(feed).clean"), x = processing("\(feed).export.x")
        try store.accept(r, app: feed)
        try store.accept(c, app: feed)
        try store.put(x, app: feed)
        try store.accept(refresh("\(mail).refresh"), app: mail)

        // A task with no pending request (a forced launch) is fine; other apps are untouched.
        try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([r, c, refresh("\(feed).not-pending")]), at: t0)
        #expect(try store.pending(app: feed).map(\.request.identifier) == [x.identifier])
        #expect(try store.pending(app: mail).count == 1)
        #expect(try store.pendingRequest(identifier: r.identifier) == nil)
        #expect(try store.allRows().filter { $0.runningLaunch == "L1" }.map(\.request.identifier) == [r.identifier, c.identifier])

        // During the launch the app submits its refresh again: check sees the running one too,
        // Apple's rules accept it (same identifier), and it is a new pending row beside it.
        let again = refresh(r.identifier, earliest: t0.addingTimeInterval(900))
        #expect(try store.submitChecked(again, app: feed, at: t0.addingTimeInterval(1)) == nil)
        // The running refresh counts: another refresh identifier is one too many.
        #expect(try store.submitChecked(refresh("\(feed).other-refresh"), app: feed)?.status == .tooManyPendingTaskRequests)
        #expect(try store.pending(app: feed).map(\.request) == [x, again])
        #expect(try store.allRows().filter { $0.request.identifier == r.identifier }.map(\.runningLaunch) == ["L1", nil])
        // Cancelling during the launch cancels the pending one, not the running one.
        #expect(try store.cancel(app: feed, identifier: nil) == 2)
        #expect(try store.allRows().filter { $0.app == feed }.map(\.runningLaunch) == ["L1", "L1"])

        // A launch id is recorded once.
        let duplicate = expectStoreError { try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: [], at: t0) }
        #expect(duplicate?.description.contains("L1") == true)
        let missing = expectStoreError { try store.setLaunchPID(id: "nope", pid: 1) }
        #expect(missing?.description.contains("nope") == true)
    }

    @Test func finishLaunchDeletesOnlyItsRequestsAndHistoryReturnsTheRecord() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let r = refresh("\(feed).refresh"), c = processing("\(feed).clean"), c2 = processing("\(feed).clean2")
        try store.accept(r, app: feed)
        try store.accept(c, app: feed)
        try store.accept(c2, app: feed)
        try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([r, c]), at: t0)
        try store.setLaunchPID(id: "L1", pid: 9840)
        let again = refresh(r.identifier, earliest: t0.addingTimeInterval(900))
        try store.accept(again, app: feed, at: t0.addingTimeInterval(1))

        let record = runRecord("L1", app: feed, startedAt: t0, tasks: [r, c])
        try store.finishLaunch(record)
        #expect(try store.pending(app: feed).map(\.request) == [c2, again])
        #expect(try store.allRows().count == 2)
        #expect(try store.interruptedLaunches().isEmpty)
        // Whole-second start: the record comes back exactly as it went in.
        #expect(try store.history(app: feed, limit: 10) == [record])

        // A fractional start time: history equals what RunRecord's own JSON round trip gives.
        let later = runRecord("L2", app: feed, startedAt: t0.addingTimeInterval(60.5), tasks: [c2])
        try store.beginLaunch(id: "L2", app: feed, reason: "scheduled", tasks: assignments([c2]), at: later.startedAt)
        try store.finishLaunch(later)
        #expect(try store.history(app: feed, limit: 10) == [try RunRecord.decode(later.jsonData()), record])
        #expect(try store.pending(app: feed).map(\.request) == [again])

        // A launch never begun (failed before beginLaunch) is recorded ended.
        let mailRecord = runRecord("L3", app: mail, startedAt: t0.addingTimeInterval(30), termination: .launchFailed, tasks: [])
        try store.finishLaunch(mailRecord)
        #expect(try store.interruptedLaunches().isEmpty)
        #expect(try store.history(app: mail, limit: 10) == [mailRecord])

        // Newest first by start time, across apps; limit caps.
        #expect(try store.history(app: nil, limit: 10).map(\.launchID) == ["L2", "L3", "L1"])
        #expect(try store.history(app: nil, limit: 2).map(\.launchID) == ["L2", "L3"])
        #expect(try store.history(app: feed, limit: 1).map(\.launchID) == ["L2"])
        #expect(try store.history(app: nil, limit: 0).isEmpty)
        #expect(try store.history(app: "com.example.unknown", limit: 10).isEmpty)

        // Same start time: the greater id first.
        try store.finishLaunch(runRecord("L0", app: mail, startedAt: t0.addingTimeInterval(30), tasks: []))
        #expect(try store.history(app: mail, limit: 10).map(\.launchID) == ["L3", "L0"])
    }

    @Test func pruneHistoryKeepsTheNewestEndedLaunchesOfTheAppOnly() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        // feed: F0 (oldest) ... F9 ended, a running launch R-old among the old ones, a running
        // R-new newest of all, and F10/F11 sharing a start time (ordered by id).
        for index in 0..<10 {
            try store.finishLaunch(runRecord("F\(index)", app: feed, startedAt: t0.addingTimeInterval(Double(index * 10)), tasks: []))
        }
        try store.beginLaunch(id: "R-old", app: feed, reason: "scheduled", tasks: [], at: t0.addingTimeInterval(15))
        try store.beginLaunch(id: "R-new", app: feed, reason: "scheduled", tasks: [], at: t0.addingTimeInterval(1000))
        try store.finishLaunch(runRecord("F11", app: feed, startedAt: t0.addingTimeInterval(200), tasks: []))
        try store.finishLaunch(runRecord("F10", app: feed, startedAt: t0.addingTimeInterval(200), tasks: []))
        for index in 0..<5 {
            try store.finishLaunch(runRecord("M\(index)", app: mail, startedAt: t0.addingTimeInterval(Double(index)), tasks: []))
        }
        #expect(try store.launchIDs(app: feed) == ["R-new", "F11", "F10", "F9", "F8", "F7", "F6", "F5", "F4", "F3", "F2", "R-old", "F1", "F0"])

        // Nothing to prune while an app has `keep` ended launches or fewer.
        #expect(try store.pruneHistory(app: feed, keep: 12) == 0)
        #expect(try store.pruneHistory(app: feed, keep: 100) == 0)
        #expect(try store.pruneHistory(app: "nobody.x", keep: 1) == 0)
        #expect(try store.launchIDs(app: feed).count == 14)

        // The newest 4 ended launches stay; running launches neither count nor go.
        #expect(try store.pruneHistory(app: feed, keep: 4) == 8)
        #expect(try store.launchIDs(app: feed) == ["R-new", "F11", "F10", "F9", "F8", "R-old"])
        #expect(try store.history(app: feed, limit: 100).map(\.launchID) == ["F11", "F10", "F9", "F8"])
        #expect(try store.interruptedLaunches().map(\.launchID).sorted() == ["R-new", "R-old"])
        #expect(try store.history(app: mail, limit: 100).count == 5, "other apps are untouched")
        #expect(try store.pruneHistory(app: feed, keep: 4) == 0, "pruning again changes nothing")

        // A tie on the start time is broken by id, as history orders it.
        #expect(try store.pruneHistory(app: feed, keep: 1) == 3)
        #expect(try store.launchIDs(app: feed) == ["R-new", "F11", "R-old"])
        #expect(try store.interruptedLaunches().count == 2)

        // finishLaunch prunes in its own transaction; the requests the launch ran are gone too.
        let r = refresh("\(mail).refresh")
        try store.accept(r, app: mail)
        try store.beginLaunch(id: "M9", app: mail, reason: "scheduled", tasks: assignments([r]), at: t0.addingTimeInterval(50))
        try store.finishLaunch(runRecord("M9", app: mail, startedAt: t0.addingTimeInterval(50), tasks: [r]), keepHistory: 2)
        #expect(try store.launchIDs(app: mail) == ["M9", "M4"])
        #expect(try store.allRows().isEmpty)
        #expect(try store.launchIDs(app: feed) == ["R-new", "F11", "R-old"])

        // So does the recovery of an interrupted launch, which ends it (host-lost).
        let lost = try #require(try store.interruptedLaunches().first { $0.launchID == "R-old" })
        try store.recoverInterruptedLaunch(.hostLost(lost, bundlePath: "/plugins/feed.app", log: "/state/logs/R-old.log", detail: "test"), keepHistory: 1)
        #expect(try store.launchIDs(app: feed) == ["R-new", "F11"])
    }

    @Test func pruneHistorySearchesLaunchIndexesNeverScansTheTable() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        for index in 0..<20 {
            try store.finishLaunch(runRecord("L\(index)", app: index % 2 == 0 ? feed : mail, startedAt: t0.addingTimeInterval(Double(index)), tasks: []))
        }
        let arguments: [(String, String, StatementArguments)] = [
            ("boundary", PendingRequestStore.historyBoundarySQL, [feed, 3]),
            ("running", PendingRequestStore.runningNewerSQL, [feed, t0.timeIntervalSince1970, "L4"]),
            ("delete", PendingRequestStore.pruneHistorySQL, [feed, t0.timeIntervalSince1970, "L4"]),
            ("pruned", PendingRequestStore.prunedLaunchesSQL, [feed, t0.timeIntervalSince1970, "L4"]),
        ]
        var plans: [String: [String]] = [:]
        for (name, sql, values) in arguments { plans[name] = try store.plan(sql, values) }
        #expect(plans["boundary"] == ["SEARCH launch USING COVERING INDEX launch_app_started (app=?)"], "\(plans)")
        #expect(plans["running"] == ["SEARCH launch USING INDEX launch_state (state=?)"], "\(plans)")
        // The delete: a range of the app's launches, and the foreign key's check that no request
        // still points at a deleted launch, through request_running.
        #expect(plans["delete"] == ["SEARCH launch USING INDEX launch_app_started (app=? AND (started_at,id)<(?,?))",
                                    "SEARCH request USING COVERING INDEX request_running (running_launch=?)"], "\(plans)")
        #expect(plans["pruned"] == ["SEARCH launch USING INDEX launch_app_started (app=? AND (started_at,id)<(?,?))"], "\(plans)")
        #expect(plans.values.joined().allSatisfy { !$0.contains("SCAN") }, "\(plans)")
    }

    @Test func interruptedLaunchRecoversItsRequestsExactlyOnce() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let r = refresh("\(feed).refresh"), c = processing("\(feed).clean"), c2 = processing("\(feed).clean2")
        let again = processing(c.identifier, earliest: t0.addingTimeInterval(900))
        let tasks = assignments([r, c, c2])
        do {
            let store = try scratch.open()
            try store.accept(r, app: feed, at: t0)
            try store.accept(c, app: feed, at: t0.addingTimeInterval(1))
            try store.accept(c2, app: feed, at: t0.addingTimeInterval(2))
            try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: tasks, at: t0.addingTimeInterval(10.5))
            try store.setLaunchPID(id: "L1", pid: 4321)
            // Resubmitted during the launch, then the host dies (the store is dropped unfinished).
            try store.accept(again, app: feed, at: t0.addingTimeInterval(11))
        }

        let store = try scratch.open()
        let interrupted = try store.interruptedLaunches()
        #expect(interrupted == [InterruptedLaunch(
            launchID: "L1", app: feed, pid: 4321, reason: "scheduled", startedAt: t0.addingTimeInterval(10.5), tasks: tasks)])
        #expect(try store.pending(app: feed).map(\.request) == [again])

        let lost = runRecord("L1", app: feed, startedAt: t0.addingTimeInterval(10.5), termination: .hostLost, tasks: [r, c, c2])
        try store.recoverInterruptedLaunch(lost)
        // Every request pending again, once; the resubmission (newer) wins over the one it ran.
        let pending = try store.pending(app: feed)
        #expect(pending.map(\.request) == [r, c2, again])
        #expect(try store.allRows().count == 3)
        #expect(Set(pending.map(\.request.identifier)).count == pending.count)
        #expect(try store.interruptedLaunches().isEmpty)
        #expect(try store.history(app: feed, limit: 10) == [try RunRecord.decode(lost.jsonData())])
        #expect(try store.history(app: feed, limit: 10).first?.termination == .hostLost)

        // And after another restart, still exactly that.
        let reopened = try scratch.open()
        #expect(try reopened.pending(app: feed).map(\.request) == [r, c2, again])
        #expect(try reopened.interruptedLaunches().isEmpty)
        #expect(try reopened.dueApps(at: t0) == [feed])
        // The recovered requests can be launched and finished normally.
        try reopened.beginLaunch(id: "L2", app: feed, reason: "scheduled", tasks: assignments([r, c2]), at: t0.addingTimeInterval(20))
        try reopened.finishLaunch(runRecord("L2", app: feed, startedAt: t0.addingTimeInterval(20), tasks: [r, c2]))
        #expect(try reopened.pending(app: feed).map(\.request) == [again])
    }

    @Test func recoveringALaunchThatNeverBeganOrFinishedIsHarmless() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        try store.accept(refresh("\(feed).refresh"), app: feed)
        let lost = runRecord("L9", app: feed, startedAt: t0, termination: .hostLost, tasks: [])
        try store.recoverInterruptedLaunch(lost)
        #expect(try store.pending(app: feed).count == 1)
        #expect(try store.history(app: feed, limit: 5) == [lost])
        // A record whose app is not the launch's is refused, and changes nothing.
        try store.beginLaunch(id: "L10", app: feed, reason: "scheduled", tasks: assignments([refresh("\(feed).refresh")]), at: t0)
        let wrong = expectStoreError { try store.finishLaunch(runRecord("L10", app: mail, startedAt: t0, tasks: [])) }
        #expect(wrong?.description.contains(mail) == true)
        #expect(try store.interruptedLaunches().map(\.launchID) == ["L10"])
        #expect(try store.allRows().map(\.runningLaunch) == ["L10"])
    }

    // MARK: Durability

    @Test func aNewInstanceOnTheSameDirectorySeesEverything() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        var state = AppState(app: feed)
        state.refreshEnabled = false
        state.penaltyLevel = 2
        state.penaltyUntil = t0.addingTimeInterval(3600.25)
        state.lastLaunchAt = t0
        state.lastLaunchID = "L1"
        state.lastRegistered = ["\(feed).refresh", "\(feed).clean"]
        let record = runRecord("L1", app: feed, startedAt: t0, tasks: [refresh("\(feed).refresh")])
        do {
            let store = try scratch.open()
            try store.accept(refresh("\(feed).refresh"), app: feed)
            try store.accept(processing("\(feed).clean", earliest: t0.addingTimeInterval(60)), app: feed)
            try store.accept(refresh("\(mail).refresh"), app: mail)
            try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([refresh("\(feed).refresh")]), at: t0)
            try store.finishLaunch(record)
            try store.beginLaunch(id: "L2", app: mail, reason: "scheduled", tasks: assignments([refresh("\(mail).refresh")]), at: t0)
            try store.saveAppState(state)
            try store.setSetting("clock", "virtual:1800000000")
        }
        let store = try scratch.open()
        #expect(try store.pending(app: nil).map(\.request.identifier) == ["\(feed).clean"])
        #expect(try store.nextDueDate(after: t0) == t0.addingTimeInterval(60))
        #expect(try store.history(app: nil, limit: 10) == [record])
        #expect(try store.interruptedLaunches().map(\.launchID) == ["L2"])
        #expect(try store.appState(feed) == state)
        #expect(try store.setting("clock") == "virtual:1800000000")
        // Two instances at once (the daemon and a CLI command) see each other's writes.
        let other = try scratch.open()
        try other.put(refresh("\(feed).refresh"), app: feed)
        #expect(try store.pending(app: feed).count == 2)
    }

    #if os(Linux)
    /// The host spawns launch children: the database's descriptors must not leak into them.
    @Test func theDatabaseDescriptorsAreCloseOnExec() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        try store.put(refresh("\(feed).refresh"), app: feed)
        _ = try store.pending(app: nil)
        var checked = 0
        for name in try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)"),
                  target.hasPrefix(scratch.databasePath),
                  let info = try? String(contentsOfFile: "/proc/self/fdinfo/\(name)", encoding: .utf8),
                  let flagsLine = info.split(separator: "\n").first(where: { $0.hasPrefix("flags:") }),
                  let flags = Int(flagsLine.dropFirst("flags:".count).trimmingCharacters(in: .whitespaces), radix: 8)
            else { continue }
            checked += 1
            #expect(flags & Int(O_CLOEXEC) != 0, "\(target) (fd \(name)) is inherited by children")
        }
        #expect(checked >= 2, "expected the database and its WAL to be open")
    }
    #endif

    @Test func concurrentSubmissionsAreAllKeptOnce() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let failures = Mutex(0)
        DispatchQueue.concurrentPerform(iterations: 40) { index in
            do {
                // Each identifier submitted twice from different threads: one row each in the end.
                let request = processing("app\(index % 4).x.task\(index % 20)")
                _ = try store.submit(app: "app\(index % 4).x", request: request, at: t0, rules: nil)
            } catch {
                failures.withLock { $0 += 1 }
            }
        }
        #expect(failures.withLock { $0 } == 0)
        let pending = try store.pending(app: nil)
        #expect(pending.count == 20)
        #expect(Set(pending.map { "\($0.app) \($0.request.identifier)" }).count == 20)
    }

    @Test func concurrentSubmissionsShareCommitsAndEachSeesTheOnesBefore() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        // 16 threads race 240 distinct processing submissions into one app, which Apple's rules
        // allow 10 of: however they are grouped, each decision must see every submission
        // committed or queued before it in its group, so exactly 10 are kept.
        let accepted = Mutex(0), rejected = Mutex(0)
        let manyIdentifiers = bundle(feed, permittingNumbered: 240)
        // 16 real threads (concurrentPerform runs only as many as there are cores, and on a
        // loaded two-core machine those may never overlap a commit), started together.
        let start = DispatchSemaphore(value: 0), done = DispatchGroup()
        for thread in 0..<16 {
            done.enter()
            Thread {
                defer { done.leave() }
                start.wait()
                for index in 0..<15 {
                    let request = processing("\(feed).t\(thread * 15 + index)")
                    let rejection = try? store.submit(app: feed, request: request, at: t0, rules: .init(app: manyIdentifiers))
                    if rejection == .some(nil) { accepted.withLock { $0 += 1 } } else { rejected.withLock { $0 += 1 } }
                }
            }.start()
        }
        for _ in 0..<16 { start.signal() }
        done.wait()
        #expect(accepted.withLock { $0 } == SubmissionRules.maximumPendingProcessing)
        #expect(rejected.withLock { $0 } == 240 - SubmissionRules.maximumPendingProcessing)
        #expect(try store.pending(app: feed).count == SubmissionRules.maximumPendingProcessing)
        let statistics = store.submissionStatistics
        #expect(statistics.writes == 240)
        // Group commit: submissions that arrive during a commit share the next one.
        #expect(statistics.commits < statistics.writes, "\(statistics)")
        #expect(statistics.largestGroup > 1, "\(statistics)")
    }

    @Test func aLaunchRecordedTwiceIsRefusedWholeAndTheWriterSyncsAgainAfter() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        try store.accept(refresh("\(feed).refresh"), app: feed)
        try store.accept(processing("\(feed).clean"), app: feed)
        try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([refresh("\(feed).refresh")]), at: t0)
        // The same id again, now taking the other request: the statement that finds the id
        // taken fails inside the transaction (BEGIN and COMMIT are cached statements), which
        // is rolled back whole: the second request stays pending.
        let error = expectStoreError {
            try store.beginLaunch(id: "L1", app: feed, reason: "scheduled", tasks: assignments([processing("\(feed).clean")]), at: t0)
        }
        #expect(error?.file == scratch.databasePath)
        #expect("\(error.map { "\($0)" } ?? "")".contains("already recorded"))
        #expect(try store.pending(app: feed).map(\.request.identifier) == ["\(feed).clean"])
        #expect(try store.launchIDs(app: feed) == ["L1"])
        let (inside, synchronous) = try store.pool.writeWithoutTransaction { db in
            (db.isInsideTransaction, try Int.fetchOne(db, sql: "PRAGMA synchronous"))
        }
        #expect(!inside)
        #expect(synchronous == 2, "the writer must be FULL again after a failed unsynced write")
        // And the next transaction on the same connection commits.
        try store.beginLaunch(id: "L2", app: feed, reason: "scheduled", tasks: assignments([processing("\(feed).clean")]), at: t0)
        #expect(try store.pending(app: feed).isEmpty)
    }

    @Test func aSubmissionIsVisibleBeforeItsSyncAndAcknowledgedOnlyAfter() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        // A disk that takes its time to sync: the scheduling pass (here, a read) may see the
        // request meanwhile, but the submitter hears nothing until the log is on disk.
        let syncing = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let syncs = Mutex(0)
        store.writeAheadLog.syncOverride = {
            syncs.withLock { $0 += 1 }
            syncing.signal()
            release.wait()
        }
        let visible = DispatchSemaphore(value: 0), returned = Mutex<Result<SubmissionRules.Rejection?, BGTaskError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            let outcome = store.submitAll([.init(app: feed, request: refresh("\(feed).refresh"), at: t0, rules: nil)],
                                          whenVisible: { visible.signal() })
            returned.withLock { $0 = outcome[0] }
            done.signal()
        }.start()
        #expect(visible.wait(timeout: .now() + 10) == .success, "whenVisible was not called")
        #expect(syncing.wait(timeout: .now() + 10) == .success, "the write-ahead log was not synced")
        // Committed and readable, not acknowledged.
        #expect(try store.pending(app: feed).map(\.request.identifier) == ["\(feed).refresh"])
        #expect(done.wait(timeout: .now() + 0.2) == .timedOut, "submitAll returned before the sync ended")
        #expect(returned.withLock { $0 } == nil)
        release.signal()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(try returned.withLock { $0 }?.get() == .some(nil))
        #expect(syncs.withLock { $0 } == 1)
    }

    @Test func aSubmissionWhoseSyncFailsIsNotAcknowledgedAndARejectionStaysOne() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let wal = store.writeAheadLog.path
        #expect(wal == scratch.databasePath + "-wal")
        store.writeAheadLog.syncOverride = { () throws(BGTaskError) in throw BGTaskError(.system, file: wal, "cannot sync the database's write-ahead log: Input/output error") }
        let visibleCalls = Mutex(0)
        // One accepted, one rejected by Apple's rules (an identifier the bundle does not permit):
        // the failed sync fails the first; the second is still a rejection, which is no write.
        let outcomes = store.submitAll([
            .init(app: feed, request: refresh("\(feed).refresh"), at: t0, rules: .init(app: bundle(feed))),
            .init(app: feed, request: refresh("\(feed).unlisted"), at: t0, rules: .init(app: bundle(feed))),
        ], whenVisible: { visibleCalls.withLock { $0 += 1 } })
        #expect(visibleCalls.withLock { $0 } == 1, "whenVisible is called for the accepted submission only")
        guard case .failure(let error) = outcomes[0] else {
            Issue.record("a submission whose sync failed was acknowledged: \(outcomes[0])")
            return
        }
        #expect(error.file == wal)
        #expect("\(error)".contains("write-ahead log"))
        guard case .success(let rejection?) = outcomes[1] else {
            Issue.record("the rejection became \(outcomes[1])")
            return
        }
        #expect(rejection.status == .notPermitted)
        // Once the disk syncs again, submissions are acknowledged again, through the real log.
        store.writeAheadLog.syncOverride = nil
        #expect(try store.submitChecked(refresh("\(feed).refresh"), app: feed) == nil)
    }

    @Test func aFailingSubmissionFailsAloneInItsGroup() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        // An app whose stored state cannot be decoded: its submissions fail with an error naming
        // the database; every other app's submissions, grouped with them or not, are kept.
        let queue = try DatabaseQueue(path: scratch.databasePath)
        try queue.write { db in
            try db.execute(sql: """
                INSERT INTO app_state (app, refresh_enabled, penalty_level, last_registered)
                VALUES ('com.example.broken', 1, 0, 'not json')
                """)
        }
        try queue.close()
        let errors = Mutex<[String]>([]), kept = Mutex(0)
        DispatchQueue.concurrentPerform(iterations: 40) { index in
            let app = index % 4 == 0 ? "com.example.broken" : "com.example.app\(index % 4)"
            do {
                // With rules, so that the app's state is read (and fails to decode).
                let rejection = try store.submit(
                    app: app, request: processing("\(app).t\(index)"), at: t0, rules: .init(app: bundle(app, permittingNumbered: 40)))
                if rejection == nil { kept.withLock { $0 += 1 } }
            } catch {
                errors.withLock { $0.append("\(error)") }
            }
        }
        #expect(kept.withLock { $0 } == 30)
        let messages = errors.withLock { $0 }
        #expect(messages.count == 10)
        #expect(messages.allSatisfy { $0.contains(scratch.databasePath) && $0.contains("submit com.example.broken.t") }, "\(messages)")
        #expect(try store.pending(app: "com.example.broken").isEmpty)
        #expect(try store.pending(app: nil).count == 30)
    }

    // MARK: App state and settings

    @Test func appStateDefaultsAndRoundTrips() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let fresh = try store.appState(feed)
        #expect(fresh == AppState(app: feed))
        #expect(fresh.refreshEnabled && fresh.penaltyLevel == 0 && fresh.penaltyUntil == nil && fresh.lastRegistered == nil)

        var state = AppState(app: feed)
        state.penaltyLevel = 3
        state.penaltyUntil = t0.addingTimeInterval(120)
        state.lastLaunchAt = t0
        state.lastLaunchID = "L7"
        state.lastRegistered = []
        try store.saveAppState(state)
        #expect(try store.appState(feed) == state)
        #expect(try store.appState(mail) == AppState(app: mail))

        state.penaltyLevel = 0
        state.penaltyUntil = nil
        state.refreshEnabled = false
        state.lastRegistered = ["\(feed).refresh"]
        try store.saveAppState(state)
        #expect(try store.appState(feed) == state)
    }

    @Test func appStatesReadEveryAppAtOnce() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        #expect(try store.appStates().isEmpty)
        var feedState = AppState(app: feed)
        feedState.penaltyLevel = 2
        feedState.penaltyUntil = t0.addingTimeInterval(60)
        feedState.lastLaunchAt = t0
        feedState.lastLaunchID = "L1"
        feedState.lastRegistered = ["\(feed).refresh"]
        var mailState = AppState(app: mail)
        mailState.refreshEnabled = false
        let others = (0..<(PendingRequestStore.inListSize + 3)).map { index in
            var state = AppState(app: "app\(index).x")
            state.penaltyLevel = index
            return state
        }
        for state in [feedState, mailState] + others { try store.saveAppState(state) }

        let all = try store.appStates()
        #expect(all.count == others.count + 2)
        #expect(all[feed] == feedState && all[mail] == mailState)
        #expect(others.allSatisfy { all[$0.app] == $0 })
        #expect(all.allSatisfy { (try? store.appState($0.key)) == $0.value })

        // Of some apps only (several statements past inListSize); never-saved apps are absent.
        #expect(try store.appStates(apps: [mail, "nobody.x"]) == [mail: mailState])
        #expect(try store.appStates(apps: []).isEmpty)
        #expect(try store.appStates(apps: others.map(\.app)) == Dictionary(uniqueKeysWithValues: others.map { ($0.app, $0) }))
        #expect(try store.plan("SELECT * FROM app_state WHERE app IN (?, ?)", [feed, mail])
                == ["SEARCH app_state USING INDEX sqlite_autoindex_app_state_1 (app=?)"])
    }

    @Test func settingsSetGetDelete() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        #expect(try store.setting("device.power") == nil)
        try store.setSetting("device.power", "external")
        try store.setSetting("device.network", "none")
        #expect(try store.setting("device.power") == "external")
        try store.setSetting("device.power", "battery")
        #expect(try store.setting("device.power") == "battery")
        try store.setSetting("device.power", nil)
        #expect(try store.setting("device.power") == nil)
        try store.setSetting("device.power", nil) // deleting nothing is fine
        #expect(try store.setting("device.network") == "none")
        try store.setSetting("empty", "")
        #expect(try store.setting("empty") == "")
    }
}

/// The host writes its launch bookkeeping in batches, one transaction per turn of its queue
/// (`beginLaunches`, `setLaunchPIDs`, `finishLaunches`); the plain reference is the same rows
/// written one launch at a time (`beginLaunch`, `setLaunchPID`, `finishLaunch`). Both leave the
/// same database (docs/decisions/batched-launch-bookkeeping.md).
@Suite struct BatchedBookkeepingEquivalenceTests {
    /// Every row of the tables launches touch, in a fixed order.
    static func rows(_ store: PendingRequestStore) throws -> [String] {
        try store.pool.read { db in
            var rows: [String] = []
            for (table, order) in [("launch", "id"), ("request", "app, identifier"), ("app_state", "app")] {
                for row in try Row.fetchAll(db, sql: "SELECT * FROM \(table) ORDER BY \(order)") {
                    rows.append("\(table): " + row.columnNames.map { "\($0)=\(row[$0] as DatabaseValue)" }.joined(separator: " "))
                }
            }
            return rows
        }
    }

    @Test func batchedLaunchRowsAreTheRowsWrittenOneAtATime() throws {
        let apps = (0..<12).map { "com.example.app\($0)" }
        var stores: [PendingRequestStore] = []
        var scratches: [StoreScratch] = []
        defer { scratches.forEach { $0.remove() } }
        for _ in 0..<2 {
            let scratch = try StoreScratch()
            scratches.append(scratch)
            let store = try scratch.open()
            for (index, app) in apps.enumerated() {
                #expect(try store.submit(app: app, request: refresh("\(app).refresh"), at: t0.addingTimeInterval(Double(index)), rules: nil) == nil)
                #expect(try store.submit(app: app, request: processing("\(app).clean"), at: t0, rules: nil) == nil)
            }
            stores.append(store)
        }
        let (single, batched) = (stores[0], stores[1])
        // Two turns of launches: the first ends with records (some of them host-lost), the
        // second stays running.
        let turns = [Array(apps.prefix(8)), Array(apps.suffix(4))]
        for (turn, turnApps) in turns.enumerated() {
            let begins = turnApps.enumerated().map { index, app in
                PendingRequestStore.LaunchBegin(id: "L\(turn)-\(index)", app: app, reason: "scheduled",
                                                tasks: assignments(index % 2 == 0 ? [refresh("\(app).refresh")] : [refresh("\(app).refresh"), processing("\(app).clean")]),
                                                at: t0.addingTimeInterval(Double(60 * turn + index)))
            }
            for begin in begins {
                try single.beginLaunch(id: begin.id, app: begin.app, reason: begin.reason, tasks: begin.tasks, at: begin.at)
            }
            try batched.beginLaunches(begins)
            let pids = begins.enumerated().map { (id: $0.element.id, pid: Int32(4000 + $0.offset)) }
            for (id, pid) in pids { try single.setLaunchPID(id: id, pid: pid) }
            try batched.setLaunchPIDs(pids)
            guard turn == 0 else { continue }
            let records = begins.enumerated().map { index, begin in
                runRecord(begin.id, app: begin.app, startedAt: begin.at, termination: index % 3 == 0 ? .hostLost : .exited,
                          tasks: begin.tasks.map { TaskRequest(kind: $0.kind, identifier: $0.identifier) })
            }
            let update: (RunRecord, inout AppState) -> Void = { record, state in
                state.lastLaunchAt = record.startedAt
                state.lastLaunchID = record.launchID
                if record.termination == .hostLost { state.penaltyLevel += 1 }
            }
            var prunedOneAtATime: [[String]] = []
            for record in records {
                prunedOneAtATime.append(try single.finishLaunch(record, keepHistory: 3) { update(record, &$0) })
            }
            #expect(try batched.finishLaunches(records, keepHistory: 3, updatingState: update) == prunedOneAtATime)
        }
        let (expected, found) = (try Self.rows(single), try Self.rows(batched))
        #expect(expected.count > 30, "\(expected)")
        #expect(found == expected)
        #expect(try batched.history(app: nil, limit: 50) == (try single.history(app: nil, limit: 50)))
    }
}

/// The scheduling pass's reads (`store-reads-by-index.md`) against their plain reference: an app
/// state decoded by column index from `appStateColumns` equals the same row decoded by column
/// name, and the pass's snapshot (its own read-only connection, by-index rows) reads what the
/// store's pool reads, for every shape of state the store writes.
@Suite struct StoreReadsByIndexEquivalenceTests {
    /// The plain reference: `SELECT *` and every field by its column's name.
    static func byName(_ db: Database, _ app: String) throws -> AppState? {
        guard let row = try Row.fetchOne(db, sql: "SELECT * FROM app_state WHERE app = ?", arguments: [app]) else { return nil }
        var state = AppState(app: row["app"])
        state.refreshEnabled = row["refresh_enabled"]
        state.penaltyLevel = row["penalty_level"]
        state.penaltyUntil = (row["penalty_until"] as Double?).map(Date.init(timeIntervalSince1970:))
        state.lastLaunchAt = (row["last_launch_at"] as Double?).map(Date.init(timeIntervalSince1970:))
        state.lastLaunchID = row["last_launch_id"]
        state.lastRegistered = try (row["last_registered"] as String?).map { try JSONDecoder().decode([String].self, from: Data($0.utf8)) }
        return state
    }

    @Test func anAppStateReadByIndexIsTheRowReadByName() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        // Every optional field absent and present, both switches, registered lists empty, one
        // identifier, several, and shared between apps (the decoded-list cache).
        var states: [AppState] = []
        for index in 0..<16 {
            var state = AppState(app: "com.example.app\(index)")
            state.refreshEnabled = index % 2 == 0
            state.penaltyLevel = index % 5
            state.penaltyUntil = index & 2 != 0 ? Date(timeIntervalSince1970: 1_700_000_000 + Double(index) * 60.5) : nil
            state.lastLaunchAt = index & 4 != 0 ? Date(timeIntervalSince1970: 1_700_000_000.25 + Double(index)) : nil
            state.lastLaunchID = index & 8 != 0 ? "L\(index)" : nil
            state.lastRegistered = [nil, [], ["\(state.app).refresh"], ["a.shared", "b.shared"]][index % 4]
            states.append(state)
            try store.saveAppState(state)
        }
        let byIndex = try store.appStates()
        let snapshot = try store.withSnapshot { snapshot throws(BGTaskError) in
            var read: [AppState] = []
            for state in states { read.append(try snapshot.appState(state.app)) }
            return read
        }
        try store.pool.read { db in
            for (position, state) in states.enumerated() {
                let reference = try #require(try Self.byName(db, state.app))
                #expect(reference == state, "the reference itself reads what was written")
                #expect(try PendingRequestStore.appState(db, state.app) == reference)
                #expect(byIndex[state.app] == reference)
                #expect(snapshot[position] == reference)
            }
            // An app never saved: no row by name, the default by index.
            #expect(try Self.byName(db, "com.example.absent") == nil)
            #expect(try PendingRequestStore.appState(db, "com.example.absent") == AppState(app: "com.example.absent"))
        }
    }

    @Test func theSnapshotReadsWhatThePoolReads() throws {
        let scratch = try StoreScratch()
        defer { scratch.remove() }
        let store = try scratch.open()
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        for index in 0..<6 {
            let app = "com.example.app\(index)"
            for kind in [TaskKind.refresh, .processing] {
                let request = TaskRequest(kind: kind, identifier: "\(app).\(kind.rawValue)",
                                          earliestBeginDate: index % 2 == 0 ? nil : now.timeIntervalSince1970 + Double(index) * 600,
                                          requiresNetworkConnectivity: index % 3 == 0, requiresExternalPower: kind == .processing)
                #expect(try store.submit(app: app, request: request, at: now, rules: nil) == nil)
            }
        }
        for at in [now, now.addingTimeInterval(1_500), now.addingTimeInterval(10_000)] {
            let (due, next, pendingAll, pendingOne) = try store.withSnapshot { snapshot throws(BGTaskError) in
                (try snapshot.dueApps(at: at), try snapshot.nextDueDate(after: at), try snapshot.pending(app: nil), try snapshot.pending(app: "com.example.app3"))
            }
            #expect(due == (try store.dueApps(at: at)))
            #expect(next == (try store.nextDueDate(after: at)))
            #expect(pendingAll == (try store.pending(app: nil)))
            #expect(pendingOne == (try store.pending(app: "com.example.app3")))
        }
    }
}

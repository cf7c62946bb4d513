import BGTaskWire
import Foundation

/// A request as the host keeps it.
public struct StoredRequest: Sendable, Equatable, Codable {
    public var app: String
    public var request: WireTaskRequest
    public var submittedAt: Date
    /// The launch running it now, or nil while it is pending.
    public var runningLaunch: String?

    public init(app: String, request: WireTaskRequest, submittedAt: Date, runningLaunch: String? = nil) {
        self.app = app
        self.request = request
        self.submittedAt = submittedAt
        self.runningLaunch = runningLaunch
    }

    /// `earliestBeginDate` as a Date (nil: due at once).
    public var earliest: Date? { request.earliestBeginDate.map(Date.init(timeIntervalSince1970:)) }
}

/// Per-app scheduling state.
public struct AppState: Sendable, Equatable, Codable {
    public var app: String
    /// The per-app Background App Refresh switch.
    public var refreshEnabled: Bool = true
    /// Consecutive bad launches (watchdog, jetsam, crashed, unfinished tasks); 0 after a clean one.
    public var penaltyLevel: Int = 0
    /// Launches wait until then (realistic policy).
    public var penaltyUntil: Date?
    public var lastLaunchAt: Date?
    public var lastLaunchID: String?
    /// Identifiers the last launch registered (nil before any launch).
    public var lastRegistered: [String]?

    public init(app: String) { self.app = app }
}

/// A launch that was running when the host stopped (found at startup).
public struct InterruptedLaunch: Sendable, Equatable {
    public var launchID: String
    public var app: String
    public var pid: Int32?
    public var reason: String
    public var startedAt: Date
    /// The task identifiers and kinds it was running.
    public var tasks: [TaskAssignment]
}

/// The host's durable state in one SQLite database (`STATE/bgtask.sqlite`, WAL mode): pending
/// requests, launches and their run records, per-app state, and settings (device overrides,
/// the virtual clock). Every write is durable when the call returns.
///
/// Thread-safe; any thread may call. Implemented with GRDB.
public final class PendingRequestStore: @unchecked Sendable {
    public let databaseURL: URL

    /// Opens (creating and migrating) the database in `directory`. A file that is not a
    /// database, or a directory that cannot be written, is a `BGTaskError` naming the file.
    public init(directory: URL) throws(BGTaskError) {
        fatalError("unimplemented")
    }

    // MARK: Requests

    /// Submits `request` for `app` in one transaction: `check` sees the app's current requests
    /// (pending and running) and may reject; otherwise the request replaces any *pending*
    /// request with the same identifier (a running one stays with its launch). Returns the
    /// rejection, or nil once the request is durable.
    public func submit(
        app: String, request: WireTaskRequest, at date: Date,
        check: ([WireTaskRequest]) -> SubmissionRules.Rejection?
    ) throws(BGTaskError) -> SubmissionRules.Rejection? {
        fatalError("unimplemented")
    }

    /// Cancels the pending request `identifier` of `app` (all of them for nil). Returns how
    /// many were removed.
    @discardableResult
    public func cancel(app: String, identifier: String?) throws(BGTaskError) -> Int { fatalError("unimplemented") }

    /// Requests not running, of `app` or of every app, oldest submission first.
    public func pending(app: String?) throws(BGTaskError) -> [StoredRequest] { fatalError("unimplemented") }

    /// The pending request with this identifier (identifiers are unique per app; for an
    /// identifier two apps share, the first by app name).
    public func pendingRequest(identifier: String) throws(BGTaskError) -> StoredRequest? { fatalError("unimplemented") }

    /// Apps that have a pending request due at `now` (earliest begin date nil or <= now).
    /// Indexed: never a scan of all requests.
    public func dueApps(at now: Date) throws(BGTaskError) -> [String] { fatalError("unimplemented") }

    /// The earliest begin date after `now` among pending requests (the next time the scheduler
    /// must look), or nil. Indexed.
    public func nextDueDate(after now: Date) throws(BGTaskError) -> Date? { fatalError("unimplemented") }

    /// Drops every pending request of `app` (its bundle was removed). Returns how many.
    @discardableResult
    public func removeApp(_ app: String) throws(BGTaskError) -> Int { fatalError("unimplemented") }

    // MARK: Launches

    /// Records a launch as running and marks the pending requests of `app` with identifiers in
    /// `tasks` as running in it. Durable before the child is started.
    public func beginLaunch(
        id: String, app: String, reason: String, tasks: [TaskAssignment], at date: Date
    ) throws(BGTaskError) { fatalError("unimplemented") }

    /// Remembers the runner's pid of a running launch (for cleanup after a host crash).
    public func setLaunchPID(id: String, pid: Int32) throws(BGTaskError) { fatalError("unimplemented") }

    /// Ends a launch: stores its record, deletes the requests it ran (those still marked with
    /// its id; resubmissions made during the launch are new pending rows and stay).
    public func finishLaunch(_ record: RunRecord) throws(BGTaskError) { fatalError("unimplemented") }

    /// Launches recorded as running: the host died during them.
    public func interruptedLaunches() throws(BGTaskError) -> [InterruptedLaunch] { fatalError("unimplemented") }

    /// Ends an interrupted launch with its `host-lost` record and makes its requests pending again.
    public func recoverInterruptedLaunch(_ record: RunRecord) throws(BGTaskError) { fatalError("unimplemented") }

    /// Run records, newest first, of `app` or of every app.
    public func history(app: String?, limit: Int) throws(BGTaskError) -> [RunRecord] { fatalError("unimplemented") }

    // MARK: App state and settings

    /// The app's state (a default one for an app never seen).
    public func appState(_ app: String) throws(BGTaskError) -> AppState { fatalError("unimplemented") }
    public func saveAppState(_ state: AppState) throws(BGTaskError) { fatalError("unimplemented") }

    /// Small named settings: device overrides, the virtual clock. nil deletes.
    public func setting(_ key: String) throws(BGTaskError) -> String? { fatalError("unimplemented") }
    public func setSetting(_ key: String, _ value: String?) throws(BGTaskError) { fatalError("unimplemented") }
}

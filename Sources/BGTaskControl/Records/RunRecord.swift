import BGTaskModel
import Foundation

/// What happened in one launch (the run record contract of DESIGN.md). Times are milliseconds
/// from launch start. `--json` prints it as one object with these snake_case keys.
public struct RunRecord: Codable, Sendable, Equatable {
    public enum Termination: String, Codable, Sendable {
        /// All tasks ended and the process left normally.
        case exited
        /// All tasks ended, the app finished its main queue's turn and its process was suspended
        /// (`--app-lifecycle ios`, the default): the app's next launch resumes it.
        case suspended
        /// Killed after the expiration grace period.
        case watchdog
        /// Killed over its memory limit.
        case jetsam
        /// Killed while it wrote, with its container's filesystem under the host's reserve
        /// (`--disk-reserve`): one app filling the disk cannot stop the host or other apps.
        case disk
        /// Killed while its app's containers (its own, its groups', its staging) held more than
        /// its disk quota (`--disk-quota`, `--disk-quota-inodes`); `disk` says how much.
        case diskQuota = "disk-quota"
        /// Killed for using more CPU than a background launch may (`--cpu-limit`, by default
        /// iOS's 80 % of a core over 60 s); `error` says how much it used.
        case cpuLimit = "cpu-limit"
        /// Died by a signal or exited abnormally (`signal`, `exit_status`, `error` say how).
        case crashed
        /// The bundle, dlopen, entry symbol, ABI or launch entry failed (`error` says which).
        case launchFailed = "launch-failed"
        /// The host died during the launch.
        case hostLost = "host-lost"
    }

    public enum Outcome: String, Codable, Sendable {
        /// Completed with success.
        case succeeded
        /// Completed without success (or by the system at expiry, having no expiration handler).
        case failed
        /// Its expiration handler ran and it completed after.
        case expired
        /// Never completed.
        case unfinished
        /// No launch handler was registered for it.
        case notRegistered = "not-registered"
    }

    public struct TaskRecord: Codable, Sendable, Equatable {
        public var identifier: String
        public var type: TaskKind
        public var outcome: Outcome
        /// Handler entered.
        public var startedMs: Double?
        /// `setTaskCompleted` called (or the system completed it).
        public var completedMs: Double?
        /// Expiration delivered.
        public var expiredMs: Double?
        /// False when expiry found no expiration handler and the system completed the task.
        public var expirationHandled: Bool?
        public var success: Bool?

        enum CodingKeys: String, CodingKey {
            case identifier, type, outcome, success
            case startedMs = "started_ms", completedMs = "completed_ms", expiredMs = "expired_ms"
            case expirationHandled = "expiration_handled"
        }

        /// The memberwise initializer, for the modules above this one.
        package init(identifier: String, type: TaskKind, outcome: Outcome, startedMs: Double? = nil, completedMs: Double? = nil, expiredMs: Double? = nil, expirationHandled: Bool? = nil, success: Bool? = nil) {
            self.identifier = identifier
            self.type = type
            self.outcome = outcome
            self.startedMs = startedMs
            self.completedMs = completedMs
            self.expiredMs = expiredMs
            self.expirationHandled = expirationHandled
            self.success = success
        }
    }

    /// A background-time assertion (`UIApplication.beginBackgroundTask`) and how it ended.
    public struct BackgroundTimeRecord: Codable, Sendable, Equatable {
        public enum Outcome: String, Codable, Sendable {
            /// Ended before the launch's time ran out.
            case ended
            /// Its expiration handler ran (the launch's time ran out) and it was ended after.
            case endedAfterExpiration = "ended-after-expiration"
            /// Never ended: the launch was killed with it held (or ended otherwise).
            case notEnded = "not-ended"
        }

        public var id: UInt64
        public var name: String?
        public var outcome: Outcome
        public var beganMs: Double
        public var endedMs: Double?
        /// Expiration delivered (the launch's time ran out while it was held).
        public var expiredMs: Double?
        /// False when it had no expiration handler.
        public var expirationHandled: Bool?

        enum CodingKeys: String, CodingKey {
            case id, name, outcome
            case beganMs = "began_ms", endedMs = "ended_ms", expiredMs = "expired_ms", expirationHandled = "expiration_handled"
        }

        /// The memberwise initializer, for the modules above this one.
        package init(id: UInt64, name: String? = nil, outcome: Outcome, beganMs: Double, endedMs: Double? = nil, expiredMs: Double? = nil, expirationHandled: Bool? = nil) {
            self.id = id
            self.name = name
            self.outcome = outcome
            self.beganMs = beganMs
            self.endedMs = endedMs
            self.expiredMs = expiredMs
            self.expirationHandled = expirationHandled
        }
    }

    public var app: String
    public var launchID: String
    public var reason: String
    public var tasks: [TaskRecord]
    public var termination: Termination
    public var signal: String?
    public var exitStatus: Int32?
    public var error: String?
    public var wallMs: Double
    public var cpuMs: Double
    public var peakRSSBytes: UInt64
    public var memoryLimitBytes: UInt64
    public var memoryMechanism: String
    /// The launch's process limit: its cgroup's `pids.max` (threads count too). Nil when it had
    /// none (no cgroup, or no pids controller for it).
    public var processLimit: Int? = nil
    public var budgetMs: Double
    public var graceMs: Double
    /// When expiration was sent to the launch (budget reached or simulated).
    public var expiredAtMs: Double?
    /// Why the host expired the launch, or one of its tasks, before its budget ran out
    /// (simulated, a condition lost, the device too hot); nil when it did not.
    public var expirationReason: String? = nil
    /// What the launch cost the device (nil: not measured, as in a record of a host that died).
    public var energy: EnergyRecord? = nil
    /// Notifications delivered while the app was in the foreground, and how its delegate
    /// presented each (`willPresent`: identifier → `banner, sound, list`, or `not shown`); nil: none.
    public var notificationsPresented: [String: String]? = nil
    /// The app took the MetricKit payloads its launch was offered (`metric_payloads`); nil: it
    /// was offered none, or did not take them.
    public var metricsDelivered: Bool? = nil
    public var pid: Int32
    public var startedAt: Date
    public var bundlePath: String
    /// The launch's log file: its stdout and stderr, and the host's lines about it (refused
    /// registrations, the plugin's `log` calls). Nil when the launch wrote nothing: no file is
    /// made for it.
    public var log: String?
    /// True when the log reached its limit (`--log-limit`, 16 MiB by default) and later output
    /// was read and discarded; `logBytesDropped` says how much.
    public var logTruncated: Bool? = nil
    public var logBytesDropped: UInt64? = nil
    /// Refused registrations and submissions past the first `InputLimits.recordListEntries`,
    /// counted rather than listed: no launch can make its record too large to answer.
    public var refusedRegistrationsOmitted: Int? = nil
    public var submittedOmitted: Int? = nil
    /// Entries left out of a list, by list (`registered`, `background_time`,
    /// `notifications_added`, `transfers_delivered`, and any list `fitToFrame` shortened):
    /// counted, never listed (nil: none left out).
    public var listEntriesOmitted: [String: Int]? = nil
    /// Messages of the launch's the host refused, by kind (`background_time_began` past the
    /// assertions one launch may hold, `registered` for an identifier the bundle does not
    /// permit, `progress` for a task the launch does not have); the launch's log says why,
    /// once per kind (nil: none).
    public var messagesRefused: [String: Int]? = nil
    /// App groups the bundle named that the launch did not get (group → why: the group is
    /// another app's, `AppGroupOwners`); nil: none refused.
    public var appGroupsRefused: [String: String]? = nil
    /// Identifiers whose handlers the launch registered, and those it was refused.
    public var registered: [String]
    public var refusedRegistrations: [String]
    /// Requests the app submitted during the launch.
    public var submitted: [TaskRequest]
    /// How the child was started: `zygote` (forked from the pre-warmed launcher) or `spawn`.
    public var launcher: String?
    /// The launch ran in the app's suspended process, resumed (nil: the host keeps no process
    /// between launches, `--app-lifecycle fresh`, or a `bgtask run`).
    public var resumed: Bool? = nil
    /// How long that process had been suspended before this launch resumed it.
    public var suspendedMs: Double? = nil
    /// Launches the process has run, this one included (1: a new process).
    public var processLaunches: Int? = nil
    /// Why the app's previous process ended while it was suspended (its eviction: jetsam, its
    /// death), for a launch that had to start a new one; nil when it did not.
    public var previousProcess: String? = nil
    /// The launch's confinement, layer by layer (`SandboxLayer.names`): applied, with what it
    /// is, or not, with why. Nil when the runner never reported it (it died first).
    public var sandbox: [String: SandboxLayer]? = nil
    /// Background-time assertions the app took, in order (nil: none).
    public var backgroundTime: [BackgroundTimeRecord]? = nil
    /// The push a `remote-notification` launch delivered, and what its handler made of it.
    public var push: PushRecord? = nil

    public struct PushRecord: Codable, Sendable, Equatable {
        /// The apns-id.
        public var id: String
        public var receivedAt: Date
        /// From receipt to the launch's start.
        public var deliveredAfterMs: Double
        /// What the app's completion handler was called with (`new-data`, `no-data`, `failed`),
        /// nil when it was never called.
        public var result: String?
        /// When the completion handler was called (ms from launch start).
        public var completedMs: Double?

        enum CodingKeys: String, CodingKey {
            case id, result
            case receivedAt = "received_at", deliveredAfterMs = "delivered_after_ms", completedMs = "completed_ms"
        }

        /// The memberwise initializer, for the modules above this one.
        package init(id: String, receivedAt: Date, deliveredAfterMs: Double, result: String? = nil, completedMs: Double? = nil) {
            self.id = id
            self.receivedAt = receivedAt
            self.deliveredAfterMs = deliveredAfterMs
            self.result = result
            self.completedMs = completedMs
        }
    }
    /// Identifiers of the local notifications the app added (`UNUserNotificationCenter.add`),
    /// at most `InputLimits.recordListEntries` (nil: none).
    public var notificationsAdded: [String]? = nil
    /// Background URL sessions: the transfers the app was told of in the launch, and for a
    /// `background-transfer` launch the sessions it was launched for (nil: none).
    public var transfers: TransfersRecord? = nil
    /// The app's disk use against its quota, and a launch log the disk could not keep (nil:
    /// no quota and nothing lost).
    public var disk: DiskRecord? = nil

    public struct DiskRecord: Codable, Sendable, Equatable {
        /// What the app's containers and staging held at the launch's end (or at its refusal),
        /// allocated bytes and files; nil when not measured.
        public var bytes: UInt64?
        public var inodes: UInt64?
        /// The quota (0: none of that kind).
        public var quotaBytes: UInt64
        public var quotaInodes: UInt64
        /// How the quota is enforced: `accounting (...)`, with what the filesystem offers.
        public var enforcement: String?
        /// Why the app was over its quota: the launch was refused (`launch-failed`) or killed
        /// (`disk-quota`). Nil when it was not.
        public var exceeded: String?
        /// The launch's log could not be written (the disk or its inodes were full): what was
        /// lost, and why.
        public var logError: String?

        public init(bytes: UInt64? = nil, inodes: UInt64? = nil, quotaBytes: UInt64 = 0, quotaInodes: UInt64 = 0,
                    enforcement: String? = nil, exceeded: String? = nil, logError: String? = nil) {
            self.bytes = bytes
            self.inodes = inodes
            self.quotaBytes = quotaBytes
            self.quotaInodes = quotaInodes
            self.enforcement = enforcement
            self.exceeded = exceeded
            self.logError = logError
        }

        enum CodingKeys: String, CodingKey {
            case bytes, inodes, enforcement, exceeded
            case quotaBytes = "quota_bytes", quotaInodes = "quota_inodes", logError = "log_error"
        }
    }

    public struct TransfersRecord: Codable, Sendable, Equatable {
        /// Transfer ids delivered (`delivered` calls), at most `InputLimits.recordListEntries`.
        public var delivered: [String]
        public var sessions: [String]?
        public init(delivered: [String], sessions: [String]? = nil) {
            self.delivered = delivered
            self.sessions = sessions
        }
    }

    enum CodingKeys: String, CodingKey {
        case app, reason, tasks, termination, signal, error, pid, log, registered, submitted
        case logTruncated = "log_truncated", logBytesDropped = "log_bytes_dropped"
        case refusedRegistrationsOmitted = "refused_registrations_omitted", submittedOmitted = "submitted_omitted"
        case launchID = "launch_id", exitStatus = "exit_status", wallMs = "wall_ms", cpuMs = "cpu_ms"
        case peakRSSBytes = "peak_rss_bytes", memoryLimitBytes = "memory_limit_bytes"
        case memoryMechanism = "memory_mechanism", processLimit = "process_limit", budgetMs = "budget_ms", graceMs = "grace_ms"
        case expiredAtMs = "expired_at_ms", startedAt = "started_at", bundlePath = "bundle_path"
        case expirationReason = "expiration_reason", energy, notificationsPresented = "notifications_presented"
        case metricsDelivered = "metrics_delivered"
        case refusedRegistrations = "refused_registrations", launcher, sandbox, backgroundTime = "background_time", push
        case notificationsAdded = "notifications_added", transfers, disk
        case listEntriesOmitted = "list_entries_omitted", messagesRefused = "messages_refused"
        case appGroupsRefused = "app_groups_refused"
        case resumed, suspendedMs = "suspended_ms", processLaunches = "process_launches", previousProcess = "previous_process"
    }

    /// The most a record's JSON may be: a quarter of a control frame
    /// (`ControlFrame.maximumPayload`), so that one always fits an answer with room for the
    /// answer's own fields, and a `history` page holds several.
    public static let maximumBytes = ControlFrame.maximumPayload / 4
    /// The most bytes of an error the record keeps (the child's words can be longer).
    public static let maximumErrorBytes = 16 * 1024

    /// Makes the record fit `maximumBytes`: its error cut to `maximumErrorBytes`, then, while
    /// its JSON is larger, the longest list halved, what was cut counted in
    /// `listEntriesOmitted` (or the list's own `..._omitted`). A record with its lists already
    /// bounded (`InputLimits.recordListEntries` each) fits unless its entries are unusually
    /// long; this is the guarantee, not the usual path (one encoding, no change).
    public mutating func fitToFrame() {
        if let error, error.utf8.count > Self.maximumErrorBytes {
            self.error = Self.bounded(error, Self.maximumErrorBytes) + " (cut at \(Self.maximumErrorBytes) bytes)"
        }
        func size() -> Int { RecordJSON.record(self)?.utf8.count ?? ((try? jsonData())?.count ?? 0) }
        var attempts = 0
        while size() > Self.maximumBytes, attempts < 64 {
            attempts += 1
            let lengths: [(String, Int)] = [
                ("registered", registered.count), ("refused_registrations", refusedRegistrations.count),
                ("submitted", submitted.count), ("background_time", backgroundTime?.count ?? 0),
                ("notifications_added", notificationsAdded?.count ?? 0), ("transfers_delivered", transfers?.delivered.count ?? 0),
                ("tasks", tasks.count),
            ]
            guard let (list, count) = lengths.max(by: { $0.1 < $1.1 }), count > 0 else { break }
            let kept = count / 2
            let cut = count - kept
            switch list {
            case "registered": registered.removeLast(cut)
            case "refused_registrations":
                refusedRegistrations.removeLast(cut)
                refusedRegistrationsOmitted = (refusedRegistrationsOmitted ?? 0) + cut
                continue
            case "submitted":
                submitted.removeLast(cut)
                submittedOmitted = (submittedOmitted ?? 0) + cut
                continue
            case "background_time": backgroundTime?.removeLast(cut)
            case "notifications_added": notificationsAdded?.removeLast(cut)
            case "transfers_delivered": transfers?.delivered.removeLast(cut)
            default: tasks.removeLast(cut)
            }
            listEntriesOmitted = listEntriesOmitted ?? [:]
            listEntriesOmitted![list, default: 0] += cut
        }
    }

    /// True when every task succeeded and the process ended normally (an extension's launch,
    /// which has no tasks, succeeds when it ends normally).
    public var succeeded: Bool {
        (termination == .exited || termination == .suspended) && tasks.allSatisfy { $0.outcome == .succeeded }
    }

    public func jsonData(pretty: Bool = false) throws -> Data {
        let encoder = JSONEncoder()
        // A submitted refresh request has no strategy: list only what its kind has.
        encoder.userInfo[TaskRequest.omitsInapplicableFields] = true
        // ISO 8601 with milliseconds: a record read back equals the one written.
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(Self.iso8601(date))
        }
        encoder.outputFormatting = pretty ? [.prettyPrinted, .sortedKeys] : [.sortedKeys]
        return try encoder.encode(self)
    }

    public static func decode(_ data: Data) throws -> RunRecord {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            guard let date = dateFormatter(fractional: true).date(from: text) ?? dateFormatter(fractional: false).date(from: text) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "not an ISO 8601 date: \(text)")
            }
            return date
        }
        return try decoder.decode(RunRecord.self, from: data)
    }

    /// `date` in ISO 8601, UTC, to the nearest millisecond (`2026-11-24T02:35:00.123Z`): what
    /// `dateFormatter(fractional: true)` writes (RunRecordTests compares them), without making
    /// an ISO8601DateFormatter, whose ICU formatter cost more than the rest of a record's
    /// encoding: 12 % of the host's CPU while launches ended back to back.
    package static func iso8601(_ date: Date) -> String {
        let milliseconds = (date.timeIntervalSince1970 * 1000).rounded()
        let whole = (milliseconds / 1000).rounded(.down)
        // Years 1 to 9999 (and no NaN) here; the formatter says what it says of the rest.
        guard (-62_135_596_800...253_402_300_799).contains(whole) else { return dateFormatter(fractional: true).string(from: date) }
        var seconds = time_t(whole)
        let fraction = Int(milliseconds - whole * 1000)
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil else { return dateFormatter(fractional: true).string(from: date) }
        func padded(_ value: Int32, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return "\(padded(parts.tm_year + 1900, 4))-\(padded(parts.tm_mon + 1, 2))-\(padded(parts.tm_mday, 2))"
            + "T\(padded(parts.tm_hour, 2)):\(padded(parts.tm_min, 2)):\(padded(parts.tm_sec, 2)).\(padded(Int32(fraction), 3))Z"
    }

    package static func dateFormatter(fractional: Bool) -> ISO8601DateFormatter {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = fractional ? [.withInternetDateTime, .withFractionalSeconds] : [.withInternetDateTime]
        return formatter
    }

    /// The memberwise initializer, for the modules above this one.
    package init(app: String, launchID: String, reason: String, tasks: [TaskRecord], termination: Termination, signal: String? = nil, exitStatus: Int32? = nil, error: String? = nil, wallMs: Double, cpuMs: Double, peakRSSBytes: UInt64, memoryLimitBytes: UInt64, memoryMechanism: String, processLimit: Int? = nil, budgetMs: Double, graceMs: Double, expiredAtMs: Double? = nil, pid: Int32, startedAt: Date, bundlePath: String, log: String? = nil, logTruncated: Bool? = nil, logBytesDropped: UInt64? = nil, refusedRegistrationsOmitted: Int? = nil, submittedOmitted: Int? = nil, listEntriesOmitted: [String: Int]? = nil, messagesRefused: [String: Int]? = nil, appGroupsRefused: [String: String]? = nil, registered: [String], refusedRegistrations: [String], submitted: [TaskRequest], launcher: String? = nil, resumed: Bool? = nil, suspendedMs: Double? = nil, processLaunches: Int? = nil, previousProcess: String? = nil, sandbox: [String: SandboxLayer]? = nil, backgroundTime: [BackgroundTimeRecord]? = nil, push: PushRecord? = nil, notificationsAdded: [String]? = nil, transfers: TransfersRecord? = nil, disk: DiskRecord? = nil) {
        self.app = app
        self.launchID = launchID
        self.reason = reason
        self.tasks = tasks
        self.termination = termination
        self.signal = signal
        self.exitStatus = exitStatus
        self.error = error
        self.wallMs = wallMs
        self.cpuMs = cpuMs
        self.peakRSSBytes = peakRSSBytes
        self.memoryLimitBytes = memoryLimitBytes
        self.memoryMechanism = memoryMechanism
        self.processLimit = processLimit
        self.budgetMs = budgetMs
        self.graceMs = graceMs
        self.expiredAtMs = expiredAtMs
        self.pid = pid
        self.startedAt = startedAt
        self.bundlePath = bundlePath
        self.log = log
        self.logTruncated = logTruncated
        self.logBytesDropped = logBytesDropped
        self.refusedRegistrationsOmitted = refusedRegistrationsOmitted
        self.submittedOmitted = submittedOmitted
        self.listEntriesOmitted = listEntriesOmitted
        self.messagesRefused = messagesRefused
        self.appGroupsRefused = appGroupsRefused
        self.registered = registered
        self.refusedRegistrations = refusedRegistrations
        self.submitted = submitted
        self.launcher = launcher
        self.resumed = resumed
        self.suspendedMs = suspendedMs
        self.processLaunches = processLaunches
        self.previousProcess = previousProcess
        self.sandbox = sandbox
        self.backgroundTime = backgroundTime
        self.push = push
        self.notificationsAdded = notificationsAdded
        self.transfers = transfers
        self.disk = disk
    }
}

extension RunRecord: CustomStringConvertible {
    /// A few lines for people: what ran, how it ended, why.
    public var description: String {
        var lines: [String] = []
        var how = termination.rawValue
        if let signal { how += " (\(signal))" }
        if let exitStatus, termination != .exited, termination != .suspended { how += " (exit status \(exitStatus))" }
        lines.append("launch \(launchID) of \(app) (\(reason)): \(how) after \(Self.ms(wallMs))")
        if let error { lines.append("  error: \(error)") }
        if let expirationReason { lines.append("  expired early: \(expirationReason)") }
        if resumed == true {
            lines.append("  resumed the app's process after \(DurationText.format(seconds: (suspendedMs ?? 0) / 1000)) suspended (its launch \(processLaunches ?? 0))")
        } else if let previousProcess {
            lines.append("  a new process: the previous one ended while suspended: \(previousProcess)")
        }
        for task in tasks {
            var times: [String] = []
            if let t = task.startedMs { times.append("started \(Self.ms(t))") }
            if let t = task.expiredMs { times.append("expired \(Self.ms(t))\(task.expirationHandled == false ? " (no expiration handler)" : "")") }
            if let t = task.completedMs { times.append("completed \(Self.ms(t))") }
            lines.append("  \(task.identifier) [\(task.type.rawValue)] \(task.outcome.rawValue)\(times.isEmpty ? "" : ": " + times.joined(separator: ", "))")
        }
        if let push {
            let completion = push.result.map { "completion handler: \($0) at \(Self.ms(push.completedMs ?? 0))" } ?? "completion handler never called"
            lines.append("  push \(push.id), delivered \(Self.ms(push.deliveredAfterMs)) after it was received: \(completion)")
        }
        for assertion in backgroundTime ?? [] {
            var times = ["began \(Self.ms(assertion.beganMs))"]
            if let t = assertion.expiredMs { times.append("expired \(Self.ms(t))\(assertion.expirationHandled == false ? " (no expiration handler)" : "")") }
            if let t = assertion.endedMs { times.append("ended \(Self.ms(t))") }
            lines.append("  background time \(assertion.name.map { "'\($0)'" } ?? "#\(assertion.id)") \(assertion.outcome.rawValue): \(times.joined(separator: ", "))")
        }
        let limit = memoryLimitBytes > 0 ? " of \(Self.mib(memoryLimitBytes)) (\(memoryMechanism))" : ""
        lines.append("  cpu \(Self.ms(cpuMs)), peak rss \(Self.mib(peakRSSBytes))\(limit), budget \(DurationText.format(seconds: budgetMs / 1000)) + grace \(DurationText.format(seconds: graceMs / 1000)), pid \(pid)")
        if let processLimit { lines.append("  processes: at most \(processLimit) (pids.max)") }
        if let energy {
            lines.append("  energy: \(energy.wakeups) wake-ups, \(Self.bytesText(energy.diskWrittenBytes)) written, \(Self.bytesText(energy.diskReadBytes)) read from storage\(energy.networkText); cpu limit \(energy.cpuLimit ?? "none")")
        }
        if !refusedRegistrations.isEmpty { lines.append("  refused registrations: \(refusedRegistrations.joined(separator: ", "))") }
        if let omitted = refusedRegistrationsOmitted { lines.append("  refused registrations: \(omitted) more, not listed") }
        if let refused = appGroupsRefused {
            for group in refused.keys.sorted() { lines.append("  app group refused: \(refused[group]!)") }
        }
        if let omitted = listEntriesOmitted {
            lines.append("  left out of the record's lists: " + omitted.keys.sorted().map { "\($0) \(omitted[$0]!)" }.joined(separator: ", "))
        }
        if let refused = messagesRefused {
            lines.append("  messages refused: " + refused.keys.sorted().map { "\($0) \(refused[$0]!)" }.joined(separator: ", "))
        }
        for request in submitted { lines.append("  submitted \(request.kind.rawValue) \(request.identifier)") }
        if let omitted = submittedOmitted { lines.append("  submitted: \(omitted) more, not listed") }
        if let added = notificationsAdded { lines.append("  notifications added: \(added.joined(separator: ", "))") }
        if let presented = notificationsPresented {
            lines.append("  notifications presented in the foreground: " + presented.keys.sorted().map { "\($0) (\(presented[$0]!))" }.joined(separator: ", "))
        }
        if let transfers {
            if let sessions = transfers.sessions { lines.append("  launched for background sessions: \(sessions.joined(separator: ", "))") }
            if !transfers.delivered.isEmpty { lines.append("  transfers delivered: \(transfers.delivered.joined(separator: ", "))") }
        }
        if let sandbox {
            let applied = SandboxLayer.names.filter { sandbox[$0]?.applied == true }
            let missing = SandboxLayer.names.filter { sandbox[$0]?.applied == false }
            var text = "  sandbox: " + (applied.isEmpty ? "none" : applied.map { "\($0) (\(sandbox[$0]!.detail))" }.joined(separator: ", "))
            if !missing.isEmpty { text += "; without " + missing.map { "\($0): \(sandbox[$0]!.detail)" }.joined(separator: "; ") }
            lines.append(text)
        }
        if let disk {
            if let bytes = disk.bytes {
                let quota = disk.quotaBytes > 0 || disk.quotaInodes > 0
                    ? " of a quota of \(disk.quotaBytes > 0 ? Self.mib(disk.quotaBytes) : "no limit") and \(disk.quotaInodes > 0 ? "\(disk.quotaInodes)" : "no limit of") files"
                    : ""
                lines.append("  disk: \(Self.mib(bytes)) in \(disk.inodes ?? 0) files\(quota)\(disk.enforcement.map { ", by \($0)" } ?? "")")
            }
            if let exceeded = disk.exceeded { lines.append("  over its disk quota: \(exceeded)") }
        }
        lines.append("  log: \(log ?? "none (the launch wrote nothing)")")
        if let lost = disk?.logError { lines.append("  log lost: \(lost)") }
        if logTruncated == true { lines.append("  log truncated: \(logBytesDropped ?? 0) bytes past its limit were discarded") }
        return lines.joined(separator: "\n")
    }

    package static func ms(_ value: Double) -> String {
        value >= 10_000 ? String(format: "%.1f s", value / 1000) : String(format: "%.0f ms", value)
    }

    package static func mib(_ bytes: UInt64) -> String { String(format: "%.1f MiB", Double(bytes) / 1_048_576) }
    /// UNNotificationPresentationOptions' bits as the record names them.
    package static func presentationText(_ options: UInt32) -> String {
        let names = [(16, "banner"), (4, "alert"), (8, "list"), (2, "sound"), (1, "badge")].filter { options & UInt32($0.0) != 0 }.map(\.1)
        return names.isEmpty ? "not shown" : names.joined(separator: ", ")
    }

    /// Bytes for people: "512 B", "12.0 KiB", "3.4 MiB".
    package static func bytesText(_ bytes: UInt64) -> String {
        bytes < 1024 ? "\(bytes) B" : bytes < 1_048_576 ? String(format: "%.1f KiB", Double(bytes) / 1024) : mib(bytes)
    }
}

extension RunRecord {
    /// `text` cut to at most `bytes` UTF-8 bytes (at a character's boundary).
    package static func bounded(_ text: String, _ bytes: Int) -> String {
        guard text.utf8.count > bytes else { return text }
        var cut = ""
        for character in text {
            if cut.utf8.count + character.utf8.count > bytes { break }
            cut.append(character)
        }
        return cut
    }


    /// The record of a launch that was running when its host died: its tasks never reported
    /// an end, so they are unfinished (and their requests pending again).
    public static func hostLost(_ launch: InterruptedLaunch, bundlePath: String, log: String?, detail: String) -> RunRecord {
        RunRecord(
            app: launch.app, launchID: launch.launchID, reason: launch.reason,
            tasks: launch.tasks.map { TaskRecord(identifier: $0.identifier, type: $0.kind, outcome: .unfinished) },
            termination: .hostLost, signal: nil, exitStatus: nil, error: detail,
            wallMs: 0, cpuMs: 0, peakRSSBytes: 0, memoryLimitBytes: 0, memoryMechanism: "sampler",
            budgetMs: 0, graceMs: 0, expiredAtMs: nil, pid: launch.pid ?? 0, startedAt: launch.startedAt,
            bundlePath: bundlePath, log: log, registered: [], refusedRegistrations: [], submitted: [])
    }
}

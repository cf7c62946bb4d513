import BGTaskModel
import Foundation

/// How eagerly the host launches eligible work.
public enum SchedulingPolicy: String, Sendable, Codable, CaseIterable {
    /// Run as soon as a request is due and its conditions hold: for development and tests.
    case immediate
    /// In the spirit of iOS: refresh launches of an app at most every `refreshInterval`, and
    /// penalties that lengthen the wait after launches that end badly.
    case realistic

    /// Realistic: the shortest time between two launches of one app for refresh work.
    public static let refreshInterval: TimeInterval = 15 * 60
    /// Realistic: the first penalty; each further bad launch in a row doubles it.
    public static let basePenalty: TimeInterval = 30 * 60
    public static let maximumPenalty: TimeInterval = 24 * 60 * 60

    /// The penalty after `level` bad launches in a row (level ≥ 1).
    public static func penalty(level: Int) -> TimeInterval {
        min(maximumPenalty, basePenalty * pow(2, Double(max(0, level - 1))))
    }

    /// True when a launch ended in a way that earns a penalty.
    public static func isBad(_ record: RunRecord) -> Bool {
        switch record.termination {
        case .watchdog, .jetsam, .disk, .diskQuota, .cpuLimit, .crashed: return true
        case .exited, .suspended, .launchFailed, .hostLost: return record.tasks.contains { $0.outcome == .unfinished }
        }
    }
}

/// How much background use of the device a day the realistic policy allows an app before it
/// schedules it less ("excessive background battery drain leads to reduced scheduling"): its
/// background launches' CPU time, and its writes to storage, summed over the day on the host's
/// clock. The disk figure is iOS's own limit (its disk-writes reports: 1 GiB of file-backed
/// memory dirtied over 24 hours); the CPU one is bgtask's, a tenth of iOS's per-launch CPU
/// monitor run for ten minutes. Past either, for the rest of that day, the app's refresh
/// launches come at most every `excessRefreshInterval` and its processing tasks wait for the
/// next day.
public enum EnergyBudget {
    public static let dailyBackgroundCPUSeconds: Double = 10 * 60
    public static let dailyDiskWriteBytes: UInt64 = 1 << 30
    public static let excessRefreshInterval: TimeInterval = 60 * 60

    /// Why a day's use is excessive, or nil when it is not.
    public static func excess(cpuMs: Double, diskWrittenBytes: UInt64) -> String? {
        if cpuMs / 1000 > dailyBackgroundCPUSeconds {
            return "used \(DurationText.format(seconds: (cpuMs / 1000).rounded())) of background CPU that day, over the \(DurationText.format(seconds: dailyBackgroundCPUSeconds)) a day allows"
        }
        if diskWrittenBytes > dailyDiskWriteBytes {
            return "wrote \(RunRecord.mib(diskWrittenBytes)) to storage that day, over the \(RunRecord.mib(dailyDiskWriteBytes)) a day allows"
        }
        return nil
    }

    /// Midnight UTC of `date`'s day: the days energy is summed over.
    public static func day(of date: Date) -> Date {
        Date(timeIntervalSince1970: (date.timeIntervalSince1970 / 86_400).rounded(.down) * 86_400)
    }
}

/// One reason a request is not running now. `code` is stable (scripts match on it); `message`
/// is for people.
public struct Blocker: Sendable, Equatable, Codable {
    public var code: String
    public var message: String
    /// When the blocker lifts by itself, if it does.
    public var until: Date?
    /// False for notes that do not hold the request back (a handler never registered).
    public var blocking: Bool

    public init(_ code: BlockerCode, _ message: String, until: Date? = nil, blocking: Bool = true) {
        self.code = code.rawValue
        self.message = message
        self.until = until
        self.blocking = blocking
    }

    /// The code, when it is one this host knows (a newer host may send others).
    public var knownCode: BlockerCode? { BlockerCode(rawValue: code) }
}

/// Why a request is not running, defined once (stable: `bgtask why --json` readers match on
/// them). A blocker keeps its code as a string on the wire.
public enum BlockerCode: String, CaseIterable, Sendable {
    case appMissing = "app-missing"
    case notDue = "not-due"
    case refreshDisabled = "refresh-disabled"
    case appRefreshDisabled = "app-refresh-disabled"
    case lowPowerMode = "low-power-mode"
    case deviceNotIdle = "device-not-idle"
    case noExternalPower = "no-external-power"
    case noNetwork = "no-network"
    case dataProtected = "data-protected"
    case penalty
    case rateLimit = "rate-limit"
    case appRunning = "app-running"
    case concurrency
    /// Not blocking: a note that the app's last launch did not register the handler.
    case handlerNotRegistered = "handler-not-registered"
    /// The app's last launch was refused: its containers hold more than its disk quota. It is
    /// measured again when the refusal's pause ends.
    case diskQuota = "disk-quota"
    /// The app's last launch could not be started (not its fault: the host's); retried after
    /// a pause.
    case startFailed = "start-failed"
    /// The device runs hot: nothing is launched at critical; processing work waits at serious
    /// (realistic policy).
    case thermalState = "thermal-state"
    /// The app's background use today is excessive (`EnergyBudget`): refresh comes less often,
    /// processing waits for tomorrow (realistic policy).
    case energy
    /// The app's usage pattern (`UsagePrediction`): its refresh waits until shortly before its
    /// next predicted use, or, never opened, runs seldom (realistic policy). Also a note (not
    /// blocking) with the prediction when the refresh may run now.
    case usage

    /// Lifts when the machine's power or network comes back, which the host learns only by
    /// looking again (it re-reads device conditions while such a request waits).
    package var liftsWithDeviceConditions: Bool { self == .noExternalPower || self == .noNetwork || self == .thermalState }
}

/// Decides, for one request, everything that holds it back. A pure function of its inputs, so
/// `bgtask why` and the scheduler can never disagree.
public struct Eligibility: Sendable {
    public var policy: SchedulingPolicy
    public var now: Date
    public var conditions: DeviceConditions
    public var runningLaunches: Int
    public var maximumConcurrentLaunches: Int

    public init(policy: SchedulingPolicy, now: Date, conditions: DeviceConditions, runningLaunches: Int, maximumConcurrentLaunches: Int) {
        self.policy = policy
        self.now = now
        self.conditions = conditions
        self.runningLaunches = runningLaunches
        self.maximumConcurrentLaunches = maximumConcurrentLaunches
    }

    public func blockers(for stored: StoredRequest, app: PluginBundle?, state: AppState, appRunning: Bool) -> [Blocker] {
        var result: [Blocker] = []
        let request = stored.request
        if app == nil {
            result.append(Blocker(.appMissing, "no valid bundle with identifier \(stored.app) is in the plugin directory"))
        }
        if let earliest = stored.earliest, earliest > now {
            result.append(Blocker(.notDue, "not yet due: earliestBeginDate is \(Self.format(earliest)), \(Self.format(earliest.timeIntervalSince(now))) from now", until: earliest))
        }
        switch request.kind {
        case .refresh:
            if !conditions.backgroundRefresh {
                result.append(Blocker(.refreshDisabled, "Background App Refresh is off for the device (bgtask device --refresh on)"))
            }
            if !state.refreshEnabled {
                result.append(Blocker(.appRefreshDisabled, "Background App Refresh is off for \(stored.app) (bgtask device --app \(stored.app) --refresh on)"))
            }
            if conditions.lowPowerMode {
                result.append(Blocker(.lowPowerMode, "Low Power Mode is on: refresh tasks do not run (bgtask device --low-power off)"))
            }
        case .processing, .healthResearch:
            if !conditions.idle {
                result.append(Blocker(.deviceNotIdle, "processing tasks run only while the device is idle (bgtask device --idle on)"))
            }
            if request.requiresExternalPower && !conditions.externalPower {
                result.append(Blocker(.noExternalPower, "requires external power, and the device is on battery (\(conditions.sources["externalPower"] ?? "machine"))"))
            }
            if request.requiresNetworkConnectivity && !conditions.network {
                result.append(Blocker(.noNetwork, "requires network connectivity, and there is no default route (\(conditions.sources["network"] ?? "machine"))"))
            }
            if request.kind == .healthResearch {
                switch request.protectionType {
                case 1 where conditions.locked, 2 where conditions.locked:
                    result.append(Blocker(.dataProtected, "its data (protection \(request.protectionType == 1 ? "complete" : "completeUnlessOpen")) is unavailable while the device is locked (bgtask device --locked off)"))
                case 3 where !conditions.unlockedSinceBoot:
                    result.append(Blocker(.dataProtected, "its data (completeUntilFirstUserAuthentication) is unavailable until the device is unlocked once after boot"))
                default: break
                }
            }
        case .continuedProcessing:
            break
        }
        let thermal = conditions.thermalState
        let thermalSource = conditions.sources["thermalState"] ?? "machine"
        if thermal == .critical {
            // As iOS: a device this hot runs no background work at all, whatever the policy.
            result.append(Blocker(.thermalState, "the device's thermal state is critical (\(thermalSource)): nothing is launched until it cools to serious or below (bgtask device --thermal auto)"))
        } else if thermal == .serious && policy == .realistic && request.kind.isProcessing {
            result.append(Blocker(.thermalState, "the device's thermal state is serious (\(thermalSource)): processing work waits until it cools to fair or below (bgtask device --thermal auto)"))
        }
        if policy == .realistic {
            if let until = state.penaltyUntil, until > now {
                result.append(Blocker(.penalty, "\(stored.app) is penalized after \(state.penaltyLevel) bad launch(es) in a row (watchdog, jetsam, crash or unfinished tasks) until \(Self.format(until))", until: until))
            }
            let today = EnergyBudget.day(of: now)
            let excessive = state.energyExcessDay == today ? state.energyExcess : nil
            let tomorrow = today.addingTimeInterval(86_400)
            if let excessive, request.kind.isProcessing {
                result.append(Blocker(.energy, "\(stored.app) \(excessive): its processing tasks wait until the day ends (\(Self.format(tomorrow)))", until: tomorrow))
            }
            if request.kind == .refresh, let last = state.lastLaunchAt {
                let interval = excessive == nil ? SchedulingPolicy.refreshInterval : EnergyBudget.excessRefreshInterval
                let until = min(last.addingTimeInterval(interval), excessive == nil ? .distantFuture : max(tomorrow, last.addingTimeInterval(SchedulingPolicy.refreshInterval)))
                if until > now {
                    if let excessive, last.addingTimeInterval(SchedulingPolicy.refreshInterval) <= now {
                        result.append(Blocker(.energy, "\(stored.app) \(excessive): its refresh launches are at most every \(Self.format(interval)) for the rest of the day (last at \(Self.format(last)))", until: until))
                    } else {
                        let until = last.addingTimeInterval(SchedulingPolicy.refreshInterval)
                        result.append(Blocker(.rateLimit, "\(stored.app) was launched at \(Self.format(last)); refresh launches are at most every \(Self.format(SchedulingPolicy.refreshInterval))", until: until))
                    }
                }
            }
        }
        if policy == .realistic && request.kind == .refresh {
            result.append(contentsOf: usageBlockers(stored.app, state: state))
        }
        if appRunning {
            result.append(Blocker(.appRunning, "\(stored.app) is running a launch now; the request runs in its next launch"))
        } else if runningLaunches >= maximumConcurrentLaunches {
            result.append(Blocker(.concurrency, "\(runningLaunches) launch(es) are running, the limit is \(maximumConcurrentLaunches)"))
        }
        if let registered = state.lastRegistered, !registered.contains(request.identifier) {
            result.append(Blocker(.handlerNotRegistered, "the last launch of \(stored.app) (\(state.lastLaunchID ?? "?")) did not register a handler for \(request.identifier): it will end not-registered unless the app registers it", blocking: false))
        }
        return result
    }

    /// What the app's usage pattern makes of its refresh (`UsagePrediction`).
    private func usageBlockers(_ app: String, state: AppState) -> [Blocker] {
        guard UsagePrediction.wasOpened(state.opens, before: now) else {
            guard let last = state.lastLaunchAt, last.addingTimeInterval(UsagePrediction.unusedRefreshInterval) > now else { return [] }
            let until = last.addingTimeInterval(UsagePrediction.unusedRefreshInterval)
            return [Blocker(.usage, "\(app) has not been opened in the last \(UsagePrediction.windowDays) days (bgtask open): its refresh runs at most every \(Self.format(UsagePrediction.unusedRefreshInterval)) (last at \(Self.format(last)))", until: until)]
        }
        guard let prediction = UsagePrediction.predict(opens: state.opens, now: now) else { return [] }
        let habit = "\(app) is usually opened at \(prediction.timeOfDay) (on \(prediction.days) of the last \(prediction.windowDays) days)"
        let start = prediction.next.addingTimeInterval(-UsagePrediction.lead)
        if start > now {
            return [Blocker(.usage, "\(habit): its refresh waits until shortly before its next predicted use at \(Self.format(prediction.next)), from \(Self.format(start))", until: start)]
        }
        return [Blocker(.usage, "\(habit): its next use is predicted at \(Self.format(prediction.next)), so its refresh may run now", blocking: false)]
    }

    package static func format(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        return formatter.string(from: date)
    }

    package static func format(_ interval: TimeInterval) -> String {
        // As the CLI reads durations (`bgtask clock advance 1h30m`), to the second, rounded up
        // (past a millisecond of floating-point noise in date arithmetic): advancing a virtual
        // clock by what is printed makes the request due.
        DurationText.format(seconds: interval.isFinite && interval > 0 ? (interval - 0.001).rounded(.up) : interval)
    }
}

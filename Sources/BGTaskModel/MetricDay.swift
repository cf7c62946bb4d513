import Foundation

/// One app's use of the device over one day, summed from its launches' run records as the host
/// stores them: what the host's energy accounting judges (`bgtask why`) and what MetricKit's
/// `MXMetricPayload` reports (`bgtask metrics`, `MXMetricManager`). The day is the host clock's
/// (a virtual clock's day too), from midnight UTC.
///
/// It crosses from the host to the app (the ABI's `metric_payloads`) and to the CLI as this
/// Codable JSON; Apple's own JSON shape is made from it in one place (`MetricPayloadJSON`).
public struct MetricDay: Codable, Sendable, Equatable {
    /// The day's first instant and its last (`timeStampBegin`, `timeStampEnd`).
    public var begin: Date
    public var end: Date
    /// Launches that ended that day, by termination (`RunRecord.Termination`'s raw values).
    public var launches: Int
    /// CPU time of all its launches, milliseconds.
    public var cpuMs: Double
    /// Wall time of its background launches and of its foreground ones, milliseconds.
    public var backgroundMs: Double
    public var foregroundMs: Double
    /// The highest peak resident memory of any launch.
    public var peakMemoryBytes: UInt64
    /// Storage bytes written and read, and wake-ups (`RunRecord.EnergyRecord`).
    public var diskWrittenBytes: UInt64
    public var diskReadBytes: UInt64
    public var wakeups: UInt64
    /// Network bytes its own TCP connections moved (`SocketTraffic`), and those the host moved
    /// for it (its background URL sessions' transfers).
    public var networkUploadBytes: UInt64
    public var networkDownloadBytes: UInt64
    /// Background launches that ended, by how: the exit reasons MetricKit counts.
    public var exits: Exits

    /// MXBackgroundExitData's counts.
    public struct Exits: Codable, Sendable, Equatable {
        /// Ended as asked (exited; a launch suspended after its work is no exit).
        public var normal: Int = 0
        /// Jetsam: over its memory limit.
        public var memoryLimit: Int = 0
        /// Over the background CPU limit.
        public var cpuLimit: Int = 0
        /// Killed by the watchdog with tasks open (its time ran out and it did not finish).
        public var watchdog: Int = 0
        /// Killed by the watchdog with only background-time assertions held.
        public var backgroundTaskAssertionTimeout: Int = 0
        /// Crashed (a signal, an abnormal exit); `badAccess` and `illegalInstruction` of them.
        public var abnormal: Int = 0
        public var badAccess: Int = 0
        public var illegalInstruction: Int = 0
        /// Ended while suspended for memory pressure (the host's suspended-memory budget, the
        /// kernel's pressure): iOS's jetsam of suspended apps.
        public var memoryPressure: Int = 0
        /// Killed for its disk use (the host's reserve or the app's quota): iOS has no such kill;
        /// MetricKit has no count of them, bgtask's payload lists them apart.
        public var disk: Int = 0

        public init() {}

        public var total: Int { normal + memoryLimit + memoryPressure + cpuLimit + watchdog + backgroundTaskAssertionTimeout + abnormal + disk }
    }

    public init(begin: Date, end: Date, launches: Int = 0, cpuMs: Double = 0, backgroundMs: Double = 0, foregroundMs: Double = 0,
                peakMemoryBytes: UInt64 = 0, diskWrittenBytes: UInt64 = 0, diskReadBytes: UInt64 = 0, wakeups: UInt64 = 0,
                networkUploadBytes: UInt64 = 0, networkDownloadBytes: UInt64 = 0, exits: Exits = Exits()) {
        self.begin = begin
        self.end = end
        self.launches = launches
        self.cpuMs = cpuMs
        self.backgroundMs = backgroundMs
        self.foregroundMs = foregroundMs
        self.peakMemoryBytes = peakMemoryBytes
        self.diskWrittenBytes = diskWrittenBytes
        self.diskReadBytes = diskReadBytes
        self.wakeups = wakeups
        self.networkUploadBytes = networkUploadBytes
        self.networkDownloadBytes = networkDownloadBytes
        self.exits = exits
    }
}

/// A crash or hang of one launch, as MetricKit's `MXDiagnosticPayload` reports it
/// (`MXCrashDiagnostic`, `MXHangDiagnostic`), from its run record.
public struct MetricDiagnostic: Codable, Sendable, Equatable {
    public enum Kind: String, Codable, Sendable {
        /// Died by a signal or an abnormal exit.
        case crash
        /// Killed by the watchdog: its main thread or its work did not finish in time.
        case hang
        /// Killed over a limit (memory, CPU): MetricKit's `MXCPUExceptionDiagnostic` for CPU.
        case cpuException = "cpu-exception"
    }

    public var kind: Kind
    public var launchID: String
    /// When the launch began, and how long it ran (the hang's duration for a hang).
    public var at: Date
    public var durationMs: Double
    /// The signal (SIGSEGV…), the exit status, and the record's error text.
    public var signal: String?
    public var exitStatus: Int32?
    public var reason: String?
    /// CPU it used (for a CPU exception).
    public var cpuMs: Double?

    public init(kind: Kind, launchID: String, at: Date, durationMs: Double, signal: String? = nil, exitStatus: Int32? = nil,
                reason: String? = nil, cpuMs: Double? = nil) {
        self.kind = kind
        self.launchID = launchID
        self.at = at
        self.durationMs = durationMs
        self.signal = signal
        self.exitStatus = exitStatus
        self.reason = reason
        self.cpuMs = cpuMs
    }
}

/// What a launch hands to MetricKit: the days not yet delivered to the app, and the
/// diagnostics of those days (at most `InputLimits.recordListEntries`), with the app's version.
public struct MetricDelivery: Codable, Sendable, Equatable {
    public var days: [MetricDay]
    public var diagnostics: [MetricDiagnostic]
    /// CFBundleShortVersionString and CFBundleVersion of the app's bundle.
    public var appVersion: String
    public var buildVersion: String

    public init(days: [MetricDay], diagnostics: [MetricDiagnostic], appVersion: String, buildVersion: String) {
        self.days = days
        self.diagnostics = diagnostics
        self.appVersion = appVersion
        self.buildVersion = buildVersion
    }
}

/// The JSON of MetricKit's values between the host, its store and the app (`MetricDelivery`,
/// `MetricDiagnostic`): dates in seconds since 1970, keys sorted. One coder for every side.
public enum MetricJSON {
    public static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .secondsSince1970
        encoder.outputFormatting = .sortedKeys
        return encoder
    }

    public static var decoder: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        return decoder
    }
}

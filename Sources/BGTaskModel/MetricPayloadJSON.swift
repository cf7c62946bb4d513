import Foundation
import Glibc

/// Apple's MetricKit JSON, made from the host's `MetricDay` and `MetricDiagnostic`: what
/// `MXMetricPayload.jsonRepresentation()` and `MXDiagnosticPayload.jsonRepresentation()` return
/// on iOS. The one place that knows Apple's key names and value formats; the `MetricKit` module
/// builds its objects' dictionaries here, and reads their counts back from them.
///
/// Where the shape comes from (Apple documents the keys by its classes' property names, and
/// gives no schema; these are the payloads Apple's own code writes):
/// - Metric payloads: the payload Xcode's "Debug > Simulate MetricKit Payloads" delivers (iOS 16,
///   reproduced in public write-ups of MetricKit, e.g. kodeco.com's "Monitoring for iOS with
///   MetricKit") and payloads from devices (iOS 14: `"timeStampBegin" : "2020-10-23 23:00:00 +0000"`,
///   `"foregroundExitData" : { }`, counts left out when zero): top-level `appVersion`,
///   `timeStampBegin`, `timeStampEnd`, `metaData`, then one object per `MXMetric` subclass under
///   the payload property's name (`cpuMetrics`, `memoryMetrics`, …), each measurement a string
///   of its value and unit symbol (`"100 sec"`, `"1300 kB"`), exit counts as integers.
/// - Diagnostic payloads: Xcode's simulated diagnostic payload and a device's crash report as
///   kept in github.com/ChimeHQ/Meter (Tests/MeterTests/Resources/xcode_simulated.json,
///   xcode_simulated_macOS_13.json, real_report.json): `crashDiagnostics`, `hangDiagnostics`,
///   `cpuExceptionDiagnostics`, each entry `{"version": "1.0.0", "callStackTree": {...},
///   "diagnosticMetaData": {...}}`, the kind's values (`signal`, `exceptionType`,
///   `terminationReason`, `hangDuration`, `totalCPUTime`) inside `diagnosticMetaData`.
/// - Property names and meanings: developer.apple.com/documentation/metrickit (MXMetricPayload,
///   MXBackgroundExitData, MXMetaData, MXCrashDiagnostic, MXCallStackTree).
///
/// What the host does not measure is left out rather than reported as zero: call stacks (each
/// diagnostic has an empty tree, `"callStacks": []`), GPU, display, location, cellular
/// conditions, launch and hang-time histograms, signposts, CPU instructions, background audio
/// and location time, suspended memory, and foreground exits (the host counts exits of
/// background launches only: `foregroundExitData` is `{}`, as on a device with none). Bytes the
/// host moved for the app are reported as Wi-Fi traffic (a Linux host has no cellular link, so
/// the cellular counts are zero). Kills for disk use, which iOS does not make, are counted under
/// the bgtask-specific key `bgtaskDiskLimitExitCount` in `backgroundExitData`; every other
/// bgtask-specific key starts with `bgtask` too.
public enum MetricPayloadJSON {
    /// The device a payload describes: `metaData` and each diagnostic's `diagnosticMetaData`.
    public struct Device: Sendable, Equatable {
        /// "Linux 6.1.0 (6.1.0-18-amd64)", as iOS's "iPhone OS 14.0.1 (18A393)": name, version, build.
        public var osVersion: String
        /// The hardware's name (DMI product name), or the machine's architecture.
        public var deviceType: String
        /// "arm64" or "x86_64".
        public var platformArchitecture: String
        /// The current locale's country code ("US" for the POSIX locale).
        public var regionFormat: String
        /// The app's bundle identifier, when known (`bundleIdentifier`, iOS 16's payloads).
        public var bundleIdentifier: String?

        public init(osVersion: String, deviceType: String, platformArchitecture: String, regionFormat: String, bundleIdentifier: String? = nil) {
            self.osVersion = osVersion
            self.deviceType = deviceType
            self.platformArchitecture = platformArchitecture
            self.regionFormat = regionFormat
            self.bundleIdentifier = bundleIdentifier
        }

        /// This machine, read from uname(2), DMI and the current locale.
        public static func current(bundleIdentifier: String? = nil) -> Device {
            var names = utsname()
            uname(&names)
            let sysname = field(&names.sysname), release = field(&names.release), machine = field(&names.machine)
            let version = release.prefix { $0.isNumber || $0 == "." }
            let architecture = machine == "aarch64" ? "arm64" : machine
            let product = (try? String(contentsOfFile: "/sys/class/dmi/id/product_name", encoding: .utf8))?
                .trimmingCharacters(in: .whitespacesAndNewlines)
            return Device(osVersion: "\(sysname.isEmpty ? "Linux" : sysname) \(version.isEmpty ? release : String(version)) (\(release))",
                          deviceType: product.flatMap { $0.isEmpty ? nil : $0 } ?? architecture,
                          platformArchitecture: architecture,
                          regionFormat: region(),
                          bundleIdentifier: bundleIdentifier)
        }

        /// The current locale's country code; "US" for a locale without one (POSIX's region
        /// is the world, "001", which is no country code).
        private static func region() -> String {
            let code = Locale.current.region?.identifier ?? ""
            return code.count == 2 && code.allSatisfy(\.isLetter) ? code : "US"
        }

        private static func field<T>(_ value: inout T) -> String {
            withUnsafeBytes(of: &value) { bytes in
                String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
            }
        }
    }

    // MARK: Metric payloads (MXMetricPayload)

    /// `MXMetricPayload.dictionaryRepresentation()` of one day.
    public static func metricPayload(_ day: MetricDay, appVersion: String, buildVersion: String, device: Device) -> [String: Any] {
        [
            "appVersion": appVersion,
            "timeStampBegin": timestamp(day.begin),
            "timeStampEnd": timestamp(day.end),
            "metaData": metaData(buildVersion: buildVersion, device: device),
            "cpuMetrics": ["cumulativeCPUTime": seconds(milliseconds: day.cpuMs)],
            "memoryMetrics": ["peakMemoryUsage": kilobytes(day.peakMemoryBytes)],
            "diskIOMetrics": ["cumulativeLogicalWrites": kilobytes(day.diskWrittenBytes)],
            "networkTransferMetrics": [
                "cumulativeWifiUpload": kilobytes(day.networkUploadBytes),
                "cumulativeWifiDownload": kilobytes(day.networkDownloadBytes),
                "cumulativeCellularUpload": kilobytes(0),
                "cumulativeCellularDownload": kilobytes(0),
            ],
            "applicationTimeMetrics": [
                "cumulativeForegroundTime": seconds(milliseconds: day.foregroundMs),
                "cumulativeBackgroundTime": seconds(milliseconds: day.backgroundMs),
            ],
            "applicationExitMetrics": [
                "backgroundExitData": backgroundExitData(day.exits),
                "foregroundExitData": [String: Any](),
            ],
        ]
    }

    /// `MXMetricPayload.jsonRepresentation()` of one day.
    public static func metricPayloadData(_ day: MetricDay, appVersion: String, buildVersion: String, device: Device) -> Data {
        data(metricPayload(day, appVersion: appVersion, buildVersion: buildVersion, device: device))
    }

    /// `MXBackgroundExitData`'s counts. Apple's kinds are disjoint (an exit is counted once:
    /// `cumulativeAbnormalExitCount` is "uncaught exceptions, calls to abort", bad accesses
    /// and illegal instructions are counted apart), while `MetricDay.Exits.abnormal` counts
    /// every crash: the abnormal count here is the crashes that were neither. The host never
    /// ends a suspended app for a locked file: that is zero.
    public static func backgroundExitData(_ exits: MetricDay.Exits) -> [String: Int] {
        [
            "cumulativeNormalAppExitCount": exits.normal,
            "cumulativeMemoryResourceLimitExitCount": exits.memoryLimit,
            "cumulativeCPUResourceLimitExitCount": exits.cpuLimit,
            "cumulativeMemoryPressureExitCount": exits.memoryPressure,
            "cumulativeBadAccessExitCount": exits.badAccess,
            "cumulativeAbnormalExitCount": max(0, exits.abnormal - exits.badAccess - exits.illegalInstruction),
            "cumulativeIllegalInstructionExitCount": exits.illegalInstruction,
            "cumulativeAppWatchdogExitCount": exits.watchdog,
            "cumulativeSuspendedWithLockedFileExitCount": 0,
            "cumulativeBackgroundTaskAssertionTimeoutExitCount": exits.backgroundTaskAssertionTimeout,
            // Not Apple's: iOS does not end apps for their disk use.
            diskLimitExitCountKey: exits.disk,
        ]
    }

    /// The bgtask-specific count of background launches killed for their disk use.
    public static let diskLimitExitCountKey = "bgtaskDiskLimitExitCount"

    /// `MXMetaData.dictionaryRepresentation()`: the payload's `metaData`, and the part of a
    /// diagnostic's `diagnosticMetaData` every kind shares (with `appVersion` there).
    public static func metaData(buildVersion: String, device: Device) -> [String: Any] {
        var data: [String: Any] = [
            "appBuildVersion": buildVersion,
            "osVersion": device.osVersion,
            "deviceType": device.deviceType,
            "platformArchitecture": device.platformArchitecture,
            "regionFormat": device.regionFormat,
        ]
        if let identifier = device.bundleIdentifier { data["bundleIdentifier"] = identifier }
        return data
    }

    // MARK: Diagnostic payloads (MXDiagnosticPayload)

    /// The payload key of a kind's list.
    public static func key(_ kind: MetricDiagnostic.Kind) -> String {
        switch kind {
        case .crash: "crashDiagnostics"
        case .hang: "hangDiagnostics"
        case .cpuException: "cpuExceptionDiagnostics"
        }
    }

    /// `MXDiagnosticPayload.dictionaryRepresentation()` of the diagnostics of one period (a
    /// day's `begin` and `end`): one list per kind that has any, in the order given.
    public static func diagnosticPayload(_ diagnostics: [MetricDiagnostic], begin: Date, end: Date, appVersion: String,
                                         buildVersion: String, device: Device) -> [String: Any] {
        var payload: [String: Any] = ["timeStampBegin": timestamp(begin), "timeStampEnd": timestamp(end)]
        var lists: [String: [[String: Any]]] = [:]
        for diagnostic in diagnostics {
            lists[key(diagnostic.kind), default: []].append(self.diagnostic(diagnostic, appVersion: appVersion, buildVersion: buildVersion, device: device))
        }
        for (key, list) in lists { payload[key] = list }
        return payload
    }

    /// `MXDiagnosticPayload.jsonRepresentation()` of the diagnostics of one period.
    public static func diagnosticPayloadData(_ diagnostics: [MetricDiagnostic], begin: Date, end: Date, appVersion: String,
                                             buildVersion: String, device: Device) -> Data {
        data(diagnosticPayload(diagnostics, begin: begin, end: end, appVersion: appVersion, buildVersion: buildVersion, device: device))
    }

    /// One diagnostic's entry (`MXDiagnostic.dictionaryRepresentation()`): Apple's `version`,
    /// its call stack tree (empty: the host records no stacks), and its `diagnosticMetaData`,
    /// the shared metadata with the kind's values. bgtask adds `bgtaskLaunchID` (the launch it
    /// came from, as `bgtask log` names it) and `bgtaskReason` (the run record's error text).
    public static func diagnostic(_ diagnostic: MetricDiagnostic, appVersion: String, buildVersion: String, device: Device) -> [String: Any] {
        var meta = metaData(buildVersion: buildVersion, device: device)
        meta["appVersion"] = appVersion
        meta["bgtaskLaunchID"] = diagnostic.launchID
        if let reason = diagnostic.reason { meta["bgtaskReason"] = reason }
        switch diagnostic.kind {
        case .crash:
            if let name = diagnostic.signal, let number = signalNumber(name) {
                meta["signal"] = Int(number)
                meta["exceptionType"] = exceptionType(signal: number)
                meta["exceptionCode"] = 0
                // As a device writes it for a signal: "Namespace SIGNAL, Code 0xb".
                meta["terminationReason"] = "Namespace SIGNAL, Code 0x\(String(number, radix: 16))"
            } else if let status = diagnostic.exitStatus {
                meta["terminationReason"] = diagnostic.reason ?? "exited with status \(status)"
            } else if let reason = diagnostic.reason {
                meta["terminationReason"] = reason
            }
        case .hang:
            meta["hangDuration"] = seconds(milliseconds: diagnostic.durationMs)
        case .cpuException:
            meta["totalCPUTime"] = seconds(milliseconds: diagnostic.cpuMs ?? 0)
            meta["totalSampledTime"] = seconds(milliseconds: diagnostic.durationMs)
        }
        return [
            "version": "1.0.0",
            "callStackTree": callStackTree(perThread: diagnostic.kind != .cpuException),
            "diagnosticMetaData": meta,
        ]
    }

    /// `MXCallStackTree.jsonRepresentation()`'s dictionary with no stacks. Apple's is per
    /// thread (`callStackPerThread: true`) for crashes and hangs, one aggregated tree for CPU
    /// exceptions; the host samples no stacks, so `callStacks` is empty.
    public static func callStackTree(perThread: Bool) -> [String: Any] {
        ["callStackPerThread": perThread, "callStacks": [Any]()]
    }

    /// The signal's number on this system, from its name as run records write it ("SIGSEGV",
    /// "SIG34"), or from a bare number.
    public static func signalNumber(_ name: String) -> Int32? {
        let names: [String: Int32] = [
            "SIGHUP": SIGHUP, "SIGINT": SIGINT, "SIGQUIT": SIGQUIT, "SIGILL": SIGILL, "SIGTRAP": SIGTRAP,
            "SIGABRT": SIGABRT, "SIGBUS": SIGBUS, "SIGFPE": SIGFPE, "SIGKILL": SIGKILL, "SIGUSR1": SIGUSR1,
            "SIGSEGV": SIGSEGV, "SIGUSR2": SIGUSR2, "SIGPIPE": SIGPIPE, "SIGALRM": SIGALRM, "SIGTERM": SIGTERM,
            "SIGXCPU": SIGXCPU, "SIGXFSZ": SIGXFSZ, "SIGSYS": SIGSYS,
        ]
        let upper = name.uppercased()
        if let number = names[upper] { return number }
        if upper.hasPrefix("SIG"), let number = Int32(upper.dropFirst(3)), number > 0 { return number }
        return Int32(name).flatMap { $0 > 0 ? $0 : nil }
    }

    /// The Mach exception iOS reports with a crash by this signal (`exceptionType`):
    /// EXC_BAD_ACCESS (1) for SIGSEGV and SIGBUS, EXC_BAD_INSTRUCTION (2) for SIGILL,
    /// EXC_ARITHMETIC (3) for SIGFPE, EXC_BREAKPOINT (6) for SIGTRAP, EXC_CRASH (10) otherwise.
    public static func exceptionType(signal: Int32) -> Int {
        switch signal {
        case SIGSEGV, SIGBUS: 1
        case SIGILL: 2
        case SIGFPE: 3
        case SIGTRAP: 6
        default: 10
        }
    }

    // MARK: Values

    /// A date as MetricKit writes it: "2020-10-23 23:00:00 +0000" (UTC).
    public static func timestamp(_ date: Date) -> String {
        var time = time_t(floor(date.timeIntervalSince1970))
        var parts = tm()
        gmtime_r(&time, &parts)
        return String(format: "%04d-%02d-%02d %02d:%02d:%02d +0000", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
                      Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec))
    }

    /// A duration as MetricKit writes it: "100 sec" (fractions to the millisecond, no grouping).
    public static func seconds(milliseconds: Double) -> String {
        "\(number(milliseconds / 1000)) sec"
    }

    /// A size as MetricKit writes it: "1300 kB" (kilobytes of 1,000 bytes, fractions to the byte).
    public static func kilobytes(_ bytes: UInt64) -> String {
        "\(number(Double(bytes) / 1000)) kB"
    }

    /// At most three decimals, trailing zeros dropped, "." as the separator whatever the locale.
    static func number(_ value: Double) -> String {
        guard value.isFinite else { return "0" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        var text = String(format: "%.3f", value)
        while text.hasSuffix("0") { text.removeLast() }
        if text.hasSuffix(".") { text.removeLast() }
        return text
    }

    /// A dictionary of these as JSON: sorted keys, one line.
    public static func data(_ object: [String: Any]) -> Data {
        (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
    }
}

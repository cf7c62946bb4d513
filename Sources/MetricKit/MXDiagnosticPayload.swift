import BGTaskModel
import Foundation

// Apple's diagnostic classes, made from the host's `MetricDiagnostic`s (a launch's crash, hang
// or CPU exception, from its run record). As with the metrics, each object keeps the
// dictionary `MetricPayloadJSON` makes for it and reads its values back from it.

/// As Apple's: a day's diagnostics. Delivered by `MXMetricManager`.
public final class MXDiagnosticPayload: NSObject, @unchecked Sendable {
    /// Nil when the day had none of a kind, as on iOS.
    public let crashDiagnostics: [MXCrashDiagnostic]?
    public let hangDiagnostics: [MXHangDiagnostic]?
    public let cpuExceptionDiagnostics: [MXCPUExceptionDiagnostic]?
    /// The host makes no disk-write or launch diagnostics: always nil.
    public var diskWriteExceptionDiagnostics: [MXDiskWriteExceptionDiagnostic]? { nil }
    public var appLaunchDiagnostics: [MXAppLaunchDiagnostic]? { nil }
    /// The period the diagnostics fall in (their day).
    public let timeStampBegin: Date
    public let timeStampEnd: Date

    private let dictionary: [String: Any]

    init(diagnostics: [MetricDiagnostic], begin: Date, end: Date, appVersion: String, buildVersion: String,
         device: MetricPayloadJSON.Device) {
        dictionary = MetricPayloadJSON.diagnosticPayload(diagnostics, begin: begin, end: end, appVersion: appVersion,
                                                         buildVersion: buildVersion, device: device)
        timeStampBegin = begin
        timeStampEnd = end
        var crashes: [MXCrashDiagnostic] = [], hangs: [MXHangDiagnostic] = [], exceptions: [MXCPUExceptionDiagnostic] = []
        for diagnostic in diagnostics {
            let entry = MetricPayloadJSON.diagnostic(diagnostic, appVersion: appVersion, buildVersion: buildVersion, device: device)
            switch diagnostic.kind {
            case .crash: crashes.append(MXCrashDiagnostic(entry))
            case .hang: hangs.append(MXHangDiagnostic(entry, duration: .seconds(milliseconds: diagnostic.durationMs)))
            case .cpuException:
                exceptions.append(MXCPUExceptionDiagnostic(entry, cpuTime: .seconds(milliseconds: diagnostic.cpuMs ?? 0),
                                                           sampledTime: .seconds(milliseconds: diagnostic.durationMs)))
            }
        }
        crashDiagnostics = crashes.isEmpty ? nil : crashes
        hangDiagnostics = hangs.isEmpty ? nil : hangs
        cpuExceptionDiagnostics = exceptions.isEmpty ? nil : exceptions
        super.init()
    }

    /// The payload as Apple's JSON (sorted keys, one line).
    public func jsonRepresentation() -> Data { MetricPayloadJSON.data(dictionary) }

    /// The payload as Apple's dictionary.
    public func dictionaryRepresentation() -> [AnyHashable: Any] { hashable(dictionary) }

    @available(*, deprecated, renamed: "dictionaryRepresentation()")
    public func DictionaryRepresentation() -> [AnyHashable: Any] { dictionaryRepresentation() }

    public override var description: String { String(decoding: jsonRepresentation(), as: UTF8.self) }
}

/// As Apple's: the abstract diagnostic: the app's version, the device, its JSON.
public class MXDiagnostic: NSObject, @unchecked Sendable {
    /// CFBundleShortVersionString of the app that had it.
    public let applicationVersion: String
    public let metaData: MXMetaData

    let dictionary: [String: Any]

    init(_ entry: [String: Any]) {
        dictionary = entry
        let meta = entry["diagnosticMetaData"] as? [String: Any] ?? [:]
        applicationVersion = meta["appVersion"] as? String ?? ""
        // MXMetaData's keys only (the shared part of `diagnosticMetaData`).
        let shared: Set = ["appBuildVersion", "osVersion", "deviceType", "platformArchitecture", "regionFormat", "bundleIdentifier",
                           "pid", "lowPowerModeEnabled", "isTestFlightApp"]
        metaData = MXMetaData(meta.filter { shared.contains($0.key) })
        super.init()
    }

    /// The diagnostic as Apple's JSON (sorted keys, one line).
    public func jsonRepresentation() -> Data { MetricPayloadJSON.data(dictionary) }

    /// The diagnostic as Apple's dictionary.
    public func dictionaryRepresentation() -> [AnyHashable: Any] { hashable(dictionary) }

    @available(*, deprecated, renamed: "dictionaryRepresentation()")
    public func DictionaryRepresentation() -> [AnyHashable: Any] { dictionaryRepresentation() }

    public override var description: String { String(decoding: jsonRepresentation(), as: UTF8.self) }
}

/// As Apple's: the call stacks of a diagnostic. The host samples no stacks: the tree is empty
/// (`{"callStackPerThread": true, "callStacks": []}`).
public final class MXCallStackTree: NSObject, @unchecked Sendable {
    private let dictionary: [String: Any]

    init(_ dictionary: [String: Any]) {
        self.dictionary = dictionary
        super.init()
    }

    /// The tree as Apple's JSON (sorted keys, one line).
    public func jsonRepresentation() -> Data { MetricPayloadJSON.data(dictionary) }

    public override var description: String { String(decoding: jsonRepresentation(), as: UTF8.self) }
}

/// As Apple's: a launch that died by a signal or an abnormal exit.
public final class MXCrashDiagnostic: MXDiagnostic, @unchecked Sendable {
    public let callStackTree: MXCallStackTree
    /// "Namespace SIGNAL, Code 0xb" for a signal, or the run record's text.
    public let terminationReason: String?
    /// Not known to the host: nil.
    public let virtualMemoryRegionInfo: String?
    /// The Mach exception iOS reports with the signal (EXC_BAD_ACCESS is 1), or nil.
    public let exceptionType: NSNumber?
    public let exceptionCode: NSNumber?
    /// The signal's number (this system's), or nil for an abnormal exit.
    public let signal: NSNumber?

    override init(_ entry: [String: Any]) {
        let meta = entry["diagnosticMetaData"] as? [String: Any] ?? [:]
        terminationReason = meta["terminationReason"] as? String
        virtualMemoryRegionInfo = meta["virtualMemoryRegionInfo"] as? String
        exceptionType = (meta["exceptionType"] as? Int).map { NSNumber(value: $0) }
        exceptionCode = (meta["exceptionCode"] as? Int).map { NSNumber(value: $0) }
        signal = (meta["signal"] as? Int).map { NSNumber(value: $0) }
        callStackTree = MXCallStackTree(entry["callStackTree"] as? [String: Any] ?? MetricPayloadJSON.callStackTree(perThread: true))
        super.init(entry)
    }
}

/// As Apple's: the app did not finish in time (killed by the host's watchdog).
public final class MXHangDiagnostic: MXDiagnostic, @unchecked Sendable {
    public let callStackTree: MXCallStackTree
    /// How long the launch ran before it was killed.
    public let hangDuration: Measurement<UnitDuration>

    init(_ entry: [String: Any], duration: Measurement<UnitDuration>) {
        hangDuration = duration
        callStackTree = MXCallStackTree(entry["callStackTree"] as? [String: Any] ?? MetricPayloadJSON.callStackTree(perThread: true))
        super.init(entry)
    }
}

/// As Apple's: the app used too much CPU (killed over the host's background CPU limit).
public final class MXCPUExceptionDiagnostic: MXDiagnostic, @unchecked Sendable {
    public let callStackTree: MXCallStackTree
    /// CPU the launch used, over the time it ran (`totalSampledTime`).
    public let totalCPUTime: Measurement<UnitDuration>
    public let totalSampledTime: Measurement<UnitDuration>

    init(_ entry: [String: Any], cpuTime: Measurement<UnitDuration>, sampledTime: Measurement<UnitDuration>) {
        totalCPUTime = cpuTime
        totalSampledTime = sampledTime
        callStackTree = MXCallStackTree(entry["callStackTree"] as? [String: Any] ?? MetricPayloadJSON.callStackTree(perThread: false))
        super.init(entry)
    }
}

/// As Apple's: too many storage writes. The host makes none (no payload holds one).
public final class MXDiskWriteExceptionDiagnostic: MXDiagnostic, @unchecked Sendable {
    public let callStackTree: MXCallStackTree
    public let totalWritesCaused: Measurement<UnitInformationStorage>

    init(_ entry: [String: Any], writes: Measurement<UnitInformationStorage>) {
        totalWritesCaused = writes
        callStackTree = MXCallStackTree(entry["callStackTree"] as? [String: Any] ?? MetricPayloadJSON.callStackTree(perThread: false))
        super.init(entry)
    }
}

/// As Apple's: a slow launch. The host makes none (no payload holds one).
public final class MXAppLaunchDiagnostic: MXDiagnostic, @unchecked Sendable {
    public let callStackTree: MXCallStackTree
    public let launchDuration: Measurement<UnitDuration>

    init(_ entry: [String: Any], duration: Measurement<UnitDuration>) {
        launchDuration = duration
        callStackTree = MXCallStackTree(entry["callStackTree"] as? [String: Any] ?? MetricPayloadJSON.callStackTree(perThread: true))
        super.init(entry)
    }
}

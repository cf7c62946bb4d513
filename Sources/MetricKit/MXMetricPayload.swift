import BGTaskModel
import Foundation

// Apple's metric classes, made from the host's `MetricDay`. Each object keeps the dictionary
// `MetricPayloadJSON` makes for it (Apple's JSON shape lives there only) and reads its counts
// back from it, so that a property and the JSON always agree. Measurements are in the units
// Apple's JSON writes them: seconds and kilobytes.

/// As Apple's: a day of the app's metrics. Delivered by `MXMetricManager`.
public final class MXMetricPayload: NSObject, @unchecked Sendable {
    /// The app's version (CFBundleShortVersionString) when the payload was made.
    public let latestApplicationVersion: String
    /// Whether the app changed versions during the day: never, for bgtask (a day's records
    /// carry no version; the payload names the bundle's version at delivery).
    public let includesMultipleApplicationVersions: Bool
    /// The day's first instant and its last.
    public let timeStampBegin: Date
    public let timeStampEnd: Date
    public let cpuMetrics: MXCPUMetric?
    public let memoryMetrics: MXMemoryMetric?
    public let diskIOMetrics: MXDiskIOMetric?
    public let networkTransferMetrics: MXNetworkTransferMetric?
    public let applicationTimeMetrics: MXAppRunTimeMetric?
    public let applicationExitMetrics: MXAppExitMetric?
    public let metaData: MXMetaData?
    /// What the host does not measure: always nil (see `MetricPayloadJSON`).
    public var gpuMetrics: MXGPUMetric? { nil }
    public var locationActivityMetrics: MXLocationActivityMetric? { nil }
    public var applicationLaunchMetrics: MXAppLaunchMetric? { nil }
    public var applicationResponsivenessMetrics: MXAppResponsivenessMetric? { nil }
    public var animationMetrics: MXAnimationMetric? { nil }

    private let dictionary: [String: Any]

    init(day: MetricDay, appVersion: String, buildVersion: String, device: MetricPayloadJSON.Device) {
        let payload = MetricPayloadJSON.metricPayload(day, appVersion: appVersion, buildVersion: buildVersion, device: device)
        dictionary = payload
        latestApplicationVersion = appVersion
        includesMultipleApplicationVersions = false
        timeStampBegin = day.begin
        timeStampEnd = day.end
        func section(_ key: String) -> [String: Any] { payload[key] as? [String: Any] ?? [:] }
        cpuMetrics = MXCPUMetric(section("cpuMetrics"), cpuTime: .seconds(milliseconds: day.cpuMs))
        memoryMetrics = MXMemoryMetric(section("memoryMetrics"), peak: .kilobytes(day.peakMemoryBytes))
        diskIOMetrics = MXDiskIOMetric(section("diskIOMetrics"), writes: .kilobytes(day.diskWrittenBytes))
        networkTransferMetrics = MXNetworkTransferMetric(section("networkTransferMetrics"), upload: .kilobytes(day.networkUploadBytes),
                                                         download: .kilobytes(day.networkDownloadBytes))
        applicationTimeMetrics = MXAppRunTimeMetric(section("applicationTimeMetrics"), foreground: .seconds(milliseconds: day.foregroundMs),
                                                    background: .seconds(milliseconds: day.backgroundMs))
        applicationExitMetrics = MXAppExitMetric(section("applicationExitMetrics"))
        metaData = MXMetaData(section("metaData"))
        super.init()
    }

    /// The payload as Apple's JSON (sorted keys, one line).
    public func jsonRepresentation() -> Data { MetricPayloadJSON.data(dictionary) }

    /// The payload as Apple's dictionary (the JSON's objects).
    public func dictionaryRepresentation() -> [AnyHashable: Any] { hashable(dictionary) }

    @available(*, deprecated, renamed: "dictionaryRepresentation()")
    public func DictionaryRepresentation() -> [AnyHashable: Any] { dictionaryRepresentation() }

    public override var description: String { String(decoding: jsonRepresentation(), as: UTF8.self) }
}

/// As Apple's: the abstract metric, with its JSON.
public class MXMetric: NSObject, @unchecked Sendable {
    let dictionary: [String: Any]

    init(_ dictionary: [String: Any]) {
        self.dictionary = dictionary
        super.init()
    }

    /// The metric as Apple's JSON (sorted keys, one line).
    public func jsonRepresentation() -> Data { MetricPayloadJSON.data(dictionary) }

    /// The metric as Apple's dictionary.
    public func dictionaryRepresentation() -> [AnyHashable: Any] { hashable(dictionary) }

    @available(*, deprecated, renamed: "dictionaryRepresentation()")
    public func DictionaryRepresentation() -> [AnyHashable: Any] { dictionaryRepresentation() }

    public override var description: String { String(decoding: jsonRepresentation(), as: UTF8.self) }
}

/// As Apple's: CPU use over the day.
public final class MXCPUMetric: MXMetric, @unchecked Sendable {
    /// CPU time of all the app's launches that day.
    public let cumulativeCPUTime: Measurement<UnitDuration>
    /// Instructions retired: the host does not count them (zero; not in the JSON).
    public let cumulativeCPUInstructions: Measurement<Unit>

    init(_ dictionary: [String: Any], cpuTime: Measurement<UnitDuration>) {
        cumulativeCPUTime = cpuTime
        cumulativeCPUInstructions = Measurement(value: 0, unit: Unit(symbol: "kiloinstructions"))
        super.init(dictionary)
    }
}

/// As Apple's: memory use over the day.
public final class MXMemoryMetric: MXMetric, @unchecked Sendable {
    /// The highest peak resident memory of any launch that day.
    public let peakMemoryUsage: Measurement<UnitInformationStorage>
    /// Memory while suspended: the host does not sample it (no samples; not in the JSON).
    public let averageSuspendedMemory: MXAverage<UnitInformationStorage>

    init(_ dictionary: [String: Any], peak: Measurement<UnitInformationStorage>) {
        peakMemoryUsage = peak
        averageSuspendedMemory = MXAverage(Measurement(value: 0, unit: .kilobytes), sampleCount: 0, standardDeviation: -1)
        super.init(dictionary)
    }
}

/// As Apple's: storage writes over the day.
public final class MXDiskIOMetric: MXMetric, @unchecked Sendable {
    /// Bytes the app's launches wrote to storage.
    public let cumulativeLogicalWrites: Measurement<UnitInformationStorage>

    init(_ dictionary: [String: Any], writes: Measurement<UnitInformationStorage>) {
        cumulativeLogicalWrites = writes
        super.init(dictionary)
    }
}

/// As Apple's: network transfers over the day. The host's transfers for the app (its
/// background URL sessions) count as Wi-Fi; a Linux host has no cellular link.
public final class MXNetworkTransferMetric: MXMetric, @unchecked Sendable {
    public let cumulativeWifiUpload: Measurement<UnitInformationStorage>
    public let cumulativeWifiDownload: Measurement<UnitInformationStorage>
    public let cumulativeCellularUpload: Measurement<UnitInformationStorage>
    public let cumulativeCellularDownload: Measurement<UnitInformationStorage>

    init(_ dictionary: [String: Any], upload: Measurement<UnitInformationStorage>, download: Measurement<UnitInformationStorage>) {
        cumulativeWifiUpload = upload
        cumulativeWifiDownload = download
        cumulativeCellularUpload = Measurement(value: 0, unit: .kilobytes)
        cumulativeCellularDownload = Measurement(value: 0, unit: .kilobytes)
        super.init(dictionary)
    }
}

/// As Apple's: how long the app ran, in the foreground and in the background.
public final class MXAppRunTimeMetric: MXMetric, @unchecked Sendable {
    public let cumulativeForegroundTime: Measurement<UnitDuration>
    public let cumulativeBackgroundTime: Measurement<UnitDuration>
    /// Background audio and location: no such modes run on the host (zero; not in the JSON).
    public let cumulativeBackgroundAudioTime: Measurement<UnitDuration>
    public let cumulativeBackgroundLocationTime: Measurement<UnitDuration>

    init(_ dictionary: [String: Any], foreground: Measurement<UnitDuration>, background: Measurement<UnitDuration>) {
        cumulativeForegroundTime = foreground
        cumulativeBackgroundTime = background
        cumulativeBackgroundAudioTime = Measurement(value: 0, unit: .seconds)
        cumulativeBackgroundLocationTime = Measurement(value: 0, unit: .seconds)
        super.init(dictionary)
    }
}

/// As Apple's: how the app's launches ended.
public final class MXAppExitMetric: MXMetric, @unchecked Sendable {
    /// Foreground exits: the host counts none (all zero; `{}` in the JSON).
    public let foregroundExitData: MXForegroundExitData
    /// Background exits, by reason.
    public let backgroundExitData: MXBackgroundExitData

    override init(_ dictionary: [String: Any]) {
        foregroundExitData = MXForegroundExitData(dictionary["foregroundExitData"] as? [String: Any] ?? [:])
        backgroundExitData = MXBackgroundExitData(dictionary["backgroundExitData"] as? [String: Any] ?? [:])
        super.init(dictionary)
    }
}

/// As Apple's: counts of foreground exits by reason.
public final class MXForegroundExitData: NSObject, @unchecked Sendable {
    public let cumulativeNormalAppExitCount: Int
    public let cumulativeMemoryResourceLimitExitCount: Int
    public let cumulativeBadAccessExitCount: Int
    public let cumulativeAbnormalExitCount: Int
    public let cumulativeIllegalInstructionExitCount: Int
    public let cumulativeAppWatchdogExitCount: Int

    init(_ counts: [String: Any]) {
        cumulativeNormalAppExitCount = count(counts, "cumulativeNormalAppExitCount")
        cumulativeMemoryResourceLimitExitCount = count(counts, "cumulativeMemoryResourceLimitExitCount")
        cumulativeBadAccessExitCount = count(counts, "cumulativeBadAccessExitCount")
        cumulativeAbnormalExitCount = count(counts, "cumulativeAbnormalExitCount")
        cumulativeIllegalInstructionExitCount = count(counts, "cumulativeIllegalInstructionExitCount")
        cumulativeAppWatchdogExitCount = count(counts, "cumulativeAppWatchdogExitCount")
        super.init()
    }
}

/// As Apple's: counts of background exits by reason (each exit counted once:
/// `MetricPayloadJSON.backgroundExitData` says how the host's counts map).
public final class MXBackgroundExitData: NSObject, @unchecked Sendable {
    public let cumulativeNormalAppExitCount: Int
    public let cumulativeMemoryResourceLimitExitCount: Int
    public let cumulativeCPUResourceLimitExitCount: Int
    public let cumulativeMemoryPressureExitCount: Int
    public let cumulativeBadAccessExitCount: Int
    public let cumulativeAbnormalExitCount: Int
    public let cumulativeIllegalInstructionExitCount: Int
    public let cumulativeAppWatchdogExitCount: Int
    public let cumulativeSuspendedWithLockedFileExitCount: Int
    public let cumulativeBackgroundTaskAssertionTimeoutExitCount: Int

    init(_ counts: [String: Any]) {
        cumulativeNormalAppExitCount = count(counts, "cumulativeNormalAppExitCount")
        cumulativeMemoryResourceLimitExitCount = count(counts, "cumulativeMemoryResourceLimitExitCount")
        cumulativeCPUResourceLimitExitCount = count(counts, "cumulativeCPUResourceLimitExitCount")
        cumulativeMemoryPressureExitCount = count(counts, "cumulativeMemoryPressureExitCount")
        cumulativeBadAccessExitCount = count(counts, "cumulativeBadAccessExitCount")
        cumulativeAbnormalExitCount = count(counts, "cumulativeAbnormalExitCount")
        cumulativeIllegalInstructionExitCount = count(counts, "cumulativeIllegalInstructionExitCount")
        cumulativeAppWatchdogExitCount = count(counts, "cumulativeAppWatchdogExitCount")
        cumulativeSuspendedWithLockedFileExitCount = count(counts, "cumulativeSuspendedWithLockedFileExitCount")
        cumulativeBackgroundTaskAssertionTimeoutExitCount = count(counts, "cumulativeBackgroundTaskAssertionTimeoutExitCount")
        super.init()
    }
}

/// As Apple's: an average of samples in one unit.
public final class MXAverage<UnitType: Unit>: NSObject, @unchecked Sendable {
    public let averageMeasurement: Measurement<UnitType>
    public let sampleCount: Int
    /// -1 with no samples, as Apple's payloads write it.
    public let standardDeviation: Double

    init(_ average: Measurement<UnitType>, sampleCount: Int, standardDeviation: Double) {
        averageMeasurement = average
        self.sampleCount = sampleCount
        self.standardDeviation = standardDeviation
        super.init()
    }
}

/// As Apple's: the device and the app's build a payload or a diagnostic describes.
public final class MXMetaData: NSObject, @unchecked Sendable {
    public let regionFormat: String
    public let osVersion: String
    public let deviceType: String
    /// CFBundleVersion of the app's bundle.
    public let applicationBuildVersion: String
    public let platformArchitecture: String
    /// Not recorded by the host for a day or a launch: false, false, and -1.
    public let lowPowerModeEnabled: Bool
    public let isTestFlightApp: Bool
    public let pid: pid_t

    private let dictionary: [String: Any]

    init(_ dictionary: [String: Any]) {
        self.dictionary = dictionary
        regionFormat = dictionary["regionFormat"] as? String ?? ""
        osVersion = dictionary["osVersion"] as? String ?? ""
        deviceType = dictionary["deviceType"] as? String ?? ""
        applicationBuildVersion = dictionary["appBuildVersion"] as? String ?? ""
        platformArchitecture = dictionary["platformArchitecture"] as? String ?? ""
        lowPowerModeEnabled = dictionary["lowPowerModeEnabled"] as? Bool ?? false
        isTestFlightApp = dictionary["isTestFlightApp"] as? Bool ?? false
        pid = (dictionary["pid"] as? Int).map { pid_t(truncatingIfNeeded: $0) } ?? -1
        super.init()
    }

    /// The metadata as Apple's JSON (sorted keys, one line).
    public func jsonRepresentation() -> Data { MetricPayloadJSON.data(dictionary) }

    /// The metadata as Apple's dictionary.
    public func dictionaryRepresentation() -> [AnyHashable: Any] { hashable(dictionary) }

    @available(*, deprecated, renamed: "dictionaryRepresentation()")
    public func DictionaryRepresentation() -> [AnyHashable: Any] { dictionaryRepresentation() }

    public override var description: String { String(decoding: jsonRepresentation(), as: UTF8.self) }
}

// MARK: Helpers

extension Measurement where UnitType == UnitDuration {
    static func seconds(milliseconds: Double) -> Measurement<UnitDuration> {
        Measurement(value: milliseconds / 1000, unit: .seconds)
    }
}

extension Measurement where UnitType == UnitInformationStorage {
    /// Kilobytes of 1,000 bytes, as Apple's JSON writes sizes ("kB").
    static func kilobytes(_ bytes: UInt64) -> Measurement<UnitInformationStorage> {
        Measurement(value: Double(bytes) / 1000, unit: .kilobytes)
    }
}

/// A count from a JSON object (zero when left out).
func count(_ object: [String: Any], _ key: String) -> Int {
    object[key] as? Int ?? 0
}

/// JSON objects as Apple's dictionaries: keys as AnyHashable, all the way down.
func hashable(_ object: [String: Any]) -> [AnyHashable: Any] {
    func value(_ item: Any) -> Any {
        switch item {
        case let object as [String: Any]: hashable(object)
        case let list as [Any]: list.map(value)
        default: item
        }
    }
    return Dictionary(uniqueKeysWithValues: object.map { (AnyHashable($0.key), value($0.value)) })
}

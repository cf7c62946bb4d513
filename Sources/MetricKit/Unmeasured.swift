import Foundation

// Metrics Apple's payloads carry and the host does not measure (no GPU, no location, no
// launch or hang-time histograms, no animation). Declared so that app code reading them
// compiles unchanged; `MXMetricPayload`'s properties for them are always nil, as Apple's are
// for a payload without the data.

/// As Apple's: GPU time over the day (never delivered).
public final class MXGPUMetric: MXMetric, @unchecked Sendable {
    public let cumulativeGPUTime: Measurement<UnitDuration>

    init(_ dictionary: [String: Any], gpuTime: Measurement<UnitDuration>) {
        cumulativeGPUTime = gpuTime
        super.init(dictionary)
    }
}

/// As Apple's: time spent at each location accuracy (never delivered).
public final class MXLocationActivityMetric: MXMetric, @unchecked Sendable {
    public let cumulativeBestAccuracyTime: Measurement<UnitDuration>
    public let cumulativeBestAccuracyForNavigationTime: Measurement<UnitDuration>
    public let cumulativeNearestTenMetersAccuracyTime: Measurement<UnitDuration>
    public let cumulativeHundredMetersAccuracyTime: Measurement<UnitDuration>
    public let cumulativeKilometerAccuracyTime: Measurement<UnitDuration>
    public let cumulativeThreeKilometersAccuracyTime: Measurement<UnitDuration>

    override init(_ dictionary: [String: Any]) {
        let zero = Measurement(value: 0, unit: UnitDuration.seconds)
        cumulativeBestAccuracyTime = zero
        cumulativeBestAccuracyForNavigationTime = zero
        cumulativeNearestTenMetersAccuracyTime = zero
        cumulativeHundredMetersAccuracyTime = zero
        cumulativeKilometerAccuracyTime = zero
        cumulativeThreeKilometersAccuracyTime = zero
        super.init(dictionary)
    }
}

/// As Apple's: one bucket of a histogram.
public final class MXHistogramBucket<UnitType: Unit>: NSObject, @unchecked Sendable {
    public let bucketStart: Measurement<UnitType>
    public let bucketEnd: Measurement<UnitType>
    public let bucketCount: Int

    init(start: Measurement<UnitType>, end: Measurement<UnitType>, count: Int) {
        bucketStart = start
        bucketEnd = end
        bucketCount = count
        super.init()
    }
}

/// As Apple's: a histogram of values in one unit.
public final class MXHistogram<UnitType: Unit>: NSObject, @unchecked Sendable {
    private let buckets: [MXHistogramBucket<UnitType>]

    init(buckets: [MXHistogramBucket<UnitType>]) {
        self.buckets = buckets
        super.init()
    }

    public var totalBucketCount: Int { buckets.count }

    /// The buckets, as `MXHistogramBucket<UnitType>` objects.
    public var bucketEnumerator: NSEnumerator { NSArray(array: buckets).objectEnumerator() }
}

/// As Apple's: launch and resume times (never delivered).
public final class MXAppLaunchMetric: MXMetric, @unchecked Sendable {
    public let histogrammedTimeToFirstDraw: MXHistogram<UnitDuration>
    public let histogrammedApplicationResumeTime: MXHistogram<UnitDuration>
    public let histogrammedOptimizedTimeToFirstDraw: MXHistogram<UnitDuration>
    public let histogrammedExtendedLaunch: MXHistogram<UnitDuration>

    override init(_ dictionary: [String: Any]) {
        histogrammedTimeToFirstDraw = MXHistogram(buckets: [])
        histogrammedApplicationResumeTime = MXHistogram(buckets: [])
        histogrammedOptimizedTimeToFirstDraw = MXHistogram(buckets: [])
        histogrammedExtendedLaunch = MXHistogram(buckets: [])
        super.init(dictionary)
    }
}

/// As Apple's: how long the main thread was unresponsive (never delivered).
public final class MXAppResponsivenessMetric: MXMetric, @unchecked Sendable {
    public let histogrammedApplicationHangTime: MXHistogram<UnitDuration>

    override init(_ dictionary: [String: Any]) {
        histogrammedApplicationHangTime = MXHistogram(buckets: [])
        super.init(dictionary)
    }
}

/// As Apple's: scrolling hitches (never delivered).
public final class MXAnimationMetric: MXMetric, @unchecked Sendable {
    public let scrollHitchTimeRatio: Measurement<Unit>

    override init(_ dictionary: [String: Any]) {
        scrollHitchTimeRatio = Measurement(value: 0, unit: Unit(symbol: "ms per s"))
        super.init(dictionary)
    }
}

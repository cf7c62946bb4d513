import BGTaskControl
import BGTaskModel
import CoreMetrics
import Foundation
import Metrics
import Prometheus

/// /metrics (issue 32): what the host did, in Prometheus's text format, through swift-metrics'
/// API and its Prometheus backend (a registry of the dashboard's own: nothing is bootstrapped
/// process-wide). Names and labels follow Prometheus's conventions: `bgtask_` prefix, base units
/// (seconds, bytes), `_total` counters. Cardinality is bounded: the `app` label takes at most
/// `appLabelLimit` apps (the rest are `other`), `termination` and `state` are closed sets.
///
/// Counted as launches end (`record`); the gauges are read from the host at each scrape.
public final class DashboardMetrics: Sendable {
    public static let appLabelLimit = 200
    let registry = PrometheusCollectorRegistry()
    private let factory: PrometheusMetricsFactory
    /// The apps given their own label value, in the order first seen, up to the limit.
    private let labelled = LockedValue<Set<String>>([])

    private let expiryLateness: Metrics.Timer
    private let watchdogLateness: Metrics.Timer
    private let handlerLatency: Metrics.Timer
    private let launchDuration: Metrics.Timer
    private let storeCommit: Metrics.Timer

    public init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        // Lateness: from a millisecond to a second, where 5 ms is the target.
        factory.durationHistogramBuckets["bgtask_expiry_lateness_seconds"] = Self.latencyBuckets
        factory.durationHistogramBuckets["bgtask_watchdog_lateness_seconds"] = Self.latencyBuckets
        factory.durationHistogramBuckets["bgtask_handler_latency_seconds"] = Self.latencyBuckets
        factory.durationHistogramBuckets["bgtask_store_commit_seconds"] = [
            .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
            .milliseconds(10), .milliseconds(25), .milliseconds(100), .seconds(1),
        ]
        factory.durationHistogramBuckets["bgtask_launch_duration_seconds"] = [
            .milliseconds(10), .milliseconds(100), .seconds(1), .seconds(5), .seconds(30), .seconds(60), .seconds(300), .seconds(1800),
        ]
        self.factory = factory
        expiryLateness = Metrics.Timer(label: "bgtask_expiry_lateness_seconds", factory: factory)
        watchdogLateness = Metrics.Timer(label: "bgtask_watchdog_lateness_seconds", factory: factory)
        handlerLatency = Metrics.Timer(label: "bgtask_handler_latency_seconds", factory: factory)
        launchDuration = Metrics.Timer(label: "bgtask_launch_duration_seconds", factory: factory)
        storeCommit = Metrics.Timer(label: "bgtask_store_commit_seconds", factory: factory)
    }

    static let latencyBuckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
    ]

    /// A launch ended: counted by app and termination, its timings into the histograms.
    public func record(_ record: RunRecord) {
        let app = labelled.withLock { known in
            if known.contains(record.app) { return record.app }
            guard known.count < Self.appLabelLimit else { return "other" }
            known.insert(record.app)
            return record.app
        }
        Metrics.Counter(label: "bgtask_launches_total", dimensions: [("app", app), ("termination", record.termination.rawValue)], factory: factory)
            .increment()
        launchDuration.recordNanoseconds(Int64(record.wallMs * 1_000_000))
        // Expiry lateness: the budget's expiration sent after the budget's end.
        if let expired = record.expiredAtMs, record.expirationReason == nil, expired >= record.budgetMs {
            expiryLateness.recordNanoseconds(Int64((expired - record.budgetMs) * 1_000_000))
        }
        // Watchdog lateness: the kill after the grace's end (the record's end is the reap,
        // a little after the kill: an upper bound). The grace runs from the deadline, not from
        // when the expiration was sent: from the budget's end, or from a simulated or device
        // expiration's moment.
        if record.termination == .watchdog, let expired = record.expiredAtMs {
            let due = (record.expirationReason == nil ? record.budgetMs : expired) + record.graceMs
            if record.wallMs >= due { watchdogLateness.recordNanoseconds(Int64((record.wallMs - due) * 1_000_000)) }
        }
        // From the launch's start to its first handler.
        if let started = record.tasks.compactMap(\.startedMs).min() {
            handlerLatency.recordNanoseconds(Int64(started * 1_000_000))
        }
    }

    /// One write transaction of the host's store took `nanoseconds`, BEGIN to COMMIT.
    public func storeCommitted(nanoseconds: UInt64) {
        storeCommit.recordNanoseconds(Int64(clamping: nanoseconds))
    }

    /// The host's state now, as gauges: refreshed at each scrape.
    public func refresh(from source: any DashboardSource) {
        let running = source.answer(.running).running ?? []
        gauge("bgtask_running_launches").record(running.count)
        gauge("bgtask_running_memory_bytes").record(Int64(clamping: running.reduce(UInt64(0)) { $0 + ($1.residentBytes ?? 0) }))
        gauge("bgtask_pending_requests").record(source.answer(.pending()).pending?.count ?? 0)
        let apps = source.answer(.apps()).apps ?? []
        gauge("bgtask_apps").record(apps.count)
        gauge("bgtask_suspended_apps").record(apps.filter { $0.process == "suspended" }.count)
        var pushes: [String: Int] = [:]
        for push in source.answer(.pushes(limit: 1000)).pushes ?? [] { pushes[push.state.rawValue, default: 0] += 1 }
        for state in ["pending", "delivered", "dropped"] { gauge("bgtask_pushes", [("state", state)]).record(pushes[state] ?? 0) }
        var transfers: [String: Int] = [:]
        for transfer in source.answer(.transfers(limit: 1000)).transfers ?? [] { transfers[transfer.state.rawValue, default: 0] += 1 }
        for state in TransferState.allCases.map(\.rawValue) { gauge("bgtask_transfers", [("state", state)]).record(transfers[state] ?? 0) }
    }

    private func gauge(_ label: String, _ dimensions: [(String, String)] = []) -> Metrics.Gauge {
        Metrics.Gauge(label: label, dimensions: dimensions, factory: factory)
    }

    /// The text format, for /metrics.
    public func text() -> String { registry.emitToString() }
}

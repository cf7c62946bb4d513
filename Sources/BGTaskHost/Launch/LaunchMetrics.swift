import BGTaskControl
import BGTaskLaunch
import BGTaskStore
import BGTaskModel
import BGTaskSystem
import Dispatch
import Foundation
import Logging

extension LaunchCoordinator {
    /// The app's MetricKit payloads for its launch: the days that have ended and were not
    /// delivered yet, offered to the app's first launch of a day only (its other launches read
    /// nothing more on their path). They are delivered once the app takes them (its record's
    /// `metrics_delivered`, `metricsTaken`); a launch that does not (no subscriber, a crash before
    /// it subscribes) leaves them for the next day's first launch.
    func metricsJSON(for bundle: PluginBundle) -> String? {
        let today = EnergyBudget.day(of: core.clock.now)
        guard let oldest = undeliveredDays[bundle.identifier], oldest < today, metricsLookedFor[bundle.identifier] != today else { return nil }
        metricsLookedFor[bundle.identifier] = today
        do {
            guard let (days, diagnostics) = try core.store.undeliveredMetrics(app: bundle.identifier, before: today) else { return nil }
            let delivery = MetricDelivery(days: days, diagnostics: diagnostics, appVersion: bundle.shortVersion ?? "1.0", buildVersion: bundle.buildVersion ?? "1")
            return String(decoding: try MetricJSON.encoder.encode(delivery), as: UTF8.self)
        } catch {
            core.logger.error("cannot hand an app its metrics", metadata: ["bundle.id": "\(bundle.identifier)", "error": "\(error)"])
            return nil
        }
    }
}

extension LaunchCoordinator {
    /// The launch's app took the MetricKit days it was offered: they are delivered.
    func metricsTaken(_ record: RunRecord, offeredBefore day: Date) {
        // What is left is the day it was offered on (and later), if it had launches then.
        if let oldest = undeliveredDays[record.app], oldest < day { undeliveredDays[record.app] = day }
        do { try core.store.markMetricsDelivered(app: record.app, before: day) } catch {
            core.logger.error("cannot mark an app's metrics delivered", metadata: ["bundle.id": "\(record.app)", "error": "\(error)"])
        }
    }
}

extension LaunchCoordinator {
    /// A suspended process of `app` was evicted for memory pressure: counted with today's exits
    /// (MetricKit's memory-pressure exits), and today is a day its metrics are offered for.
    func evictedForMemoryPressure(_ app: String) {
        let today = EnergyBudget.day(of: core.clock.now)
        do {
            try core.store.countMemoryPressureExit(app: app, day: today)
            if (undeliveredDays[app] ?? .distantFuture) > today { undeliveredDays[app] = today }
        } catch {
            core.logger.error("cannot count a memory-pressure exit", metadata: ["bundle.id": "\(app)", "error": "\(error)"])
        }
    }
}

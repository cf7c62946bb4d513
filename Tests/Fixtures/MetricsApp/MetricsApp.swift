// An app that collects its MetricKit payloads as iOS apps do: a subscriber object, made when the
// app finishes launching, adds itself to the shared metric manager and forwards every payload it
// receives (here: prints it, where an app would upload it). Its refresh task gives the delivery
// a moment to arrive before it completes.
//
// The host's tests read its output: one line per payload,
//   metrics: payload <timeStampBegin, ISO 8601> <the payload's jsonRepresentation()>
//   metrics: diagnostics <the payload's jsonRepresentation()>
import BackgroundTasks
import Foundation
import MetricKit
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "MetricsApp") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    private let metrics = MetricsReporter()

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        metrics.start()
        BGTaskScheduler.shared.register(forTaskWithIdentifier: "com.example.metrics.refresh", using: nil) { task in
            self.handleRefresh(task as! BGAppRefreshTask)
        }
        return true
    }

    private func handleRefresh(_ task: BGAppRefreshTask) {
        let metrics = self.metrics
        DispatchQueue.global().async {
            let delivered = metrics.waitForDelivery(timeout: 2)
            print("metrics: refresh done, delivered \(delivered)")
            task.setTaskCompleted(success: true)
        }
    }
}

/// The app's MetricKit subscriber.
final class MetricsReporter: NSObject, MXMetricManagerSubscriber {
    private let delivery = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var received = false

    func start() {
        MXMetricManager.shared.add(self)
    }

    deinit {
        MXMetricManager.shared.remove(self)
    }

    func didReceive(_ payloads: [MXMetricPayload]) {
        let formatter = ISO8601DateFormatter()
        for payload in payloads {
            let json = String(data: payload.jsonRepresentation(), encoding: .utf8)!
            print("metrics: payload \(formatter.string(from: payload.timeStampBegin)) \(json)")
        }
        // The day's diagnostics, if it had any, come next (the manager keeps both before it
        // calls): the delivery is over when they have been printed too.
        if MXMetricManager.shared.pastDiagnosticPayloads.isEmpty { noteDelivery() }
    }

    func didReceive(_ payloads: [MXDiagnosticPayload]) {
        for payload in payloads {
            let json = String(data: payload.jsonRepresentation(), encoding: .utf8)!
            print("metrics: diagnostics \(json)")
        }
        noteDelivery()
    }

    /// True once a delivery has been printed, waiting up to `timeout` seconds for one.
    func waitForDelivery(timeout: TimeInterval) -> Bool {
        if lock.withLock({ received }) { return true }
        return delivery.wait(timeout: .now() + timeout) == .success || lock.withLock { received }
    }

    private func noteDelivery() {
        let first = lock.withLock { () -> Bool in
            defer { received = true }
            return !received
        }
        if first { delivery.signal() }
    }
}

import BGTaskABI
import BGTaskModel
import BackgroundTasks
import CBGTaskPluginABI
import Foundation

// Apple's MetricKit brings Foundation (Measurement, NSNumber, Data) into scope.
@_exported import Foundation

/// As Apple's: an object that receives the app's daily metrics and its diagnostics. Apple's
/// two methods are `@objc optional`; here both have empty defaults, so a subscriber implements
/// either or both. On iOS the protocol refines NSObjectProtocol; subscribers are NSObject
/// subclasses there and may be here, but need not be.
public protocol MXMetricManagerSubscriber: AnyObject {
    /// The day's metrics, one payload a day, on a background queue.
    func didReceive(_ payloads: [MXMetricPayload])
    /// The day's crashes, hangs and CPU exceptions, one payload a day, on a background queue.
    func didReceive(_ payloads: [MXDiagnosticPayload])
}

extension MXMetricManagerSubscriber {
    public func didReceive(_ payloads: [MXMetricPayload]) {}
    public func didReceive(_ payloads: [MXDiagnosticPayload]) {}
}

/// As Apple's: the shared object that hands the app its metrics and diagnostics.
///
/// The host keeps each app's use of the device by day (from its launches' run records) and
/// hands the days that have ended, with their diagnostics, to one launch of the app, once
/// (the ABI's `metric_payloads`). The first `add(_:)` in a process asks for them, makes one
/// `MXMetricPayload` a day and one `MXDiagnosticPayload` a day that had diagnostics, and calls
/// the subscribers with them on a background queue, as iOS delivers them off the main thread.
/// A subscriber added after that delivery receives nothing more in this process (the days were
/// delivered); `pastPayloads` and `pastDiagnosticPayloads` keep them. Both lists are kept
/// before any subscriber is called, and each subscriber gets the metric payloads first, then
/// the diagnostic payloads (each call made only when its list is not empty).
public final class MXMetricManager: NSObject, @unchecked Sendable {
    /// The app's metric manager.
    public static let shared = MXMetricManager()

    private let lock = NSLock()
    /// Held weakly, as Apple's manager does (apps remove themselves in `deinit`).
    private var subscribers: [WeakSubscriber] = []
    private var asked = false
    private var metricPayloads: [MXMetricPayload] = []
    private var diagnosticPayloads: [MXDiagnosticPayload] = []
    private let queue = DispatchQueue(label: "com.apple.metrickit.delivery", qos: .utility)

    private override init() {
        super.init()
    }

    /// The metric payloads delivered to this process (empty before the first delivery).
    public var pastPayloads: [MXMetricPayload] { lock.withLock { metricPayloads } }

    /// The diagnostic payloads delivered to this process (empty before the first delivery).
    public var pastDiagnosticPayloads: [MXDiagnosticPayload] { lock.withLock { diagnosticPayloads } }

    /// Adds a subscriber (once: adding it again does nothing). The first call in a process asks
    /// the host for the undelivered days and delivers them on a background queue, and so does
    /// each resume of the process for a new launch (the days that ended while it was suspended).
    public func add(_ subscriber: any MXMetricManagerSubscriber) {
        let first = lock.withLock { () -> Bool in
            subscribers.removeAll { $0.object == nil }
            if !subscribers.contains(where: { $0.object === subscriber }) {
                subscribers.append(WeakSubscriber(subscriber))
            }
            defer { asked = true }
            return !asked
        }
        guard first else { return }
        // A resumed process's new launch may bring the days that ended while it slept.
        HostConnection.current.whenResumed { [self] in queue.async { self.deliver() } }
        queue.async { self.deliver() }
    }

    /// Removes a subscriber; it receives nothing after this returns (a delivery under way may
    /// still be calling it).
    public func remove(_ subscriber: any MXMetricManagerSubscriber) {
        lock.withLock { subscribers.removeAll { $0.object == nil || $0.object === subscriber } }
    }

    // MARK: Delivery

    /// On the delivery queue: asks the host, makes the payloads, keeps them, and calls the
    /// subscribers registered now (later ones get nothing: the days are delivered).
    private func deliver() {
        guard let delivery = HostMetrics.delivery() else { return }
        let made = Payloads(delivery)
        let targets = lock.withLock { () -> [any MXMetricManagerSubscriber] in
            metricPayloads.append(contentsOf: made.metrics)
            diagnosticPayloads.append(contentsOf: made.diagnostics)
            return subscribers.compactMap(\.object)
        }
        for subscriber in targets {
            if !made.metrics.isEmpty { subscriber.didReceive(made.metrics) }
            if !made.diagnostics.isEmpty { subscriber.didReceive(made.diagnostics) }
        }
    }
}

private final class WeakSubscriber {
    weak var object: (any MXMetricManagerSubscriber)?
    init(_ object: any MXMetricManagerSubscriber) { self.object = object }
}

/// The payloads made from one delivery: one metric payload per day, one diagnostic payload per
/// day that had diagnostics (a diagnostic outside every day goes in one of its own UTC day).
struct Payloads {
    var metrics: [MXMetricPayload] = []
    var diagnostics: [MXDiagnosticPayload] = []

    init(_ delivery: MetricDelivery, device: MetricPayloadJSON.Device = .current()) {
        let days = delivery.days.sorted { $0.begin < $1.begin }
        metrics = days.map { MXMetricPayload(day: $0, appVersion: delivery.appVersion, buildVersion: delivery.buildVersion, device: device) }
        var periods: [(begin: Date, end: Date, diagnostics: [MetricDiagnostic])] = days.map { ($0.begin, $0.end, []) }
        for diagnostic in delivery.diagnostics.sorted(by: { $0.at < $1.at }) {
            if let index = periods.firstIndex(where: { $0.begin <= diagnostic.at && diagnostic.at <= $0.end }) {
                periods[index].diagnostics.append(diagnostic)
            } else {
                let begin = Date(timeIntervalSince1970: (diagnostic.at.timeIntervalSince1970 / 86_400).rounded(.down) * 86_400)
                periods.append((begin, begin.addingTimeInterval(86_399), [diagnostic]))
            }
        }
        diagnostics = periods.filter { !$0.diagnostics.isEmpty }.sorted { $0.begin < $1.begin }.map {
            MXDiagnosticPayload(diagnostics: $0.diagnostics, begin: $0.begin, end: $0.end, appVersion: delivery.appVersion,
                                buildVersion: delivery.buildVersion, device: device)
        }
    }
}

/// The manager's side of the ABI: `metric_payloads`, its JSON decoded.
enum HostMetrics {
    /// The host's undelivered days, or nil: outside a launch, with a host that has no such
    /// function, with nothing waiting, or with JSON that does not decode (one line on stderr).
    static func delivery() -> MetricDelivery? {
        guard let (api, host) = HostConnection.current.connection, api.has(\.metric_payloads) else { return nil }
        let collected = Collected()
        let status = api.metric_payloads(host, collect, Unmanaged.passUnretained(collected).toOpaque())
        let json = withExtendedLifetime(collected) { collected.json }
        guard status == Int32(BGTASK_OK.rawValue), let json else { return nil }
        do {
            return try MetricJSON.decoder.decode(MetricDelivery.self, from: json)
        } catch {
            let line = "MetricKit: nothing delivered: the host's metric payloads do not decode (\(String(describing: error).replacingOccurrences(of: "\n", with: " ")))\n"
            FileHandle.standardError.write(Data(line.utf8))
            return nil
        }
    }
}

/// What the visitor collects: the one JSON text.
private final class Collected {
    var json: Data?
}

private let collect: bgtask_json_visitor = { context, json in
    guard let context, let json else { return }
    Unmanaged<Collected>.fromOpaque(context).takeUnretainedValue().json = Data(bytes: json, count: strlen(json))
}

import BGTaskABI
import CBGTaskPluginABI
import Foundation

// The device's state as Apple's Foundation gives it on iOS (`ProcessInfo.thermalState`,
// `isLowPowerModeEnabled` and their notifications), which swift-corelibs-foundation does not
// have: here from the host, which reads the machine's thermal zones (or `bgtask device
// --thermal`, `--low-power`). Declared in this module, which app code imports beside
// Foundation, so that `ProcessInfo.processInfo.thermalState` compiles unchanged.
extension ProcessInfo {
    /// As Apple's: how hot the device runs. The host defers processing work at `serious`, runs
    /// no background work at `critical`, and expires a running background launch when the
    /// state turns critical.
    public enum ThermalState: Int, Sendable {
        case nominal, fair, serious, critical
    }

    /// The device's thermal state now; `.nominal` outside a launch.
    public var thermalState: ThermalState {
        guard let (api, host) = HostConnection.current.connection, api.has(\.thermal_state) else { return .nominal }
        return ThermalState(rawValue: Int(api.thermal_state(host))) ?? .nominal
    }

    /// Low Power Mode now (refresh tasks do not run while it is on); false outside a launch.
    public var isLowPowerModeEnabled: Bool {
        guard let (api, host) = HostConnection.current.connection, api.has(\.low_power_mode) else { return false }
        return api.low_power_mode(host)
    }

    /// Posted on the default center (object: `ProcessInfo.processInfo`), from a background
    /// queue as on iOS, when the thermal state changes during a launch, or changed while the
    /// app was suspended (as it resumes).
    public static let thermalStateDidChangeNotification = Notification.Name("NSProcessInfoThermalStateDidChangeNotification")
}

extension Notification.Name {
    /// Posted as `thermalStateDidChangeNotification` is, when Low Power Mode is turned on or off.
    public static let NSProcessInfoPowerStateDidChange = Notification.Name("NSProcessInfoPowerStateDidChangeNotification")
}

/// Turns the runner's device changes into Foundation notifications.
enum DeviceNotifications {
    private static let queue = DispatchQueue(label: "bgtask.device-notifications")
    private static let last = NSLock()
    nonisolated(unsafe) private static var known: (thermal: UInt32, lowPower: Bool) = (0, false)

    /// Called once the host's table is attached: remembers the state the launch began with and
    /// asks to hear of changes.
    static func follow(api: bgtask_host_api, host: OpaquePointer?) {
        guard api.has(\.set_device_handler), api.has(\.thermal_state), api.has(\.low_power_mode) else { return }
        last.withLock { known = (api.thermal_state(host), api.low_power_mode(host)) }
        api.set_device_handler(host, deviceChanged, nil)
    }

    /// On the runner's reader thread: posts what changed from a queue of its own (it must not block).
    fileprivate static func changed(thermal: UInt32, lowPower: Bool) {
        let before = last.withLock { () -> (thermal: UInt32, lowPower: Bool) in
            defer { known = (thermal, lowPower) }
            return known
        }
        queue.async {
            if before.thermal != thermal {
                NotificationCenter.default.post(name: ProcessInfo.thermalStateDidChangeNotification, object: ProcessInfo.processInfo)
            }
            if before.lowPower != lowPower {
                NotificationCenter.default.post(name: .NSProcessInfoPowerStateDidChange, object: ProcessInfo.processInfo)
            }
        }
    }
}

private let deviceChanged: bgtask_device_handler = { _, thermal, lowPower in DeviceNotifications.changed(thermal: thermal, lowPower: lowPower) }

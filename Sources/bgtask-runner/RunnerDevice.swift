import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Foundation

/// The device's thermal state and Low Power Mode as the app sees them
/// (`ProcessInfo.thermalState`, `isLowPowerModeEnabled`): the launch's, then what the host tells
/// of changes (`ParentMessage.device`), each change handed to the plugin's device handler.
extension Runner {
    var device: (thermalState: UInt32, lowPowerMode: Bool) {
        lock.withLock { (current.thermalState, current.lowPowerMode) }
    }

    func setDeviceHandler(_ handler: bgtask_device_handler?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { deviceHandler = handler.map { ($0, context) } }
    }

    /// On the reader thread: the host says the device changed.
    func deviceChanged(thermalState: UInt32, lowPowerMode: Bool) {
        // Only the four states exist: anything else from the channel is not a state.
        guard thermalState <= BGTASK_THERMAL_CRITICAL else { return }
        let changed: Bool = lock.withLock {
            guard current.thermalState != thermalState || current.lowPowerMode != lowPowerMode else { return false }
            current.thermalState = thermalState
            current.lowPowerMode = lowPowerMode
            return true
        }
        if changed { tellDevice() }
    }

    /// Calls the plugin's device handler with the state now.
    func tellDevice() {
        let (handler, state) = lock.withLock { (deviceHandler, (current.thermalState, current.lowPowerMode)) }
        if let (handler, context) = handler { handler(context, state.0, state.1) }
    }
}

/// Notifications delivered while the app is in the foreground: handed to the plugin's handler
/// (`set_notification_handler`; UserNotifications calls the delegate's `willPresent`).
extension Runner {
    func setNotificationHandler(_ handler: bgtask_json_visitor?, _ context: UnsafeMutableRawPointer?) {
        lock.withLock { notificationHandler = handler.map { ($0, context) } }
    }

    /// On the reader thread.
    func notificationDelivered(_ entry: NotificationEntry) {
        guard let (handler, context) = lock.withLock({ notificationHandler }) else {
            // No one to ask: presented as an app without a delegate's answer would be, not at all.
            report(.notificationPresented(identifier: entry.request.identifier, options: 0))
            return
        }
        let json = Data("{\"date\":\(entry.date ?? 0),\"request\":".utf8) + entry.request.json() + Data("}".utf8)
        (json + [0]).withUnsafeBytes { handler(context, $0.baseAddress!.assumingMemoryBound(to: CChar.self)) }
    }
}

/// MetricKit's payloads: the launch's, given once.
extension Runner {
    func takeMetrics() -> String? {
        lock.withLock {
            defer { current.metricsJSON = nil }
            return current.metricsJSON
        }
    }
}

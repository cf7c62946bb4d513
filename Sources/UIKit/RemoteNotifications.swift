import BGTaskABI
import BackgroundTasks
import CBGTaskPluginABI
import Foundation

extension UIApplication {
    /// Asks the host for the app's device token; the delegate's
    /// `application(_:didRegisterForRemoteNotificationsWithDeviceToken:)` gets it (32 bytes, stable
    /// for the app across launches and host restarts), or
    /// `application(_:didFailToRegisterForRemoteNotificationsWithError:)` the reason, on the main
    /// queue. Providers address the app with the token (`bgtask push`, the APNs endpoint).
    public func registerForRemoteNotifications() {
        let application = self
        guard let (api, connectionHost) = HostConnection.current.connection, api.has(\.register_remote_notifications) else {
            DispatchQueue.main.async { MainActor.assumeIsolated {
                application.delegate?.application(application, didFailToRegisterForRemoteNotificationsWithError: RemoteNotificationError("not running in a bgtask launch"))
            } }
            return
        }
        // The host answers over the launch channel: off the main thread, then back to it.
        nonisolated(unsafe) let host = connectionHost
        DispatchQueue.global().async {
            var buffer = [CChar](repeating: 0, count: 256)
            let status = api.register_remote_notifications(host, &buffer, buffer.count)
            let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            DispatchQueue.main.async { MainActor.assumeIsolated {
                application.registeredForRemoteNotifications = status == 0
                if status == 0, let token = Data(hex: text) {
                    application.delegate?.application(application, didRegisterForRemoteNotificationsWithDeviceToken: token)
                } else {
                    application.delegate?.application(application, didFailToRegisterForRemoteNotificationsWithError: RemoteNotificationError(text.isEmpty ? "status \(status)" : text))
                }
            } }
        }
    }

    /// Stops pushes reaching the app until it registers again (as far as the app can tell: the
    /// token stays the app's).
    public func unregisterForRemoteNotifications() { registeredForRemoteNotifications = false }

    /// Whether `registerForRemoteNotifications()` succeeded in this launch.
    public var isRegisteredForRemoteNotifications: Bool { registeredForRemoteNotifications }
}

/// Why registration failed.
public struct RemoteNotificationError: Error, CustomStringConvertible, Sendable {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// A push launch's delivery to the app delegate.
@MainActor
enum RemoteNotification {
    /// The payload as `userInfo`, or nil when it is not a JSON object.
    nonisolated static func userInfo(_ json: String?) -> [AnyHashable: Any]? {
        guard let json, let object = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] else { return nil }
        return Dictionary(uniqueKeysWithValues: object.map { (AnyHashable($0.key), $0.value) })
    }

    /// Calls `application(_:didReceiveRemoteNotification:fetchCompletionHandler:)` on the main
    /// queue. The launch lasts until the completion handler is called (background time named
    /// "remote-notification"), within the push's 30 s; its result goes in the run record.
    static func deliver(_ userInfo: [AnyHashable: Any], to delegate: any UIApplicationDelegate, of application: UIApplication) {
        let assertion = application.beginBackgroundTask(withName: "remote-notification")
        let once = OnceFlag()
        nonisolated(unsafe) let payload = userInfo
        DispatchQueue.main.async {
            MainActor.assumeIsolated {
                delegate.application(application, didReceiveRemoteNotification: payload) { result in
                    guard once.first() else { return }
                    if let (api, host) = HostConnection.current.connection, api.has(\.remote_notification_completed) {
                        api.remote_notification_completed(host, UInt32(result.rawValue))
                    }
                    application.endBackgroundTask(assertion)
                }
            }
        }
    }
}


extension Data {
    /// Bytes from hex digits, or nil.
    init?(hex: String) {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0, !digits.isEmpty else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = Self.nibble(digits[index]), let low = Self.nibble(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        self.init(bytes)
    }

    private static func nibble(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

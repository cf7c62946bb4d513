// A podcast app's push handling, as iOS apps write it: it registers for remote notifications
// (and hands its token to its server), and a background push ("content-available": 1) makes it
// fetch the new episode in application(_:didReceiveRemoteNotification:fetchCompletionHandler:).
import BackgroundTasks
import Foundation
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "PushApp") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    private var registration: BGTask?

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        if let push = launchOptions?[.remoteNotification] as? [AnyHashable: Any] {
            print("pushapp: launched for a push, episode \(push["episode"] ?? "-")")
        }
        _ = BGTaskScheduler.shared.register(forTaskWithIdentifier: "com.example.pushapp.register", using: .main) { task in
            self.registration = task
            UIApplication.shared.registerForRemoteNotifications()
        }
        return true
    }

    func application(_ application: UIApplication, didRegisterForRemoteNotificationsWithDeviceToken deviceToken: Data) {
        let token = deviceToken.map { String(format: "%02x", $0) }.joined()
        print("pushapp: token \(token), registered \(application.isRegisteredForRemoteNotifications)")
        registration?.setTaskCompleted(success: true)
    }

    func application(_ application: UIApplication, didFailToRegisterForRemoteNotificationsWithError error: Error) {
        print("pushapp: registration failed: \(error)")
        registration?.setTaskCompleted(success: false)
    }

    func application(_ application: UIApplication, didReceiveRemoteNotification userInfo: [AnyHashable: Any],
                     fetchCompletionHandler completionHandler: @escaping (UIBackgroundFetchResult) -> Void) {
        let aps = userInfo["aps"] as? [String: Any]
        print("pushapp: push episode \(userInfo["episode"] ?? "-"), content-available \(aps?["content-available"] ?? "-"), state \(application.applicationState.rawValue), main \(Thread.isMainThread)")
        if userInfo["hang"] as? Bool == true { return } // never calls its completion handler
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.05) {
            completionHandler(.newData)
            completionHandler(.failed) // a second call is ignored
        }
    }
}

import BGTaskModel
import BackgroundTasks
import Foundation

/// The app delegate's entry points the host calls. Every method has a default that does nothing
/// (Apple's are `optional`), so a delegate implements only what it uses; a method whose
/// signature differs from Apple's is not called, so copy them as Apple declares them.
@MainActor
public protocol UIApplicationDelegate: NSObjectProtocol {
    /// Before `didFinishLaunchingWithOptions`.
    func application(_ application: UIApplication, willFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool
    /// Once per launch, on the main thread, before any task starts: register launch handlers here.
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool
    /// A background push (`"content-available": 1`): call `completionHandler` when done.
    func application(_ application: UIApplication, didReceiveRemoteNotification userInfo: [AnyHashable: Any],
                     fetchCompletionHandler completionHandler: @escaping @Sendable (UIBackgroundFetchResult) -> Void)
    /// The app's device token for pushes, after `registerForRemoteNotifications()`.
    func application(_ application: UIApplication, didRegisterForRemoteNotificationsWithDeviceToken deviceToken: Data)
    func application(_ application: UIApplication, didFailToRegisterForRemoteNotificationsWithError error: any Error)
    /// Events of a background URL session are waiting: keep `completionHandler`, recreate the
    /// session with `identifier`, and call it from `urlSessionDidFinishEvents(forBackgroundURLSession:)`.
    func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String,
                     completionHandler: @escaping @Sendable () -> Void)
    /// A foreground launch (`bgtask open`) became active, after launching (or after
    /// `applicationWillEnterForeground`, when it resumed the app's suspended process).
    func applicationDidBecomeActive(_ application: UIApplication)
    /// A foreground launch (`bgtask open`) resumed the app's suspended process: the app is
    /// coming back to the foreground (`didFinishLaunching` is not called again).
    func applicationWillEnterForeground(_ application: UIApplication)
    /// The app's process is ending while it runs (with `--app-lifecycle fresh`, at the end of
    /// every launch; as on iOS, a suspended app that is evicted is not told).
    func applicationWillTerminate(_ application: UIApplication)
    /// A foreground launch is leaving the foreground: `applicationWillResignActive`, then
    /// `applicationDidEnterBackground`, where an app takes background time to finish its work.
    func applicationWillResignActive(_ application: UIApplication)
    func applicationDidEnterBackground(_ application: UIApplication)
}

extension UIApplicationDelegate {
    public func application(_ application: UIApplication, willFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool { true }
    public func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool { true }
    public func application(_ application: UIApplication, didReceiveRemoteNotification userInfo: [AnyHashable: Any],
                            fetchCompletionHandler completionHandler: @escaping @Sendable (UIBackgroundFetchResult) -> Void) {
        completionHandler(.noData)
    }
    public func application(_ application: UIApplication, didRegisterForRemoteNotificationsWithDeviceToken deviceToken: Data) {}
    public func application(_ application: UIApplication, didFailToRegisterForRemoteNotificationsWithError error: any Error) {}
    public func applicationDidBecomeActive(_ application: UIApplication) {}
    public func applicationWillEnterForeground(_ application: UIApplication) {}
    public func applicationWillTerminate(_ application: UIApplication) {}
    public func applicationWillResignActive(_ application: UIApplication) {}
    public func applicationDidEnterBackground(_ application: UIApplication) {}
    /// Without it, the launch ends once the session's waiting events are delivered (when the app
    /// makes the session) or when its time runs out.
    public func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String,
                            completionHandler: @escaping @Sendable () -> Void) {}
}

extension UIApplication {
    /// The plugin entry of an app written around an app delegate, in UIApplicationMain's place:
    ///
    /// ```swift
    /// @_cdecl("bgtask_plugin_entry")
    /// public func bgtaskPluginEntry() -> UnsafeRawPointer {
    ///     UIApplication.entry(name: "Podcasts") { AppDelegate() }
    /// }
    /// ```
    ///
    /// The process's first launch makes the delegate on the main thread, sets it as
    /// `UIApplication.shared.delegate`, and calls `application(_:willFinishLaunchingWithOptions:)`
    /// then `application(_:didFinishLaunchingWithOptions:)` (where it registers its launch
    /// handlers), as iOS does for a background launch. A launch that resumes the app's suspended
    /// process calls neither: the same delegate hears what the new launch brings (coming to the
    /// foreground, a push, a background session's events), as a resumed app does on iOS.
    public nonisolated static func entry(name: String, delegate makeDelegate: @escaping @MainActor () -> any UIApplicationDelegate) -> UnsafeRawPointer {
        BGTaskPlugin.entry(name: name, didFinishLaunching: { launch in
            let application = UIApplication.shared
            // Before the app can make its sessions: their ends wait for handleEvents.
            let transfers = launch.reason == LaunchReason.backgroundTransfer.rawValue ? BackgroundTransferLaunch.sessions(launch.eventJSON) : []
            BackgroundSessions.shared.holdEvents(transfers)
            let delegate = makeDelegate()
            application.delegate = delegate
            let push = launch.reason == LaunchReason.remoteNotification.rawValue ? RemoteNotification.userInfo(launch.eventJSON) : nil
            let options = push.map { [UIApplication.LaunchOptionsKey.remoteNotification: $0 as Any] }
            // Their Bool is for URL launches on iOS; a background launch goes on either way.
            _ = delegate.application(application, willFinishLaunchingWithOptions: options)
            _ = delegate.application(application, didFinishLaunchingWithOptions: options)
            ApplicationState.follow(delegate, of: application)
            if launch.role == .foreground { ApplicationState.becameActive(delegate, of: application) }
            if let push { RemoteNotification.deliver(push, to: delegate, of: application) }
            BackgroundTransferLaunch.deliver(transfers, to: delegate, of: application)
            HostConnection.current.launched(reason: launch.reason, eventJSON: launch.eventJSON)
        }, didResume: { launch in
            let application = UIApplication.shared
            let transfers = launch.reason == LaunchReason.backgroundTransfer.rawValue ? BackgroundTransferLaunch.sessions(launch.eventJSON) : []
            BackgroundSessions.shared.resumed(holding: transfers)
            guard let delegate = application.delegate else { return }
            if launch.role == .foreground {
                delegate.applicationWillEnterForeground(application)
                NotificationCenter.default.post(name: UIApplication.willEnterForegroundNotification, object: application)
                ApplicationState.becameActive(delegate, of: application)
            }
            if launch.reason == LaunchReason.remoteNotification.rawValue, let push = RemoteNotification.userInfo(launch.eventJSON) {
                RemoteNotification.deliver(push, to: delegate, of: application)
            }
            BackgroundTransferLaunch.deliver(transfers, to: delegate, of: application)
            HostConnection.current.launched(reason: launch.reason, eventJSON: launch.eventJSON)
        })
    }
}

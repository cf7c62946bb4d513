import BGTaskABI
import BackgroundTasks
import CBGTaskPluginABI
import Foundation

extension UIApplication {
    /// Posted as on iOS when a foreground launch becomes active and when it leaves the foreground.
    public nonisolated static let didBecomeActiveNotification = Notification.Name("UIApplicationDidBecomeActiveNotification")
    public nonisolated static let willResignActiveNotification = Notification.Name("UIApplicationWillResignActiveNotification")
    public nonisolated static let didEnterBackgroundNotification = Notification.Name("UIApplicationDidEnterBackgroundNotification")
    public nonisolated static let willEnterForegroundNotification = Notification.Name("UIApplicationWillEnterForegroundNotification")
    public nonisolated static let willTerminateNotification = Notification.Name("UIApplicationWillTerminateNotification")
}

/// The app's state changes, told to its delegate and posted on the default notification center
/// on the main queue: a foreground launch (`bgtask open`) becomes active after launching, and
/// resigns active then enters the background when it leaves the foreground. The transition runs
/// under background time of its own, so the launch cannot end before the delegate has had the
/// chance to ask for more (`beginBackgroundTask` in `applicationDidEnterBackground`).
@MainActor
enum ApplicationState {
    private nonisolated(unsafe) static var follower: (delegate: any UIApplicationDelegate, application: UIApplication)?

    static func becameActive(_ delegate: any UIApplicationDelegate, of application: UIApplication) {
        DispatchQueue.main.async {
            MainActor.assumeIsolated {
                delegate.applicationDidBecomeActive(application)
                NotificationCenter.default.post(name: UIApplication.didBecomeActiveNotification, object: application)
            }
        }
    }

    static func follow(_ delegate: any UIApplicationDelegate, of application: UIApplication) {
        guard let (api, host) = HostConnection.current.connection, api.has(\.set_state_handler) else { return }
        follower = (delegate, application)
        api.set_state_handler(host, stateChanged, nil)
    }

    /// On the runner's reader thread, before the launch may end.
    nonisolated fileprivate static func changed(to state: UInt32) {
        if state == UInt32(BGTASK_APP_STATE_TERMINATING), let (delegate, application) = follower {
            // On the main thread, just before the process ends (a fresh launch's end).
            nonisolated(unsafe) let target = (delegate, application)
            MainActor.assumeIsolated {
                let (delegate, application) = target
                delegate.applicationWillTerminate(application)
                NotificationCenter.default.post(name: UIApplication.willTerminateNotification, object: application)
            }
            return
        }
        guard state == UInt32(BGTASK_APP_STATE_BACKGROUND), let (delegate, application) = follower else { return }
        let transition = application.beginBackgroundTask(withName: "enter-background")
        nonisolated(unsafe) let target = (delegate, application)
        DispatchQueue.main.async {
            MainActor.assumeIsolated {
                let (delegate, application) = target
                delegate.applicationWillResignActive(application)
                NotificationCenter.default.post(name: UIApplication.willResignActiveNotification, object: application)
                delegate.applicationDidEnterBackground(application)
                NotificationCenter.default.post(name: UIApplication.didEnterBackgroundNotification, object: application)
                application.endBackgroundTask(transition)
            }
        }
    }
}

private let stateChanged: bgtask_state_handler = { _, state in ApplicationState.changed(to: state) }

// An app written around an app delegate, as iOS apps are, that asks for background time the
// ways public apps do (beginBackgroundTask around work that outlives its task, an expiration
// handler that ends the assertion, one that forgets to), and prints what UIApplication says.
import BackgroundTasks
import Foundation
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "BackgroundTime") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        print("bgtime: didFinishLaunching, delegate set: \(application.delegate === self)")
        let scheduler = BGTaskScheduler.shared
        // The task ends at once; the upload it started goes on under background time.
        _ = scheduler.register(forTaskWithIdentifier: "com.example.bgtime.linger", using: nil) { task in
            let upload = UIApplication.shared.beginBackgroundTask(withName: "upload") {
                print("bgtime: linger expired")
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) {
                print("bgtime: upload done")
                UIApplication.shared.endBackgroundTask(upload)
            }
            task.setTaskCompleted(success: true)
        }
        // The common pattern: end the assertion in its own expiration handler.
        _ = scheduler.register(forTaskWithIdentifier: "com.example.bgtime.expire", using: nil) { task in
            var identifier = UIBackgroundTaskIdentifier.invalid
            identifier = UIApplication.shared.beginBackgroundTask(withName: "sync") {
                print("bgtime: sync expired on the main thread: \(Thread.isMainThread)")
                UIApplication.shared.endBackgroundTask(identifier)
                identifier = .invalid
            }
            task.setTaskCompleted(success: true)
        }
        // Forgets to end it: the launch is killed at the end of the grace, as iOS kills the app.
        _ = scheduler.register(forTaskWithIdentifier: "com.example.bgtime.hold", using: nil) { task in
            _ = UIApplication.shared.beginBackgroundTask {
                print("bgtime: hold expired, not ending it")
            }
            task.setTaskCompleted(success: true)
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.bgtime.state", using: nil) { task in
            let app = UIApplication.shared
            print("bgtime: state \(app.applicationState.rawValue), refresh \(app.backgroundRefreshStatus.rawValue), remaining \(app.backgroundTimeRemaining)")
            let first = app.beginBackgroundTask(expirationHandler: nil)
            let second = app.beginBackgroundTask(withName: nil)
            print("bgtime: identifiers \(first.rawValue) \(second.rawValue), invalid \(UIBackgroundTaskIdentifier.invalid.rawValue)")
            app.endBackgroundTask(second)
            app.endBackgroundTask(second)
            app.endBackgroundTask(.invalid)
            app.endBackgroundTask(first)
            task.setTaskCompleted(success: true)
        }
        return true
    }

    // An opened app (`bgtask open`): active after launching; when it leaves the foreground it
    // saves its work under background time taken in applicationDidEnterBackground, the classic
    // pattern.
    func applicationDidBecomeActive(_ application: UIApplication) {
        print("bgtime: didBecomeActive, state \(application.applicationState.rawValue)")
        NotificationCenter.default.addObserver(forName: UIApplication.didEnterBackgroundNotification, object: nil, queue: nil) { _ in
            print("bgtime: didEnterBackgroundNotification")
        }
    }

    func applicationWillResignActive(_ application: UIApplication) {
        print("bgtime: willResignActive")
    }

    func applicationDidEnterBackground(_ application: UIApplication) {
        print("bgtime: didEnterBackground, state \(application.applicationState.rawValue), remaining under 60 s: \(application.backgroundTimeRemaining < 60)")
        let save = application.beginBackgroundTask(withName: "save")
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) {
            print("bgtime: saved")
            UIApplication.shared.endBackgroundTask(save)
        }
    }
}

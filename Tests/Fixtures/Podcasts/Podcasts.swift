// A podcast app, as public apps are written: its refresh downloads new episodes and posts the
// "new episodes downloaded" notification, asking for authorization first; other tasks list,
// remove and misuse notifications the ways apps do (and should not).
import BackgroundTasks
import Foundation
import UIKit
import UserNotifications

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Podcasts") { AppDelegate() }
}

/// Prints a line the tests read from the launch's log (flushed: the launch may be killed).
func say(_ text: String) {
    print("podcasts: \(text)")
    fflush(nil)
}

final class AppDelegate: UIResponder, UIApplicationDelegate, UNUserNotificationCenterDelegate {
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        UNUserNotificationCenter.current().delegate = self
        let scheduler = BGTaskScheduler.shared
        _ = scheduler.register(forTaskWithIdentifier: "com.example.podcasts.refresh", using: nil) { task in
            Task {
                await Self.refresh()
                task.setTaskCompleted(success: true)
            }
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.podcasts.list", using: nil) { task in
            Task {
                await Self.list()
                task.setTaskCompleted(success: true)
            }
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.podcasts.remove", using: nil) { task in
            let center = UNUserNotificationCenter.current()
            center.removePendingNotificationRequests(withIdentifiers: ["listen-later", "unknown"])
            center.removeDeliveredNotifications(withIdentifiers: ["new-episodes"])
            Task {
                await Self.list()
                center.removeAllPendingNotificationRequests()
                center.removeAllDeliveredNotifications()
                await Self.list()
                task.setTaskCompleted(success: true)
            }
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.podcasts.hostile", using: nil) { task in
            Task {
                await Self.hostile()
                task.setTaskCompleted(success: true)
            }
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.podcasts.calendar", using: nil) { task in
            let content = UNMutableNotificationContent()
            content.title = "Morning digest"
            var components = DateComponents()
            components.hour = 8
            components.minute = 30
            let request = UNNotificationRequest(identifier: "digest", content: content,
                                                trigger: UNCalendarNotificationTrigger(dateMatching: components, repeats: true))
            // The completion-handler form, as older apps write it.
            UNUserNotificationCenter.current().add(request) { error in
                say("calendar add: \(error.map { "\($0)" } ?? "ok")")
                UNUserNotificationCenter.current().getPendingNotificationRequests { requests in
                    let trigger = requests.first?.trigger as? UNCalendarNotificationTrigger
                    say("calendar pending: \(requests.map(\.identifier)), hour \(trigger?.dateComponents.hour ?? -1), repeats \(trigger?.repeats ?? false), next \(trigger?.nextTriggerDate() != nil)")
                    task.setTaskCompleted(success: true)
                }
            }
        }
        return true
    }

    /// A notification arrives while the app is in the foreground: shown as a banner with its
    /// sound, as a podcast app wants new episodes seen.
    nonisolated func userNotificationCenter(_ center: UNUserNotificationCenter, willPresent notification: UNNotification,
                                            withCompletionHandler completionHandler: @escaping (UNNotificationPresentationOptions) -> Void) {
        say("will present \(notification.request.identifier) in state \(UIApplication.shared.applicationState.rawValue)")
        completionHandler([.banner, .sound])
    }

    /// The user opened a notification: the app shows what it is about (here: says so), and
    /// calls the completion handler once it has, as apps do after an async hop.
    /// (`nonisolated`, as Swift 6 app code writes it: the protocol's methods are not the main
    /// actor's, the app delegate is.)
    nonisolated func userNotificationCenter(_ center: UNUserNotificationCenter, didReceive response: UNNotificationResponse,
                                            withCompletionHandler completionHandler: @escaping () -> Void) {
        let request = response.notification.request
        say("opened notification \(request.identifier) (\(request.content.title)) action \(response.actionIdentifier) state \(UIApplication.shared.applicationState.rawValue)")
        nonisolated(unsafe) let done = completionHandler
        DispatchQueue.main.asyncAfter(deadline: .now() + 0.2) {
            say("handled the response")
            done()
        }
    }

    /// What a refresh does: new episodes, then the banner, if the user allows it.
    static func refresh() async {
        let center = UNUserNotificationCenter.current()
        let before = await center.notificationSettings()
        say("status before asking: \(before.authorizationStatus.rawValue)")
        let granted = (try? await center.requestAuthorization(options: [.alert, .sound, .badge])) ?? false
        let settings = await center.notificationSettings()
        say("granted \(granted), status \(settings.authorizationStatus.rawValue), alert \(settings.alertSetting.rawValue)")
        let content = UNMutableNotificationContent()
        content.title = "New episodes"
        content.subtitle = "Swift by the Sea"
        content.body = "3 new episodes downloaded"
        content.badge = 3
        content.sound = .default
        content.threadIdentifier = "com.example.podcasts.show.42"
        content.categoryIdentifier = "NEW_EPISODES"
        content.userInfo = ["show": 42, "episodes": ["e1", "e2", "e3"], "explicit": false]
        let request = UNNotificationRequest(identifier: "new-episodes", content: content,
                                            trigger: UNTimeIntervalNotificationTrigger(timeInterval: 60, repeats: false))
        do {
            try await center.add(request)
            say("added new-episodes")
        } catch let error as UNError where error.code == .notificationsNotAllowed {
            say("not allowed: UNError \(error.code.rawValue) \(UNErrorDomain)")
        } catch {
            say("add failed: \(error)")
        }
        let later = UNMutableNotificationContent()
        later.title = "Listen later"
        later.body = "Your queue has 3 episodes"
        do {
            try await center.add(UNNotificationRequest(identifier: "listen-later", content: later,
                                                       trigger: UNTimeIntervalNotificationTrigger(timeInterval: 3600, repeats: true)))
        } catch UNError.notificationsNotAllowed {
            say("listen-later not allowed")
        } catch {
            say("listen-later failed: \(error)")
        }
        let pending = await center.pendingNotificationRequests()
        say("pending after refresh: \(pending.map(\.identifier))")
    }

    static func list() async {
        let center = UNUserNotificationCenter.current()
        let pending = await center.pendingNotificationRequests()
        say("pending: \(pending.map(\.identifier))")
        let delivered = await center.deliveredNotifications()
        say("delivered: \(delivered.map(\.request.identifier))")
        if let first = delivered.first(where: { $0.request.identifier == "new-episodes" }) {
            let content = first.request.content
            let episodes = content.userInfo["episodes"] as? [Any]
            say("delivered content: \(content.title) / \(content.subtitle) / \(content.body) / badge \(content.badge?.intValue ?? -1) / sound \(content.sound == .default) / thread \(content.threadIdentifier) / show \(content.userInfo["show"] as? Int ?? -1) / episodes \(episodes?.count ?? -1) / delivered \(Int((-first.date.timeIntervalSinceNow / 3600).rounded()))h ago")
        }
    }

    /// Misuse: content over the limits, a userInfo JSON cannot hold, more than 64 pending
    /// requests, components no date matches.
    static func hostile() async {
        let center = UNUserNotificationCenter.current()
        let big = UNMutableNotificationContent()
        big.title = "Big"
        big.body = String(repeating: "x", count: 5000)
        do {
            try await center.add(UNNotificationRequest(identifier: "big", content: big, trigger: nil))
            say("big: added")
        } catch {
            say("big: \((error as NSError).domain) \((error as NSError).code) \(error.localizedDescription)")
        }
        let dated = UNMutableNotificationContent()
        dated.title = "Dated"
        dated.userInfo = ["when": Date()]
        do {
            try await center.add(UNNotificationRequest(identifier: "dated", content: dated, trigger: nil))
            say("dated: added")
        } catch {
            say("dated: \((error as NSError).code) \(error.localizedDescription)")
        }
        var never = DateComponents()
        never.month = 2
        never.day = 30
        do {
            try await center.add(UNNotificationRequest(identifier: "never", content: UNMutableNotificationContent(),
                                                       trigger: UNCalendarNotificationTrigger(dateMatching: never, repeats: false)))
            say("never: added")
        } catch let error as UNError {
            say("never: UNError \(error.code.rawValue)")
        } catch {
            say("never: \(error)")
        }
        for index in 0..<70 {
            let content = UNMutableNotificationContent()
            content.title = "Reminder \(index)"
            // The later an index, the later it fires: the last six are the ones discarded.
            try? await center.add(UNNotificationRequest(identifier: "reminder-\(index)", content: content,
                                                        trigger: UNTimeIntervalNotificationTrigger(timeInterval: Double(100 + index), repeats: false)))
        }
        let pending = await center.pendingNotificationRequests()
        say("pending count \(pending.count), first \(pending.first?.identifier ?? "-"), last \(pending.last?.identifier ?? "-")")
    }
}

// Weather: local notifications. The app's background refresh fetches the forecast and, when rain
// is coming, tells the user with a notification, asking for permission first
// (UNUserNotificationCenter's requestAuthorization, then add). The host keeps and delivers it
// (`bgtask notifications`); the operator decides permission (`bgtask device --notifications`).
import BackgroundTasks
import UIKit
import UserNotifications

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Weather") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    static let refreshIdentifier = "com.example.weather.refresh"

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.refreshIdentifier, using: nil) { task in
            self.handleAppRefresh(task: task as! BGAppRefreshTask)
        }
        return true
    }

    func applicationDidEnterBackground(_ application: UIApplication) {
        scheduleAppRefresh()
    }

    func scheduleAppRefresh() {
        let request = BGAppRefreshTaskRequest(identifier: Self.refreshIdentifier)
        request.earliestBeginDate = Date(timeIntervalSinceNow: 60 * 60)
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { print("weather: could not schedule a refresh: \(error)") }
        }
    }

    func handleAppRefresh(task: BGAppRefreshTask) {
        scheduleAppRefresh()
        let work = Task {
            let forecast = await Forecast.fetch()
            print("weather: \(forecast.summary)")
            if forecast.rainInHours != nil { await notifyRain(forecast) }
            task.setTaskCompleted(success: !Task.isCancelled)
        }
        task.expirationHandler = { work.cancel() }
    }

    func notifyRain(_ forecast: Forecast) async {
        let center = UNUserNotificationCenter.current()
        do {
            guard try await center.requestAuthorization(options: [.alert, .sound]) else {
                print("weather: notifications are not allowed")
                return
            }
            let content = UNMutableNotificationContent()
            content.title = "Rain expected"
            content.body = forecast.summary
            content.sound = .default
            // No trigger: shown now. (A UNTimeIntervalNotificationTrigger would show it later.)
            try await center.add(UNNotificationRequest(identifier: "rain-alert", content: content, trigger: nil))
            print("weather: notified \"\(content.title)\"")
        } catch {
            print("weather: could not notify: \(error)")
        }
    }
}

struct Forecast {
    var rainInHours: Int?
    var summary: String {
        rainInHours.map { "rain in \($0) hours, take an umbrella" } ?? "dry all day"
    }

    /// Stands in for the weather service's API.
    static func fetch() async -> Forecast {
        try? await Task.sleep(nanoseconds: 50_000_000)
        return Forecast(rainInHours: 2)
    }
}

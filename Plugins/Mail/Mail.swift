// Mail: background pushes. The app registers for remote notifications and hands its device
// token to its mail server; when mail arrives, the server sends a background push
// ("content-available": 1) and the system launches the app to fetch the new messages before the
// user looks (`bgtask push`, or a provider through the host's APNs endpoint).
import BackgroundTasks
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Mail") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        // At every launch, as Apple advises: the token may change.
        application.registerForRemoteNotifications()
        return true
    }

    func application(_ application: UIApplication, didRegisterForRemoteNotificationsWithDeviceToken deviceToken: Data) {
        let token = deviceToken.map { String(format: "%02x", $0) }.joined()
        print("mail: registered for pushes, token \(token.prefix(16))… (sent to the mail server)")
    }

    func application(_ application: UIApplication, didFailToRegisterForRemoteNotificationsWithError error: Error) {
        print("mail: could not register for pushes: \(error)")
    }

    /// A background push: fetch what changed, then say whether there was new data. The launch
    /// lasts until the completion handler is called (at most 30 s).
    func application(_ application: UIApplication, didReceiveRemoteNotification userInfo: [AnyHashable: Any],
                     fetchCompletionHandler completionHandler: @escaping @Sendable (UIBackgroundFetchResult) -> Void) {
        let mailbox = userInfo["mailbox"] as? String ?? "INBOX"
        MailServer.fetchNewMessages(in: mailbox) { messages in
            print("mail: fetched \(messages.count) new message(s) in \(mailbox): \(messages.joined(separator: ", "))")
            completionHandler(messages.isEmpty ? .noData : .newData)
        }
    }
}

/// Stands in for the app's mail protocol: answers on the main queue, after a round trip.
enum MailServer {
    static func fetchNewMessages(in mailbox: String, completion: @escaping ([String]) -> Void) {
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.1) {
            let messages = ["Lunch on Friday?"]
            // Keep them for when the user opens the app.
            let inbox = URL.documentsDirectory.appendingPathComponent("\(mailbox).txt")
            let old = (try? String(contentsOf: inbox, encoding: .utf8)) ?? ""
            try? Data((old + messages.map { $0 + "\n" }.joined()).utf8).write(to: inbox, options: .atomic)
            DispatchQueue.main.async { completion(messages) }
        }
    }
}

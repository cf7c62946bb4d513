// Reader: an app group shared with an extension. The user shares articles with the app's share
// extension (ReaderShare), which adds them to a reading list in the app group's container and
// asks for a refresh; the app's refresh reads the list from the same container and saves each
// article for offline reading.
import BackgroundTasks
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Reader") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    static let refreshIdentifier = "com.example.reader.refresh"

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.refreshIdentifier, using: nil) { task in
            let saved = ReadingList.saveNewArticlesForOffline()
            print("reader: saved \(saved.count) article(s) for offline reading: \(saved.joined(separator: ", "))")
            task.setTaskCompleted(success: true)
        }
        return true
    }
}

/// The reading list: `readingList.json` in the group's container, written by the extension.
enum ReadingList {
    /// The app group of the Info.plist's com.apple.security.application-groups entitlement.
    static let group = "group.com.example.reader"

    static func saveNewArticlesForOffline() -> [String] {
        guard let container = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: group) else {
            print("reader: no app group container")
            return []
        }
        let listURL = container.appendingPathComponent("readingList.json")
        let offline = container.appendingPathComponent("Offline", isDirectory: true)
        try? FileManager.default.createDirectory(at: offline, withIntermediateDirectories: true)
        let list = (try? JSONDecoder().decode([String].self, from: Data(contentsOf: listURL))) ?? []
        var saved: [String] = []
        for address in list {
            let file = offline.appendingPathComponent(address.replacingOccurrences(of: "/", with: "_"))
            guard !FileManager.default.fileExists(atPath: file.path) else { continue }
            // Downloading the article stands in here: its address is written as its content.
            if (try? Data(address.utf8).write(to: file, options: .atomic)) != nil { saved.append(address) }
        }
        return saved
    }
}

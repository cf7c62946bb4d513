// Episodes: background downloads. A podcast app's refresh finds a new episode and downloads it
// in a background URLSession: the system (here, the host) carries the transfer while the app is
// suspended or gone, then wakes the app in the background with
// application(_:handleEventsForBackgroundURLSession:completionHandler:) to take the file.
import BackgroundTasks
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Episodes") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    static let refreshIdentifier = "com.example.episodes.refresh"
    /// handleEvents' completion handler, called once the session has delivered its events.
    var backgroundCompletionHandler: (() -> Void)?

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.refreshIdentifier, using: nil) { task in
            // Start the download and finish: the session carries it from here.
            EpisodeDownloads.downloadLatestEpisode()
            task.setTaskCompleted(success: true)
        }
        return true
    }

    /// The session's transfers ended while the app was not running: make the session again to
    /// receive its events, and keep the handler for when they are delivered.
    func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String,
                     completionHandler: @escaping @Sendable () -> Void) {
        print("episodes: woken for the events of \(identifier)")
        backgroundCompletionHandler = completionHandler
        _ = EpisodeDownloads.session
    }
}

enum EpisodeDownloads {
    /// The app's background session, made once per process, on first use.
    static let session: URLSession = {
        let configuration = URLSessionConfiguration.background(withIdentifier: "com.example.episodes.downloads")
        configuration.sessionSendsLaunchEvents = true
        return URLSession(configuration: configuration, delegate: DownloadDelegate(), delegateQueue: nil)
    }()

    static func downloadLatestEpisode() {
        // The podcast's feed would name the newest episode; this example's Info.plist does.
        guard let address = Bundle.main.object(forInfoDictionaryKey: "EpisodeURL") as? String,
              let url = URL(string: address) else { return }
        let task = session.downloadTask(with: url)
        task.taskDescription = url.lastPathComponent
        task.resume()
        print("episodes: downloading \(url)")
    }
}

final class DownloadDelegate: NSObject, URLSessionDownloadDelegate {
    /// The file is removed when this returns: move it now.
    func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL) {
        let status = (downloadTask.response as? HTTPURLResponse)?.statusCode ?? 0
        guard status == 200 else {
            print("episodes: the server answered \(status)")
            return
        }
        let destination = URL.documentsDirectory.appendingPathComponent(downloadTask.taskDescription ?? "episode")
        do {
            try? FileManager.default.removeItem(at: destination)
            try FileManager.default.moveItem(at: location, to: destination)
            let size = (try? FileManager.default.attributesOfItem(atPath: destination.path)[.size] as? Int) ?? 0
            print("episodes: saved \(destination.lastPathComponent), \(size) bytes")
        } catch {
            print("episodes: could not keep the download: \(error)")
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        if let error { print("episodes: download failed: \(error.localizedDescription)") }
    }

    /// Every event is delivered: call handleEvents' completion handler, on the main queue.
    func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
        DispatchQueue.main.async {
            guard let appDelegate = UIApplication.shared.delegate as? AppDelegate else { return }
            appDelegate.backgroundCompletionHandler?()
            appDelegate.backgroundCompletionHandler = nil
        }
    }
}

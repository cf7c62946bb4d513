// The DownloadManager pattern of public apps and Apple's documentation, unchanged: a background
// session with an identifier, download and upload tasks, the delegate methods that receive the
// files, and the app delegate keeping handleEvents' completion handler for
// urlSessionDidFinishEvents. What the tests ask of it comes from config.json in the bundle.
import BackgroundTasks
import Foundation
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Downloader") { AppDelegate() }
}

/// Prints a line the tests read from the launch's log (flushed: the launch may be killed).
func say(_ text: String) {
    print("downloader: \(text)")
    fflush(nil)
}

/// The test's instructions: the URLs to fetch and how.
struct Config: Decodable {
    var downloads: [String]?
    var upload: String?
    var discretionary: Bool?
    var cancelAfterBytes: Int64?
    /// Which task `cancelAfterBytes` cancels (its taskDescription).
    var cancel: String?

    static func load() -> Config {
        guard let url = Bundle.main.url(forResource: "config", withExtension: "json"),
              let data = try? Data(contentsOf: url),
              let config = try? JSONDecoder().decode(Config.self, from: data) else {
            say("no config.json in \(Bundle.main.bundlePath)")
            return Config()
        }
        return config
    }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        let scheduler = BGTaskScheduler.shared
        // Starts the downloads and ends at once: the host carries them after the app exits.
        _ = scheduler.register(forTaskWithIdentifier: "com.example.downloader.start", using: nil) { task in
            DownloadManager.shared.startDownloads(Config.load())
            task.setTaskCompleted(success: true)
        }
        // Starts the downloads and waits for them in this launch.
        _ = scheduler.register(forTaskWithIdentifier: "com.example.downloader.wait", using: nil) { task in
            DownloadManager.shared.whenAllComplete = { task.setTaskCompleted(success: true) }
            DownloadManager.shared.startDownloads(Config.load())
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.downloader.upload", using: nil) { task in
            DownloadManager.shared.whenAllComplete = { task.setTaskCompleted(success: true) }
            DownloadManager.shared.startUpload(Config.load())
        }
        _ = scheduler.register(forTaskWithIdentifier: "com.example.downloader.cancel", using: nil) { task in
            DownloadManager.shared.whenAllComplete = { task.setTaskCompleted(success: true) }
            DownloadManager.shared.startDownloads(Config.load())
        }
        return true
    }

    func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String,
                     completionHandler: @escaping () -> Void) {
        say("handleEvents \(identifier)")
        DownloadManager.shared.backgroundCompletionHandler = completionHandler
        _ = DownloadManager.shared.session
    }
}

final class DownloadManager: NSObject, URLSessionDownloadDelegate, URLSessionDataDelegate {
    static let shared = DownloadManager()
    static let identifier = "com.example.downloader.background"

    var backgroundCompletionHandler: (() -> Void)?
    var whenAllComplete: (() -> Void)?
    private var running = 0
    private var cancelAfter: Int64?
    private var cancelTask: String?

    lazy var session: URLSession = {
        let configuration = URLSessionConfiguration.background(withIdentifier: Self.identifier)
        configuration.isDiscretionary = Config.load().discretionary ?? false
        configuration.sessionSendsLaunchEvents = true
        return URLSession(configuration: configuration, delegate: self, delegateQueue: nil)
    }()

    func startDownloads(_ config: Config) {
        cancelAfter = config.cancelAfterBytes
        cancelTask = config.cancel
        // Every task counted before the first is resumed: one that completes at once (a server
        // error) must not bring the count to zero while the others are still to start.
        let tasks: [URLSessionDownloadTask] = (config.downloads ?? []).enumerated().compactMap { index, address in
            guard let url = URL(string: address) else { return nil }
            let task = session.downloadTask(with: url)
            task.taskDescription = "file\(index)"
            return task
        }
        running += tasks.count
        for task in tasks {
            task.resume()
            say("started \(task.taskDescription ?? "") task \(task.taskIdentifier)")
        }
    }

    func startUpload(_ config: Config) {
        guard let address = config.upload, let url = URL(string: address) else { return }
        let documents = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        try? FileManager.default.createDirectory(at: documents, withIntermediateDirectories: true)
        let file = documents.appendingPathComponent("upload.bin")
        try? Data((0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }).write(to: file)
        var request = URLRequest(url: url)
        request.httpMethod = "PUT"
        let task = session.uploadTask(with: request, fromFile: file)
        task.taskDescription = "upload"
        running += 1
        task.resume()
        say("started upload task \(task.taskIdentifier)")
    }

    // MARK: URLSessionDownloadDelegate

    func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didWriteData bytesWritten: Int64,
                    totalBytesWritten: Int64, totalBytesExpectedToWrite: Int64) {
        say("progress \(downloadTask.taskDescription ?? "") \(totalBytesWritten)/\(totalBytesExpectedToWrite)")
        if let cancelAfter, totalBytesWritten >= cancelAfter, downloadTask.taskDescription == cancelTask {
            self.cancelAfter = nil
            say("cancelling \(downloadTask.taskDescription ?? "")")
            downloadTask.cancel()
        }
    }

    func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL) {
        let status = (downloadTask.response as? HTTPURLResponse)?.statusCode ?? 0
        let documents = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        try? FileManager.default.createDirectory(at: documents, withIntermediateDirectories: true)
        let destination = documents.appendingPathComponent(downloadTask.taskDescription ?? "download")
        try? FileManager.default.removeItem(at: destination)
        do {
            try FileManager.default.moveItem(at: location, to: destination)
            let data = try Data(contentsOf: destination)
            say("finished \(downloadTask.taskDescription ?? "") status \(status) bytes \(data.count) fnv \(fnv(data)) in \(destination.path)"
                + " suggested \(downloadTask.response?.suggestedFilename ?? "none")")
        } catch {
            say("finished \(downloadTask.taskDescription ?? "") status \(status) but the move failed: \(error)")
        }
    }

    // MARK: URLSessionDataDelegate (an upload's answer)

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        say("answer \(dataTask.taskDescription ?? "") \(String(decoding: data, as: UTF8.self))")
    }

    // MARK: URLSessionTaskDelegate

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        if let error {
            let code = (error as? URLError)?.code.rawValue ?? (error as NSError).code
            say("complete \(task.taskDescription ?? "") error \(code)")
        } else {
            say("complete \(task.taskDescription ?? "") ok status \((task.response as? HTTPURLResponse)?.statusCode ?? 0)")
        }
        running -= 1
        if running <= 0, let whenAllComplete {
            self.whenAllComplete = nil
            whenAllComplete()
        }
    }

    // MARK: Background events

    func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
        say("didFinishEvents \(session.configuration.identifier ?? "")")
        DispatchQueue.main.async {
            self.backgroundCompletionHandler?()
            self.backgroundCompletionHandler = nil
        }
    }
}


/// FNV-1a, 64-bit, for the tests to check the bytes.
func fnv(_ data: Data) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in data { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
    return String(hash, radix: 16)
}

// Export: continued processing (iOS 26). The user starts exporting a photo album and leaves the
// app; the export goes on in the background as a BGContinuedProcessingTask, its progress shown
// to the user (`bgtask progress`), who may cancel it (`bgtask cancel-task`).
import BackgroundTasks
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Export") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    /// Continued-processing identifiers are permitted by a wildcard in the Info.plist
    /// (`com.example.export.*`).
    static let exportIdentifier = "com.example.export.album"

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.exportIdentifier, using: nil) { task in
            AlbumExporter().export(task as! BGContinuedProcessingTask)
        }
        return true
    }

    /// The app is on screen (`bgtask open`): this stands in for the user tapping "Export".
    func applicationDidBecomeActive(_ application: UIApplication) {
        let request = BGContinuedProcessingTaskRequest(identifier: Self.exportIdentifier,
                                                       title: "Exporting album", subtitle: "Starting…")
        // Wait for a free slot rather than fail when other continued tasks are running.
        request.strategy = .queue
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { print("export: could not start the export: \(error)") }
        }
    }
}

final class AlbumExporter {
    static let photoCount = 20

    /// Runs on the scheduler's background queue: a long loop is fine here.
    func export(_ task: BGContinuedProcessingTask) {
        // The user cancelled, or the system needs the resources: stop at the next photo.
        let stop = StopFlag()
        task.expirationHandler = { stop.set() }

        task.progress.totalUnitCount = Int64(Self.photoCount)
        var exported = 0
        while exported < Self.photoCount && !stop.isSet {
            Thread.sleep(forTimeInterval: 0.1) // encoding one photo
            exported += 1
            task.progress.completedUnitCount = Int64(exported)
            task.updateTitle("Exporting album", subtitle: "\(exported) of \(Self.photoCount) photos")
        }
        print("export: exported \(exported) of \(Self.photoCount) photos\(stop.isSet ? " (stopped)" : "")")
        task.setTaskCompleted(success: exported == Self.photoCount)
    }
}

/// Set by the expiration handler (another thread), read by the export loop.
final class StopFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

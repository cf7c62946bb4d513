// An app delegate written as Xcode 26 writes it: main-actor isolated (here by the module's
// default isolation in Swift 6 mode, MainActorApp6; by UIResponder's own isolation in Swift 5,
// MainActorApp5), with an `override init()` that sets up main-actor state, handlers that hop
// to the main actor with `Task { @MainActor in }`, and the device state it reads from
// ProcessInfo. The host's tests run it and read its lines:
//   mainactor: launched (notes: init, launch) thermal N low-power B
//   mainactor: refreshed 1 (notes: init, launch, refresh 1)
import BackgroundTasks
import Foundation
import UIKit

@_cdecl("bgtask_plugin_entry")
nonisolated public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "MainActorApp") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    private let journal: Journal
    private var refreshes = 0

    override init() {
        journal = Journal()
        super.init()
        journal.note("init")
    }

    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        journal.note("launch")
        BGTaskScheduler.shared.register(forTaskWithIdentifier: "com.example.mainactor.refresh", using: nil) { task in
            Task { @MainActor in self.refresh(task) }
        }
        let info = ProcessInfo.processInfo
        print("mainactor: launched (notes: \(journal.notes.joined(separator: ", "))) thermal \(info.thermalState.rawValue) low-power \(info.isLowPowerModeEnabled)")
        return true
    }

    private func refresh(_ task: BGTask) {
        refreshes += 1
        journal.note("refresh \(refreshes)")
        print("mainactor: refreshed \(refreshes) (notes: \(journal.notes.joined(separator: ", ")))")
        task.setTaskCompleted(success: true)
    }
}

/// Main-actor state, as an app's model often is.
@MainActor
final class Journal {
    private(set) var notes: [String] = []
    func note(_ text: String) { notes.append(text) }
}

// Notes: background time (UIApplication.beginBackgroundTask). When the user leaves an app, iOS
// suspends it within moments; a notes app asks for a little more time to save the note being
// edited, and gives the time back as soon as the note is saved.
import BackgroundTasks
import UIKit

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    UIApplication.entry(name: "Notes") { AppDelegate() }
}

final class AppDelegate: UIResponder, UIApplicationDelegate {
    private var saveTask = UIBackgroundTaskIdentifier.invalid
    private var draft = ""

    /// On screen (`bgtask open`): the user writes a note.
    func applicationDidBecomeActive(_ application: UIApplication) {
        draft = "Groceries: milk, bread, coffee"
        print("notes: editing \"\(draft)\"")
    }

    /// Off screen (the app's foreground time is over): save the note under background time.
    func applicationDidEnterBackground(_ application: UIApplication) {
        saveTask = application.beginBackgroundTask(withName: "Save note") {
            // Time ran out before the save finished: give the time back, or the app is killed.
            print("notes: out of time, the note is saved next time")
            self.endSaveTask()
        }
        let text = draft
        DispatchQueue.global(qos: .utility).async {
            let saved = NoteStore.save(text)
            DispatchQueue.main.async {
                print(saved ? "notes: saved the note" : "notes: could not save the note")
                self.endSaveTask()
            }
        }
    }

    /// Ends the assertion once (the expiration handler and the save may both get here).
    private func endSaveTask() {
        guard saveTask != .invalid else { return }
        UIApplication.shared.endBackgroundTask(saveTask)
        saveTask = .invalid
    }
}

enum NoteStore {
    /// Writes the note into Documents (a moment's work: the kind background time is for).
    static func save(_ text: String) -> Bool {
        Thread.sleep(forTimeInterval: 0.2) // encrypting and syncing the note
        do {
            try Data(text.utf8).write(to: URL.documentsDirectory.appendingPathComponent("note.txt"), options: .atomic)
            return true
        } catch {
            return false
        }
    }
}

// FeedShare: the Feed app's share extension. Someone shares a link with the app; the extension
// saves it where the app will find it and asks the system to refresh the app's feed soon. Like
// an iOS extension, it may submit task requests for its app but not register launch handlers:
// the host runs the request in the app, not here.
import BackgroundTasks

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "FeedShare") { launch in
        try ShareExtension().handle(launch)
    }
}

struct ShareExtension {
    struct Event: Decodable { var url: String }

    struct BadEvent: Error, CustomStringConvertible {
        var description: String
    }

    func handle(_ launch: BGTaskLaunch) throws {
        guard let json = launch.eventJSON, let event = try? JSONDecoder().decode(Event.self, from: Data(json.utf8)) else {
            throw BadEvent(description: "FeedShare: expected an event like {\"url\": \"https://...\"}, got \(launch.eventJSON ?? "nothing")")
        }
        let inbox = launch.dataDirectory.appendingPathComponent("shared-links.txt")
        let line = Data((event.url + "\n").utf8)
        if let handle = try? FileHandle(forWritingTo: inbox) {
            _ = try? handle.seekToEnd()
            handle.write(line)
            try? handle.close()
        } else {
            try line.write(to: inbox)
        }
        print("share: saved \(event.url)")

        // Extensions cannot register handlers: this returns false (the host logs why).
        let registered = BGTaskScheduler.shared.register(forTaskWithIdentifier: "com.example.feed.refresh", using: nil) { _ in }
        print("share: register returned \(registered)")

        // Ask for the app to refresh soon; the host checks it against the app's Info.plist. The
        // extension waits for the answer (iOS 27's form gives it on another queue), so that a
        // refusal fails this launch with the host's reason in the record.
        let request = BGAppRefreshTaskRequest(identifier: "com.example.feed.refresh")
        let answer = SubmissionAnswer()
        BGTaskScheduler.shared.submitTaskRequest(request) { error in answer.give(error) }
        if let error = answer.wait() as? BGTaskScheduler.Error {
            print("share: could not schedule a refresh: \(error.code) \(error.localizedDescription)")
            throw error
        }
        print("share: asked for a refresh of the feed")
    }
}

/// The answer to a submission, handed from the completion handler's queue to the entry.
final class SubmissionAnswer: @unchecked Sendable {
    private let answered = DispatchSemaphore(value: 0)
    private var error: (any Error)?

    func give(_ error: (any Error)?) {
        self.error = error
        answered.signal()
    }

    func wait() -> (any Error)? {
        answered.wait()
        return error
    }
}

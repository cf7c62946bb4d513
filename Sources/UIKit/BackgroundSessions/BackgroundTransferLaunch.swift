import BGTaskModel
import BackgroundTasks
import Foundation

/// A launch for `background-transfer`: the host has finished transfers of these sessions
/// waiting. For each, as iOS does: background time, then
/// `application(_:handleEventsForBackgroundURLSession:completionHandler:)` on the main queue.
/// The app recreates the session (its events are then delivered to it) and calls the completion
/// handler, which ends the background time: the launch ends when every session's handler was
/// called, or when its time runs out (then the handler's background time is ended for it: an
/// app is suspended, not killed, for not calling it).
@MainActor
enum BackgroundTransferLaunch {
    /// The sessions the launch brings events of.
    nonisolated static func sessions(_ eventJSON: String?) -> [String] {
        guard let eventJSON, let event = try? JSONDecoder().decode(TransferLaunchEvent.self, from: Data(eventJSON.utf8)) else { return [] }
        return event.sessions
    }

    static func deliver(_ sessions: [String], to delegate: any UIApplicationDelegate, of application: UIApplication) {
        for identifier in sessions {
            let assertion = AssertionBox()
            let once = OnceFlag()
            let complete: @Sendable () -> Void = {
                guard once.first() else { return }
                BackgroundSessions.shared.eventsHandled(identifier)
                application.endBackgroundTask(assertion.identifier)
            }
            assertion.identifier = application.beginBackgroundTask(withName: "background-transfer \(identifier)") { complete() }
            BackgroundSessions.shared.expectEvents(identifier, complete: complete)
            DispatchQueue.main.async {
                MainActor.assumeIsolated {
                    delegate.application(application, handleEventsForBackgroundURLSession: identifier, completionHandler: complete)
                    BackgroundSessions.shared.releaseEvents(identifier)
                }
            }
        }
    }
}

private final class AssertionBox: @unchecked Sendable {
    var identifier = UIBackgroundTaskIdentifier.invalid
}

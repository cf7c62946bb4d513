import BGTaskControl
import BGTaskLaunch
import BGTaskTransfers
import BGTaskModel
import Foundation
import Logging

/// Requests from inside a launch (submit, cancel, pending) go to the host's submissions and store.
///
/// A request from an extension is the containing app's: the host bound the extension's identity
/// when it started the launch, so it can only ever act for that app.
///
/// Apps compute dates from the real clock (`Date()`). Under a virtual clock their dates are
/// moved onto it: an `earliestBeginDate` 15 minutes after the app's now is 15 minutes after the
/// host's now, and `pendingTaskRequests` moves them back.
struct HostRequestBroker: LaunchRequestBroker {
    let core: HostCore
    let catalog: AppCatalog
    let submissions: Submissions
    let notifications: LocalNotifications
    /// The launch whose requests these are.
    let launchID: String
    /// Background URL sessions (nil: the host carries none).
    var transfers: BackgroundTransfers? = nil

    private var offset: TimeInterval {
        core.clock.appOffset
    }

    /// The app an extension belongs to (the app itself for an app).
    private func owner(of bundle: PluginBundle) -> PluginBundle? {
        guard bundle.kind == .extension else { return bundle }
        return core.sync { catalog.app(containingBundle: bundle.identifier) }
    }

    func submit(_ request: TaskRequest, app: PluginBundle) -> SubmissionRules.Rejection? {
        guard let owner = owner(of: app) else {
            return .init(status: .unavailable, message: "the app containing \(app.identifier) is no longer in the plugin directory")
        }
        var shifted = request
        shifted.earliestBeginDate = request.earliestBeginDate.map { $0 + offset }
        return submissions.submit(shifted, app: owner, fromLaunch: launchID)
    }

    func cancel(identifier: String?, app: PluginBundle) {
        guard let owner = owner(of: app) else { return }
        do {
            _ = try core.store.cancel(app: owner.identifier, identifier: identifier)
        } catch {
            core.logger.error("cannot cancel requests", metadata: ["bundle.id": "\(owner.identifier)", "error": "\(error)"])
        }
    }

    /// The token of the app (an extension's is its app's), made on first use and kept.
    func deviceToken(app: PluginBundle) -> Result<String, SubmissionRules.Rejection> {
        guard let owner = owner(of: app) else {
            return .failure(.init(status: .unavailable, message: "the app containing \(app.identifier) is no longer in the plugin directory"))
        }
        do {
            return .success(try core.store.deviceToken(app: owner.identifier))
        } catch {
            return .failure(.init(status: .unavailable, message: "the host could not read or make the device token: \(error)"))
        }
    }

    /// The app's pending requests (none when the store cannot be read, which is logged).
    func pending(app: PluginBundle) -> [TaskRequest] {
        let offset = self.offset
        guard let owner = owner(of: app) else { return [] }
        do {
            return try core.store.pending(app: owner.identifier).map {
                var request = $0.request
                request.earliestBeginDate = request.earliestBeginDate.map { $0 - offset }
                return request
            }
        } catch {
            core.logger.error("cannot read pending requests", metadata: ["bundle.id": "\(owner.identifier)", "error": "\(error)"])
            return []
        }
    }

    /// Background URL sessions' calls, for the app (an extension's transfers are its app's).
    func transfer(_ call: TransferCall, app: PluginBundle, launchID: String, control: LaunchControl?) -> TransferCallAnswer {
        guard let transfers else { return .failure(TransferCallAnswer.unavailable, "background transfers are not available in this host") }
        guard let owner = owner(of: app) else {
            return .failure(TransferCallAnswer.unavailable, "the app containing \(app.identifier) is no longer in the plugin directory")
        }
        var send: (@Sendable (String) -> Void)?
        if let control { send = { json in control.sendTransferEvent(json) } }
        return transfers.answer(call, from: TransferCaller(app: owner.identifier, bundle: app, launchID: launchID, send: send))
    }

    /// Local notifications, for the app (an extension's are its app's). Dates go back to the
    /// app on its own clock, as pending task requests do.
    func notifications(_ call: NotificationCall, app: PluginBundle) -> NotificationAnswer {
        guard let owner = owner(of: app) else {
            return NotificationAnswer(status: LocalNotifications.hostFailed, message: "the app containing \(app.identifier) is no longer in the plugin directory")
        }
        let offset = self.offset
        do {
            switch call {
            case let .authorization(options, request):
                return NotificationAnswer(authorization: try notifications.authorization(app: owner.identifier, options: options, request: request))
            case let .add(request):
                let outcome = notifications.add(request, app: owner.identifier, launchID: launchID)
                return NotificationAnswer(status: outcome.status, message: outcome.message)
            case let .list(delivered):
                let stored = delivered ? try notifications.delivered(app: owner.identifier) : try notifications.pending(app: owner.identifier)
                return NotificationAnswer(entries: stored.map {
                    NotificationEntry(request: $0.request, date: (delivered ? $0.deliveredAt : $0.fireDate).map { $0.timeIntervalSince1970 - offset })
                })
            case let .remove(delivered, identifiers):
                try notifications.remove(app: owner.identifier, delivered: delivered, identifiers: identifiers)
                return NotificationAnswer()
            }
        } catch {
            core.logger.error("notification call failed", metadata: ["bundle.id": "\(owner.identifier)", "error": "\(error)"])
            return NotificationAnswer(status: LocalNotifications.hostFailed, message: "\(error)")
        }
    }
}

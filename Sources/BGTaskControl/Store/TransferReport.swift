import BGTaskModel
import BGTaskSystem
import Foundation
import Glibc

/// A transfer as `bgtask transfers` lists it and `bgtask why TRANSFER_ID` explains it.
public struct TransferReport: Codable, Sendable, Equatable {
    public var id: String
    public var app: String
    public var bundle: String
    public var session: String
    public var taskIdentifier: Int
    public var taskDescription: String?
    public var kind: TransferKind
    public var url: String
    public var state: TransferState
    public var heldBy: String?
    public var bytesReceived: Int64
    public var bytesExpectedToReceive: Int64
    public var bytesSent: Int64
    public var bytesExpectedToSend: Int64
    public var status: Int?
    public var error: TransferError?
    public var file: String?
    public var createdAt: Date
    public var finishedAt: Date?
    public var attempts: Int
    public var resumed: Bool
    public var discretionary: Bool
    public var sendsLaunchEvents: Bool
    public var launchedFor: String?
    public var deliveredInLaunch: String?

    enum CodingKeys: String, CodingKey {
        case id, app, bundle, session, kind, url, state, status, error, file, attempts, resumed, discretionary
        case taskIdentifier = "task_identifier", taskDescription = "task_description", heldBy = "held_by"
        case bytesReceived = "bytes_received", bytesExpectedToReceive = "bytes_expected_to_receive"
        case bytesSent = "bytes_sent", bytesExpectedToSend = "bytes_expected_to_send"
        case createdAt = "created_at", finishedAt = "finished_at", sendsLaunchEvents = "sends_launch_events"
        case launchedFor = "launched_for", deliveredInLaunch = "delivered_in_launch"
    }

    package init(_ transfer: StoredTransfer) {
        let info = transfer.info
        id = info.id
        app = info.app
        bundle = transfer.bundle
        session = info.session
        taskIdentifier = info.taskIdentifier
        taskDescription = info.taskDescription
        kind = info.kind
        url = info.url
        state = info.state
        heldBy = info.heldBy
        bytesReceived = info.bytesReceived
        bytesExpectedToReceive = info.bytesExpectedToReceive
        bytesSent = info.bytesSent
        bytesExpectedToSend = info.bytesExpectedToSend
        status = info.response?.status
        error = info.error
        file = info.file
        createdAt = Date(timeIntervalSince1970: info.createdAt)
        finishedAt = info.finishedAt.map(Date.init(timeIntervalSince1970:))
        attempts = info.attempts
        resumed = info.resumed
        discretionary = transfer.request.discretionary
        sendsLaunchEvents = transfer.request.sendsLaunchEvents
        launchedFor = transfer.launchedFor
        deliveredInLaunch = transfer.deliveredInLaunch
    }

    /// One line for people.
    public var text: String {
        var line = "transfer \(id) \(app) \(session)#\(taskIdentifier) \(kind.rawValue): \(state.rawValue)"
        if kind == .upload { line += ", sent \(bytesSent)/\(bytesExpectedToSend)" }
        line += ", received \(bytesReceived)/\(bytesExpectedToReceive < 0 ? "?" : String(bytesExpectedToReceive))"
        if let status { line += ", HTTP \(status)" }
        if let heldBy { line += ": held: \(heldBy)" }
        if let error { line += ": error \(error.code): \(error.message)" }
        return line
    }

    /// Several lines for `why`.
    public var explanation: String {
        var lines = [text, "  \(url)"]
        lines.append("  attempts: \(attempts)" + (resumed ? ", resumed from a partial download" : ""))
        if discretionary { lines.append("  discretionary: runs only on external power with a network") }
        if let file { lines.append("  file: \(file)") }
        if let launchedFor { lines.append("  its end was announced to launch \(launchedFor)") }
        if let deliveredInLaunch { lines.append("  delivered in launch \(deliveredInLaunch)") }
        else if state.isFinished { lines.append(sendsLaunchEvents ? "  waiting for the app to be told (a background-transfer launch, or its next launch that makes the session)"
                                                                   : "  waiting for the app's next launch that makes the session (sessionSendsLaunchEvents is off)") }
        return lines.joined(separator: "\n")
    }
}

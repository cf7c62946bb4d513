import Foundation

// Background URL sessions (`URLSessionConfiguration.background(withIdentifier:)`): the transfers
// the host carries out for an app, as values every part shares. The app's side (the `UIKit`
// module) hands a task to the host as a `TransferCall` (JSON over the ABI's `transfer_call`, then
// the launch channel's `transferCall`); the host answers with a `TransferReply` and tells the
// launch attached to the session what happens with `TransferEvent`s. The store, the control
// socket (`bgtask transfers`) and run records carry `TransferInfo`.

/// What a task of a background session does.
public enum TransferKind: String, Codable, Sendable, CaseIterable {
    /// `downloadTask(with:)`: the body goes to a file the host writes in the app's container.
    case download
    /// `uploadTask(with:fromFile:)`: the body is read from a file in the app's container; the
    /// server's answer comes back as data.
    case upload
    /// `dataTask(with:)`: the body comes back as data (delivered only to a running app, as on iOS).
    case data
}

/// Where a transfer is. `waiting`: held by a condition (`TransferInfo.heldBy` says which) or
/// not yet started; `running`: bytes are moving; `completed`: the server answered (any status:
/// a 404 is a completed transfer, as in URLSession); `failed`: it ended with an error
/// (`TransferInfo.error`); `cancelled`: the app cancelled it; `delivered`: the app was told and
/// the host keeps only the record.
public enum TransferState: String, Codable, Sendable, CaseIterable {
    case waiting, running, completed, failed, cancelled, delivered

    /// The transfer will move no more bytes.
    public var isFinished: Bool { self != .waiting && self != .running }
}

/// One header line, in order (HTTP allows a name more than once).
public struct TransferHeader: Codable, Sendable, Equatable {
    public var name: String
    public var value: String
    public init(name: String, value: String) {
        self.name = name
        self.value = value
    }
}

/// A task the app hands to the host: the request, and the session's configuration that governs it.
public struct TransferRequest: Codable, Sendable, Equatable {
    /// The session's identifier (`URLSessionConfiguration.identifier`).
    public var session: String
    /// The task's `taskIdentifier` in the process that made it.
    public var taskIdentifier: Int
    public var taskDescription: String?
    public var kind: TransferKind
    /// An absolute http or https URL.
    public var url: String
    public var method: String
    /// The request's headers and the session's `httpAdditionalHeaders` (the request's win).
    public var headers: [TransferHeader]
    /// `upload`: the body's file, an absolute path inside the app's container.
    public var bodyFile: String?
    /// `isDiscretionary`: held until the device is on external power and an inexpensive network.
    public var discretionary: Bool
    /// `sessionSendsLaunchEvents`: when it finishes and the app is not running, launch it
    /// (reason `background-transfer`); otherwise the events wait for the app's next launch.
    public var sendsLaunchEvents: Bool
    public var allowsCellularAccess: Bool
    public var allowsExpensiveNetworkAccess: Bool
    public var allowsConstrainedNetworkAccess: Bool
    /// `timeoutIntervalForRequest`, seconds: no byte for this long ends an attempt (retried).
    public var requestTimeout: Double
    /// `timeoutIntervalForResource`, seconds from creation: the transfer fails with
    /// `NSURLErrorTimedOut` when it has not finished by then.
    public var resourceTimeout: Double
    /// `earliestBeginDate`, seconds since 1970: not started before.
    public var earliestBeginDate: Double?

    public init(session: String, taskIdentifier: Int, taskDescription: String? = nil, kind: TransferKind, url: String,
                method: String = "GET", headers: [TransferHeader] = [], bodyFile: String? = nil, discretionary: Bool = false,
                sendsLaunchEvents: Bool = true, allowsCellularAccess: Bool = true, allowsExpensiveNetworkAccess: Bool = true,
                allowsConstrainedNetworkAccess: Bool = true, requestTimeout: Double = 60, resourceTimeout: Double = 7 * 86_400,
                earliestBeginDate: Double? = nil) {
        self.session = session
        self.taskIdentifier = taskIdentifier
        self.taskDescription = taskDescription
        self.kind = kind
        self.url = url
        self.method = method
        self.headers = headers
        self.bodyFile = bodyFile
        self.discretionary = discretionary
        self.sendsLaunchEvents = sendsLaunchEvents
        self.allowsCellularAccess = allowsCellularAccess
        self.allowsExpensiveNetworkAccess = allowsExpensiveNetworkAccess
        self.allowsConstrainedNetworkAccess = allowsConstrainedNetworkAccess
        self.requestTimeout = requestTimeout
        self.resourceTimeout = resourceTimeout
        self.earliestBeginDate = earliestBeginDate
    }

    /// What is wrong with the request (naming the field), or nil. The host checks every request
    /// a launch hands it with this before it stores anything.
    public var problem: String? {
        if session.isEmpty || session.utf8.count > TransferLimits.identifierBytes {
            return "session: the identifier must be 1 to \(TransferLimits.identifierBytes) bytes"
        }
        if let taskDescription, taskDescription.utf8.count > TransferLimits.descriptionBytes {
            return "taskDescription: \(taskDescription.utf8.count) bytes, over the limit of \(TransferLimits.descriptionBytes)"
        }
        if url.utf8.count > TransferLimits.urlBytes { return "url: \(url.utf8.count) bytes, over the limit of \(TransferLimits.urlBytes)" }
        guard let parsed = URL(string: url), let scheme = parsed.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = parsed.host, !host.isEmpty else {
            return "url: '\(url.prefix(200))' is not an absolute http or https URL (background sessions carry only HTTP)"
        }
        if method.isEmpty || method.utf8.count > 32 || !method.utf8.allSatisfy(Self.isTokenByte) {
            return "method: '\(method.prefix(40))' is not an HTTP method token"
        }
        if headers.count > TransferLimits.headers { return "headers: \(headers.count) headers, over the limit of \(TransferLimits.headers)" }
        var headerBytes = 0
        for header in headers {
            if header.name.isEmpty || !header.name.utf8.allSatisfy(Self.isTokenByte) {
                return "headers: '\(header.name.prefix(60))' is not a header name"
            }
            if header.value.utf8.contains(where: { $0 == 0x0d || $0 == 0x0a || $0 == 0 }) {
                return "headers: the value of \(header.name) holds a line break or NUL"
            }
            headerBytes += header.name.utf8.count + header.value.utf8.count
        }
        if headerBytes > TransferLimits.headerBytes { return "headers: \(headerBytes) bytes, over the limit of \(TransferLimits.headerBytes)" }
        switch kind {
        case .upload:
            guard let bodyFile, bodyFile.hasPrefix("/") else { return "bodyFile: an upload needs the absolute path of its body's file" }
            if bodyFile.utf8.count > TransferLimits.pathBytes { return "bodyFile: over the limit of \(TransferLimits.pathBytes) bytes" }
        case .download, .data:
            if bodyFile != nil { return "bodyFile: only an upload has a body file" }
        }
        if !(requestTimeout > 0) || !requestTimeout.isFinite { return "requestTimeout: must be a positive number of seconds" }
        if !(resourceTimeout > 0) || !resourceTimeout.isFinite { return "resourceTimeout: must be a positive number of seconds" }
        if let earliestBeginDate, !earliestBeginDate.isFinite { return "earliestBeginDate: not a date" }
        return nil
    }

    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        default: Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
        }
    }
}

/// The server's answer line and headers.
public struct TransferResponse: Codable, Sendable, Equatable {
    public var status: Int
    public var headers: [TransferHeader]
    public init(status: Int, headers: [TransferHeader]) {
        self.status = status
        self.headers = headers
    }
}

/// Why a transfer failed: an `NSURLError` code (`NSURLErrorTimedOut` -1001,
/// `NSURLErrorCannotConnectToHost` -1004, `NSURLErrorCancelled` -999, ...) and the host's words.
public struct TransferError: Codable, Sendable, Equatable {
    public var code: Int
    public var message: String
    public init(code: Int, message: String) {
        self.code = code
        self.message = message
    }

    public static let cancelledCode = -999
    public static let timedOutCode = -1001
    public static let cannotConnectToHostCode = -1004
    public static let networkConnectionLostCode = -1005
    public static let fileDoesNotExistCode = -1100
    public static let cannotWriteToFileCode = -3003
    public static let unknownCode = -1
}

/// A transfer as the host keeps it: what it is, where it is, what came back.
public struct TransferInfo: Codable, Sendable, Equatable {
    /// The host's identifier (a UUID), for `bgtask transfers` and `bgtask why`.
    public var id: String
    /// The app (a transfer an extension starts belongs to its containing app).
    public var app: String
    public var session: String
    public var taskIdentifier: Int
    public var taskDescription: String?
    public var kind: TransferKind
    public var url: String
    public var method: String
    public var state: TransferState
    /// While `waiting`: the condition holding it back ("discretionary: the device is on battery", ...).
    public var heldBy: String?
    public var bytesReceived: Int64
    /// -1: unknown (no Content-Length).
    public var bytesExpectedToReceive: Int64
    public var bytesSent: Int64
    public var bytesExpectedToSend: Int64
    public var response: TransferResponse?
    /// `download`, `completed`: the file the body was written to, inside the app's container,
    /// owned by the app; valid until the app is told (`delivered`).
    public var file: String?
    /// `data` and `upload`, `completed`: the response body, when small enough to cross the
    /// channel (`TransferLimits.inlineBodyBytes`: base64 in JSON must fit one channel frame).
    public var body: Data?
    public var error: TransferError?
    public var createdAt: Double
    public var finishedAt: Double?
    /// Attempts so far (a retry after a lost connection or a host restart is one more).
    public var attempts: Int
    /// Whether it resumed from a partial download (`Range`) at least once.
    public var resumed: Bool
    public var sendsLaunchEvents: Bool
    public var discretionary: Bool

    public init(id: String, app: String, request: TransferRequest, state: TransferState = .waiting, createdAt: Double) {
        self.id = id
        self.app = app
        session = request.session
        taskIdentifier = request.taskIdentifier
        taskDescription = request.taskDescription
        kind = request.kind
        url = request.url
        method = request.method
        self.state = state
        bytesReceived = 0
        bytesExpectedToReceive = -1
        bytesSent = 0
        bytesExpectedToSend = 0
        self.createdAt = createdAt
        attempts = 0
        resumed = false
        sendsLaunchEvents = request.sendsLaunchEvents
        discretionary = request.discretionary
    }
}

/// What a launch asks of the host about its background sessions (`op` names it):
/// - `create` (`request`): a task resumed; answered with `transfer`.
/// - `cancel` (`id`): the app cancelled the task; the host stops it and answers with `transfer`.
/// - `attach` (`session`): the app made a session with this identifier; answered with
///   `transfers`, every transfer of the session not yet delivered. From then on this launch
///   receives the session's `TransferEvent`s.
/// - `delivered` (`id`): the app was told the transfer ended (its delegate returned): the host
///   forgets the file and keeps the record as `delivered`.
/// - `events-handled` (`session`): the completion handler of
///   `application(_:handleEventsForBackgroundURLSession:completionHandler:)` was called.
public enum TransferCall: Sendable, Equatable {
    case create(TransferRequest)
    case cancel(id: String)
    case attach(session: String)
    case delivered(id: String)
    case eventsHandled(session: String)

    /// The call's name on the wire.
    public enum Op: String, Sendable, CaseIterable {
        case create, cancel, attach, delivered
        case eventsHandled = "events-handled"
    }

    public var op: Op {
        switch self {
        case .create: .create
        case .cancel: .cancel
        case .attach: .attach
        case .delivered: .delivered
        case .eventsHandled: .eventsHandled
        }
    }

    /// What is wrong with the call (naming the field), or nil.
    public var problem: String? {
        switch self {
        case .create(let request):
            return request.problem.map { "create: \($0)" }
        case .cancel(let id), .delivered(let id):
            guard !id.isEmpty, id.utf8.count <= 64 else { return "\(op.rawValue): no transfer id" }
        case .attach(let session), .eventsHandled(let session):
            guard !session.isEmpty, session.utf8.count <= TransferLimits.identifierBytes else { return "\(op.rawValue): no session identifier" }
        }
        return nil
    }

    /// The call a launch sent as JSON, or what is wrong with it (naming the field): a hostile
    /// child can send anything.
    public static func decode(_ json: Data) -> Result<TransferCall, TransferCallProblem> {
        let call: TransferCall
        do { call = try JSONDecoder().decode(TransferCall.self, from: json) } catch {
            if case DecodingError.dataCorrupted(let context) = error, !context.codingPath.isEmpty {
                return .failure(TransferCallProblem(message: context.debugDescription))
            }
            return .failure(TransferCallProblem(message: "the call is not a TransferCall's JSON"))
        }
        return call.problem.map { .failure(TransferCallProblem(message: $0)) } ?? .success(call)
    }
}

/// Why a launch's transfer call was refused.
public struct TransferCallProblem: Error, Sendable, Equatable {
    public var message: String
}

extension TransferCall: Codable {
    private enum Key: String, CodingKey { case op, request, id, session }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: Key.self)
        let name = try container.decode(String.self, forKey: .op)
        guard let op = Op(rawValue: name) else {
            throw DecodingError.dataCorruptedError(forKey: .op, in: container, debugDescription:
                "op: '\(name.prefix(40))' is not one of \(Op.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        func required<T: Decodable>(_ key: Key, _ what: String) throws -> T {
            guard let value = try container.decodeIfPresent(T.self, forKey: key) else {
                throw DecodingError.dataCorruptedError(forKey: key, in: container, debugDescription: "\(op.rawValue): no \(what)")
            }
            return value
        }
        switch op {
        case .create: self = .create(try required(.request, "request"))
        case .cancel: self = .cancel(id: try required(.id, "transfer id"))
        case .delivered: self = .delivered(id: try required(.id, "transfer id"))
        case .attach: self = .attach(session: try required(.session, "session identifier"))
        case .eventsHandled: self = .eventsHandled(session: try required(.session, "session identifier"))
        }
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        try container.encode(op.rawValue, forKey: .op)
        switch self {
        case .create(let request): try container.encode(request, forKey: .request)
        case .cancel(let id), .delivered(let id): try container.encode(id, forKey: .id)
        case .attach(let session), .eventsHandled(let session): try container.encode(session, forKey: .session)
        }
    }
}

/// The host's answer to a `TransferCall` (the status and message travel beside it).
public struct TransferReply: Codable, Sendable, Equatable {
    public var transfer: TransferInfo?
    public var transfers: [TransferInfo]?
    public init(transfer: TransferInfo? = nil, transfers: [TransferInfo]? = nil) {
        self.transfer = transfer
        self.transfers = transfers
    }
}

/// What the host tells the launch attached to a session: `progress` (bytes moved; at most a few
/// a second per transfer) or `finished` (the transfer reached `completed`, `failed` or
/// `cancelled`; `transfer` holds the response, the file or the error).
public struct TransferEvent: Codable, Sendable, Equatable {
    public var event: String
    public var transfer: TransferInfo
    public init(event: String, transfer: TransferInfo) {
        self.event = event
        self.transfer = transfer
    }
}

/// The `eventJSON` of a launch with reason `background-transfer`: the sessions with events waiting.
public struct TransferLaunchEvent: Codable, Sendable, Equatable {
    public var sessions: [String]
    public init(sessions: [String]) { self.sessions = sessions }
}

/// Bounds on what a launch may hand the host.
public enum TransferLimits {
    public static let identifierBytes = 256
    public static let descriptionBytes = 1024
    public static let urlBytes = 8 * 1024
    public static let pathBytes = 4096
    public static let headers = 100
    public static let headerBytes = 32 * 1024
    /// A `TransferCall`'s JSON.
    public static let callBytes = 64 * 1024
    /// A response body carried in `TransferInfo.body` (data and upload tasks).
    public static let inlineBodyBytes = 128 * 1024
    /// Transfers per app not yet delivered.
    public static let activePerApp = 1000
}

extension JSONEncoder {
    /// One line, keys sorted: how transfer values cross the ABI and the channel.
    public static var transferJSON: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }
}

import BGTaskABI
import BGTaskModel
import BackgroundTasks
import CBGTaskPluginABI
import Foundation
import FoundationNetworking
import _BGTaskURLSessionHook

/// A background session's side in the app (issue 16, docs/transfers.md): the sessions the app
/// made, the tasks it handed to the host, and the delivery of the host's events to the
/// session's delegate, as iOS delivers them:
///
/// - a task resumed → `create` (the host starts carrying it);
/// - while the app runs → progress (`didWriteData`, `didSendBodyData`), then the end: for a
///   download `didFinishDownloadingTo` with the file in the container (removed when the method
///   returns, so the app must move it), then `didCompleteWithError`; for an upload or data task
///   the response's data then `didCompleteWithError`;
/// - when the app makes a background session → `attach`: the session's tasks the host still
///   holds come back as tasks of the new session (their events are delivered as above), as a
///   relaunched app's recreated session receives them on iOS;
/// - a launch for `background-transfer` → `application(_:handleEventsForBackgroundURLSession:
///   completionHandler:)`, then once the session's waiting events are delivered
///   `urlSessionDidFinishEvents(forBackgroundURLSession:)`; the completion handler ends the launch.
final class BackgroundSessions: @unchecked Sendable {
    static let shared = BackgroundSessions()

    /// A task handed to the host, while the app has not been told how it ended.
    final class Link: @unchecked Sendable {
        let id: String
        let session: URLSession
        let sessionIdentifier: String
        let task: URLSessionTask
        weak var urlProtocol: BackgroundTransferProtocol?
        var info: TransferInfo
        var reportedReceived: Int64 = 0
        var reportedSent: Int64 = 0
        /// The end was delivered (or the app cancelled the task).
        var done = false

        init(info: TransferInfo, session: URLSession, sessionIdentifier: String, task: URLSessionTask, urlProtocol: BackgroundTransferProtocol) {
            id = info.id
            self.info = info
            self.session = session
            self.sessionIdentifier = sessionIdentifier
            self.task = task
            self.urlProtocol = urlProtocol
        }
    }

    /// A session the host said had events waiting (a `background-transfer` launch), until they
    /// are delivered and the app's completion handler is called.
    private struct WaitingEvents {
        /// Transfers that had ended when the session attached, not yet delivered.
        var outstanding: Set<String> = []
        var attached = false
        var finished = false
        /// The completion handler given to handleEvents: called here once the events are
        /// delivered unless the delegate takes `urlSessionDidFinishEvents` (see `FinishEvents`).
        var complete: (@Sendable () -> Void)?
    }

    private let lock = NSLock()
    /// Host calls and event handling, in order, off the app's threads.
    private let queue = DispatchQueue(label: "bgtask.background-sessions")
    private var links: [String: Link] = [:]
    /// Tasks made for transfers the host returned on `attach`, until their protocol starts.
    private var replays: [ObjectIdentifier: TransferInfo] = [:]
    /// Events that arrived before their task's protocol started.
    private var early: [String: TransferInfo] = [:]
    private var waiting: [String: WaitingEvents] = [:]
    /// Sessions of a `background-transfer` launch whose handleEvents has not been called yet,
    /// with the ends that arrived meanwhile: iOS calls handleEvents first, then the session's
    /// delegate hears its tasks' ends, whenever the app recreated the session.
    private var held: [String: [Link]] = [:]
    private var subscribed = false

    // MARK: Sessions

    /// A session was made (the hook on URLSession's initializer). A background one attaches to
    /// the host: its undelivered transfers come back as tasks.
    func created(_ session: URLSession) {
        guard let configuration = session.configuration as? BackgroundSessionConfiguration,
              let identifier = configuration.identifier else { return }
        subscribe()
        registerHandOver()
        queue.async { self.attach(session, identifier: identifier) }
    }

    /// A suspended process was resumed for a new launch: the host routes a session's events to
    /// the launch that attached it last, which is over, so every background session the app
    /// still has attaches again from this one. What the host holds for a task the app already
    /// has reaches that task; the rest come back as tasks, as for a new session. The previous
    /// launch's waiting events are its own, and are forgotten.
    /// `holding`: the sessions this launch brings events of (their ends wait for handleEvents).
    func resumed(holding identifiers: [String]) {
        let (live, stale): ([(String, URLSession)], [Link]) = lock.withLock {
            waiting.removeAll()
            let stale = held.values.flatMap { $0 }
            held = [:]
            for identifier in identifiers { held[identifier] = [] }
            return (sessions.compactMap { identifier, weak in weak.session.map { (identifier, $0) } }, stale)
        }
        // Ends an earlier launch held and never released (its handleEvents did not run).
        for link in stale { queue.async { self.deliverEnd(link) } }
        for (identifier, session) in live.sorted(by: { $0.0 < $1.0 }) {
            queue.async { self.attach(session, identifier: identifier) }
        }
    }

    private func attach(_ session: URLSession, identifier: String) {
        let transfers: [TransferInfo]
        switch Host.call(.attach(session: identifier)) {
        case let .success(reply): transfers = reply.transfers ?? []
        case let .failure(error):
            log(BGTASK_LOG_ERROR, "background session \(identifier): the host did not attach it: \(error.message)")
            return
        }
        lock.withLock {
            var events = waiting[identifier] ?? WaitingEvents()
            events.attached = true
            events.outstanding.formUnion(transfers.filter(\.state.isFinished).map(\.id))
            waiting[identifier] = events
        }
        for transfer in transfers.sorted(by: { $0.taskIdentifier < $1.taskIdentifier }) {
            // A task of this process's (attached again after a resume): its news, not a replay.
            if let link = lock.withLock({ links[transfer.id] }) {
                apply(transfer, to: link, finished: transfer.state.isFinished)
                continue
            }
            guard let url = URL(string: transfer.url) else { continue }
            var request = URLRequest(url: url)
            request.httpMethod = transfer.method
            let task: URLSessionTask = switch transfer.kind {
            case .download: session.downloadTask(with: request)
            case .upload: session.uploadTask(with: request, from: Data())
            case .data: session.dataTask(with: request)
            }
            task.taskDescription = transfer.taskDescription
            lock.withLock { replays[ObjectIdentifier(task)] = transfer }
            task.resume()
        }
        finishEventsIfDelivered(identifier)
    }

    /// A launch for `background-transfer`: the host has events of `identifier` waiting;
    /// `complete` is the completion handler handleEvents receives.
    func expectEvents(_ identifier: String, complete: @escaping @Sendable () -> Void) {
        lock.withLock { waiting[identifier, default: WaitingEvents()].complete = complete }
        queue.async { self.finishEventsIfDelivered(identifier) }
    }

    /// handleEvents' completion handler was called (or the launch's time ran out).
    func eventsHandled(_ identifier: String) {
        queue.async { _ = Host.call(.eventsHandled(session: identifier)) }
    }

    // MARK: Tasks

    func start(_ urlProtocol: BackgroundTransferProtocol) {
        guard let task = urlProtocol.task else { return }
        guard let session = TaskInternals.session(of: task), let identifier = session.configuration.identifier else {
            fail(urlProtocol, code: .unknown, "this Foundation does not let bgtask find the task's session")
            return
        }
        subscribe()
        if let replay = lock.withLock({ replays.removeValue(forKey: ObjectIdentifier(task)) }) {
            let info = lock.withLock { early.removeValue(forKey: replay.id) } ?? replay
            let link = Link(info: info, session: session, sessionIdentifier: identifier, task: task, urlProtocol: urlProtocol)
            link.reportedReceived = info.bytesReceived
            link.reportedSent = info.bytesSent
            lock.withLock { links[info.id] = link }
            if info.state.isFinished { queue.async { self.deliverEnd(link) } }
            return
        }
        let request: TransferRequest
        do {
            request = try transferRequest(for: task, in: session, identifier: identifier)
        } catch {
            fail(urlProtocol, code: .unsupportedURL, error.message)
            return
        }
        switch Host.call(.create(request)) {
        case let .success(reply):
            guard let info = reply.transfer else {
                fail(urlProtocol, code: .unknown, "the host answered without the transfer")
                return
            }
            let link = Link(info: info, session: session, sessionIdentifier: identifier, task: task, urlProtocol: urlProtocol)
            lock.withLock { links[info.id] = link }
            if let newer = lock.withLock({ early.removeValue(forKey: info.id) }) {
                queue.async { self.apply(newer, to: link, finished: newer.state.isFinished) }
            }
        case let .failure(error):
            fail(urlProtocol, code: error.status == Int32(BGTASK_E_INVALID_ARGUMENT.rawValue) ? .unsupportedURL : .cannotConnectToHost, error.message)
        }
    }

    /// The app cancelled the task: the host stops it, and Foundation reports the cancellation
    /// to the delegate. False when the task's end was already delivered or is being delivered
    /// (then there is nothing to cancel and nothing more to report).
    @discardableResult
    func stop(_ urlProtocol: BackgroundTransferProtocol) -> Bool {
        let link: Link? = lock.withLock {
            guard !urlProtocol.ended, let link = links.values.first(where: { $0.urlProtocol === urlProtocol }), !link.done else { return nil }
            link.done = true
            urlProtocol.ended = true
            links.removeValue(forKey: link.id)
            return link
        }
        guard let link else { return lock.withLock { !urlProtocol.ended } }
        queue.async {
            _ = Host.call(.cancel(id: link.id))
            _ = Host.call(.delivered(id: link.id))
        }
        return true
    }

    private func transferRequest(for task: URLSessionTask, in session: URLSession, identifier: String) throws(HostError) -> TransferRequest {
        guard let original = task.originalRequest ?? task.currentRequest, let url = original.url else {
            throw HostError(status: 100, message: "the task has no request")
        }
        let configuration = session.configuration
        var headers: [TransferHeader] = []
        var named = Set<String>()
        for (name, value) in original.allHTTPHeaderFields ?? [:] {
            headers.append(TransferHeader(name: name, value: value))
            named.insert(name.lowercased())
        }
        for (key, value) in configuration.httpAdditionalHeaders ?? [:] {
            guard let name = key.base as? String, !named.contains(name.lowercased()) else { continue }
            headers.append(TransferHeader(name: name, value: "\(value)"))
        }
        headers.sort { $0.name.lowercased() < $1.name.lowercased() }
        let kind: TransferKind
        var bodyFile: String?
        switch task {
        case is URLSessionDownloadTask: kind = .download
        case is URLSessionUploadTask:
            kind = .upload
            switch TaskInternals.body(of: task) {
            case let .file(file)?: bodyFile = file.standardizedFileURL.path
            case let .data(data)?: bodyFile = try spool(data)
            case .stream?: throw HostError(status: 100, message: "upload tasks from a stream are not supported in background sessions")
            case .none?, nil:
                if let data = original.httpBody { bodyFile = try spool(data) } else { bodyFile = try spool(Data()) }
            }
        default: kind = .data
        }
        return TransferRequest(
            session: identifier, taskIdentifier: task.taskIdentifier, taskDescription: task.taskDescription, kind: kind,
            url: url.absoluteString, method: original.httpMethod ?? "GET", headers: headers, bodyFile: bodyFile,
            discretionary: configuration.isDiscretionary, sendsLaunchEvents: configuration.sessionSendsLaunchEvents,
            allowsCellularAccess: configuration.allowsCellularAccess && original.allowsCellularAccess,
            allowsExpensiveNetworkAccess: configuration.allowsExpensiveNetworkAccess,
            allowsConstrainedNetworkAccess: configuration.allowsConstrainedNetworkAccess,
            requestTimeout: original.timeoutInterval > 0 ? min(original.timeoutInterval, configuration.timeoutIntervalForRequest) : configuration.timeoutIntervalForRequest,
            resourceTimeout: configuration.timeoutIntervalForResource,
            earliestBeginDate: (task as any EarliestBeginDateReading).taskEarliestBeginDate?.timeIntervalSince1970)
    }

    /// An upload's body given as data: written to a file in the container's tmp for the host
    /// to copy (iOS refuses data bodies in background sessions; here they are carried anyway).
    private func spool(_ data: Data) throws(HostError) -> String {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-upload-\(UUID().uuidString)")
        do { try data.write(to: file) } catch {
            throw HostError(status: 101, message: "could not write the upload's body to \(file.path): \(error)")
        }
        return file.path
    }

    // MARK: Handing tasks over before the launch ends

    private var handOverRegistered = false

    /// A task resumed reaches the host on its session's work queue, a moment after `resume()`
    /// returns; an app that resumes downloads and at once completes its task must not lose
    /// them when its process ends. Before a task completes (or background time ends), every
    /// background session's work queue is drained: Foundation runs `getAllTasks`'s handler on
    /// that queue after the work `resume()` queued, which hands the task to the host.
    private func registerHandOver() {
        let first = lock.withLock { () -> Bool in
            defer { handOverRegistered = true }
            return !handOverRegistered
        }
        guard first else { return }
        HostConnection.current.beforeEnding { done in BackgroundSessions.shared.drain(then: done) }
    }

    /// Calls `then` once each background session's work queue, then the host calls queued here,
    /// have run what was queued before (Foundation runs `getAllTasks`'s handler on the delegate
    /// queue after a turn of the work queue), or after 5 s: a host that does not answer cannot hold the app's completion.
    /// Asynchronous: the app may be completing its task on that very delegate queue.
    func drain(then: @escaping @Sendable () -> Void) {
        let live = lock.withLock { sessions.values.compactMap(\.session) }
        let once = OnceFlag()
        let finish: @Sendable () -> Void = { if once.first() { then() } }
        let group = DispatchGroup()
        for session in live {
            group.enter()
            session.getAllTasks { _ in group.leave() }
        }
        // Then the calls queued for the host (a session's attach, a cancel, a delivery) reach
        // it before the launch ends: an attach still queued when the process exits is lost.
        group.notify(queue: queue) { DispatchQueue.global().async(execute: finish) }
        DispatchQueue.global().asyncAfter(deadline: .now() + 5, execute: finish)
    }

    // MARK: Events

    private func subscribe() {
        let first = lock.withLock { () -> Bool in
            defer { subscribed = true }
            return !subscribed
        }
        guard first, let (api, host) = HostConnection.current.connection, api.has(\.transfer_events) else { return }
        api.transfer_events(host, receiveEvent, nil)
    }

    /// An event from the host (on the runner's reader thread): decoded and handled in order.
    fileprivate func received(_ json: Data) {
        guard let event = try? JSONDecoder().decode(TransferEvent.self, from: json) else {
            log(BGTASK_LOG_ERROR, "background session: an event the app could not read: \(String(decoding: json.prefix(200), as: UTF8.self))")
            return
        }
        queue.async {
            guard let link = self.lock.withLock({ self.links[event.transfer.id] }) else {
                // Its task's protocol has not started yet (kept for it), or it was delivered
                // (a late progress event: the bound keeps such leftovers from piling up).
                self.lock.withLock {
                    if self.early.count < 1024 || self.early[event.transfer.id] != nil { self.early[event.transfer.id] = event.transfer }
                }
                return
            }
            self.apply(event.transfer, to: link, finished: event.event == "finished" || event.transfer.state.isFinished)
        }
    }

    private func apply(_ info: TransferInfo, to link: Link, finished: Bool) {
        guard !lock.withLock({ link.done }) else { return }
        link.info = info
        reportProgress(link)
        if finished { deliverEnd(link) }
    }

    private func reportProgress(_ link: Link) {
        let info = link.info
        let session = link.session
        let task = link.task
        if info.bytesReceived > link.reportedReceived, let download = task as? URLSessionDownloadTask {
            let written = info.bytesReceived - link.reportedReceived
            link.reportedReceived = info.bytesReceived
            session.delegateQueue.addOperation {
                (download.delegate as? URLSessionDownloadDelegate)?.urlSession(
                    session, downloadTask: download, didWriteData: written, totalBytesWritten: info.bytesReceived,
                    totalBytesExpectedToWrite: info.bytesExpectedToReceive)
            }
        }
        if info.bytesSent > link.reportedSent {
            let sent = info.bytesSent - link.reportedSent
            link.reportedSent = info.bytesSent
            session.delegateQueue.addOperation {
                task.delegate?.urlSession(session, task: task, didSendBodyData: sent, totalBytesSent: info.bytesSent,
                                          totalBytesExpectedToSend: info.bytesExpectedToSend)
            }
        }
    }

    /// The transfer ended: the response, then the file or the data, then the completion, on the
    /// session's delegate queue; the host is told it was delivered just before the completion.
    /// A `background-transfer` launch brings events of `identifiers`: their ends wait for
    /// `releaseEvents` (before the app can make the sessions).
    func holdEvents(_ identifiers: [String]) {
        lock.withLock { for identifier in identifiers where held[identifier] == nil { held[identifier] = [] } }
    }

    /// handleEvents was called for `identifier`: its held ends are delivered, in order.
    func releaseEvents(_ identifier: String) {
        queue.async {
            let links = self.lock.withLock { self.held.removeValue(forKey: identifier) } ?? []
            for link in links { self.deliverEnd(link) }
        }
    }

    private func deliverEnd(_ link: Link) {
        let proceed = lock.withLock { () -> Bool in
            guard !link.done else { return false }
            if held[link.sessionIdentifier] != nil {
                held[link.sessionIdentifier]?.append(link)
                return false
            }
            link.done = true
            link.urlProtocol?.ended = true
            return true
        }
        guard proceed else { return }
        let info = link.info
        let session = link.session
        let task = link.task
        let urlProtocol = link.urlProtocol
        let url = URL(string: info.url)
        if let response = info.response, let url, let urlProtocol {
            let fields = Dictionary(response.headers.map { ($0.name, $0.value) }) { first, second in "\(first), \(second)" }
            if let http = TransferResponse(url: url, statusCode: response.status, httpVersion: "HTTP/1.1", headerFields: fields) {
                urlProtocol.client?.urlProtocol(urlProtocol, didReceive: http, cacheStoragePolicy: .notAllowed)
            }
        }
        // The host forgets the transfer once the app has it: told before the delegate hears the
        // task completed, since the app may end its launch (and its process) right then.
        let delivered: @Sendable () -> Void = { [self] in
            lock.withLock { _ = links.removeValue(forKey: info.id) }
            _ = Host.call(.delivered(id: info.id))
        }
        // Once the delegate's calls for it are queued: the session's last event may end its
        // events (urlSessionDidFinishEvents comes after them on the delegate queue).
        let counted: @Sendable () -> Void = { [self] in
            queue.async { self.markDelivered(info.id, session: link.sessionIdentifier) }
        }
        switch info.state {
        case .completed where info.kind == .download:
            // Foundation's own completion of a download needs a file its protocols keep to
            // themselves: the delegate is called here instead (the task's `state` stays
            // `.running` in Foundation's books; docs/sdk.md).
            session.delegateQueue.addOperation {
                if let file = info.file, let download = task as? URLSessionDownloadTask {
                    let location = URL(fileURLWithPath: file)
                    (download.delegate as? URLSessionDownloadDelegate)?.urlSession(session, downloadTask: download, didFinishDownloadingTo: location)
                    // Valid until the method returns, as on iOS.
                    try? FileManager.default.removeItem(at: location)
                }
                delivered()
                task.delegate?.urlSession(session, task: task, didCompleteWithError: nil)
                counted()
            }
        case .completed:
            delivered()
            if let urlProtocol {
                if let body = info.body, !body.isEmpty { urlProtocol.client?.urlProtocol(urlProtocol, didLoad: body) }
                urlProtocol.client?.urlProtocolDidFinishLoading(urlProtocol)
            }
            counted()
        default:
            let error = info.error ?? TransferError(code: TransferError.unknownCode, message: "the transfer ended as \(info.state.rawValue)")
            var userInfo: [String: Any] = [NSLocalizedDescriptionKey: error.message, "NSErrorFailingURLStringKey": info.url]
            if let url { userInfo[NSURLErrorFailingURLErrorKey] = url }
            let failure = URLError(URLError.Code(rawValue: error.code) ?? .unknown, userInfo: userInfo)
            delivered()
            if let urlProtocol { urlProtocol.client?.urlProtocol(urlProtocol, didFailWithError: failure) }
            counted()
        }
    }

    private func markDelivered(_ id: String, session identifier: String) {
        lock.withLock { _ = waiting[identifier]?.outstanding.remove(id) }
        finishEventsIfDelivered(identifier)
    }

    /// Every event waiting for the session was delivered: `urlSessionDidFinishEvents` (once),
    /// and the completion of a delegate without handleEvents.
    private func finishEventsIfDelivered(_ identifier: String) {
        let complete: (@Sendable () -> Void)?? = lock.withLock {
            guard var events = waiting[identifier], let complete = events.complete, events.attached, events.outstanding.isEmpty,
                  !events.finished else { return nil }
            events.finished = true
            waiting[identifier] = events
            return complete
        }
        guard let complete, let complete else { return }
        guard let session = sessionObject(identifier) else { return complete() }
        session.delegateQueue.addOperation {
            if let delegate = session.delegate as? URLSessionBackgroundEventsDelegate {
                delegate.urlSessionDidFinishEvents(forBackgroundURLSession: session)
            } else if let delegate = session.delegate,
                      UndeclaredMethod.call(UndeclaredMethod.finishEvents, on: delegate, with: session) {
                // The delegate's own method, found by name as iOS finds it (UndeclaredMethod).
            } else {
                complete()
            }
        }
    }

    private var sessions: [String: WeakSession] = [:]

    func remember(_ session: URLSession, identifier: String) {
        lock.withLock { sessions[identifier] = WeakSession(session) }
    }

    private func sessionObject(_ identifier: String) -> URLSession? {
        lock.withLock { sessions[identifier]?.session }
    }

    private func fail(_ urlProtocol: BackgroundTransferProtocol, code: URLError.Code, _ message: String) {
        log(BGTASK_LOG_ERROR, "background session: \(message)")
        urlProtocol.client?.urlProtocol(urlProtocol, didFailWithError: URLError(code, userInfo: [NSLocalizedDescriptionKey: message]))
    }

    private func log(_ level: Int32, _ message: String) {
        guard let (api, host) = HostConnection.current.connection else { return }
        api.log(host, level, message)
    }
}

/// `urlSessionDidFinishEvents(forBackgroundURLSession:)`, which Apple's `URLSessionDelegate`
/// declares and swift-corelibs-foundation's does not. A delegate needs no conformance: its
/// method is found by name (`UndeclaredMethod`) and called as iOS calls it. This protocol stays
/// for a delegate whose method cannot be found that way (a generic class): one line,
/// `extension DownloadManager: URLSessionBackgroundEventsDelegate {}`, makes it callable. A
/// delegate without the method has handleEvents' completion handler called by bgtask once every
/// waiting event was delivered, which is what that method does in Apple's pattern.
public protocol URLSessionBackgroundEventsDelegate: AnyObject {
    func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession)
}

private final class WeakSession {
    weak var session: URLSession?
    init(_ session: URLSession) { self.session = session }
}

/// The runner's call with a transfer event's JSON (on its reader thread): copied and queued.
private let receiveEvent: bgtask_json_visitor = { _, json in
    guard let json else { return }
    BackgroundSessions.shared.received(Data(bytes: json, count: strlen(json)))
}

/// The hook on URLSession's initializer (hook.c): every session the app makes comes here.
@_cdecl("bgtask_urlsession_created")
func bgtaskURLSessionCreated(_ pointer: UnsafeMutableRawPointer?) {
    guard let pointer else { return }
    let session = Unmanaged<URLSession>.fromOpaque(pointer).takeUnretainedValue()
    guard session.configuration is BackgroundSessionConfiguration, let identifier = session.configuration.identifier else { return }
    BackgroundSessions.shared.remember(session, identifier: identifier)
    BackgroundSessions.shared.created(session)
}

/// Why a host call failed: its status and the host's words.
struct HostError: Error {
    var status: Int32
    var message: String
}

/// The ABI's `transfer_call`: a `TransferCall` out, a `TransferReply` back.
enum Host {
    static func call(_ call: TransferCall) -> Result<TransferReply, HostError> {
        guard let (api, host) = HostConnection.current.connection, api.has(\.transfer_call) else {
            return .failure(HostError(status: 1, message: "background sessions are carried by the host only inside a bgtask launch"))
        }
        let json: Data
        do { json = try JSONEncoder.transferJSON.encode(call) } catch {
            return .failure(HostError(status: 100, message: "the call could not be encoded: \(error)"))
        }
        let answer = Answer()
        let status = (json + [0]).withUnsafeBytes { bytes in
            api.transfer_call(host, bytes.baseAddress!.assumingMemoryBound(to: CChar.self), collectAnswer, Unmanaged.passUnretained(answer).toOpaque())
        }
        return withExtendedLifetime(answer) {
            guard status == 0 else {
                let message = (try? JSONDecoder().decode([String: String].self, from: answer.data))?["error"] ?? "the host failed (status \(status))"
                return .failure(HostError(status: status, message: message))
            }
            do { return .success(try JSONDecoder().decode(TransferReply.self, from: answer.data)) } catch {
                return .failure(HostError(status: 101, message: "the host's answer could not be read: \(error)"))
            }
        }
    }

    private final class Answer {
        var data = Data()
    }

    private static let collectAnswer: bgtask_json_visitor = { context, json in
        guard let context, let json else { return }
        Unmanaged<Answer>.fromOpaque(context).takeUnretainedValue().data = Data(bytes: json, count: strlen(json))
    }
}

/// A task's `earliestBeginDate`, which the host honours for a background session's task.
/// Foundation on Linux deprecates the property (it has no effect on its own sessions); the
/// deprecated reader is called through this protocol, so that building the UIKit module shows
/// no deprecation warning for this deliberate use.
protocol EarliestBeginDateReading {
    var taskEarliestBeginDate: Date? { get }
}

extension URLSessionTask: EarliestBeginDateReading {
    @available(*, deprecated, message: "reads Foundation's deprecated earliestBeginDate")
    var taskEarliestBeginDate: Date? { earliestBeginDate }
}

/// The response the host's transfer got, as the app's task sees it. Its `suggestedFilename`
/// falls back as Apple's does: the Content-Disposition filename, else the URL's last path
/// component (Linux's Foundation says "Unknown" there).
final class TransferResponse: HTTPURLResponse, @unchecked Sendable {
    override var suggestedFilename: String? {
        let named = super.suggestedFilename
        if let named, named != "Unknown" { return named }
        let last = url?.lastPathComponent ?? ""
        return last.isEmpty || last == "/" ? named : last
    }
}

import BGTaskControl
import Foundation

/// The pages watching the host's events (`/events`, server-sent events): each subscriber a
/// stream of ready-to-send event texts. Bounded: at most `maximumSubscribers` at once, each
/// holding at most `bufferedEvents` unsent (a page that stops reading loses its oldest, and
/// reloads what it shows on its next tick); a heartbeat comment every 15 s finds closed ones.
final class DashboardHub: @unchecked Sendable {
    static let maximumSubscribers = 64
    static let bufferedEvents = 1024
    private let lock = NSLock()
    private var subscribers: [UUID: AsyncStream<String>.Continuation] = [:]
    private var closed = false

    /// A new subscriber's stream and its id (for `unsubscribe`), or nil when there are too many.
    func subscribe() -> (stream: AsyncStream<String>, id: UUID)? {
        let id = UUID()
        let (stream, continuation) = AsyncStream<String>.makeStream(bufferingPolicy: .bufferingNewest(Self.bufferedEvents))
        let added: Bool = lock.withLock {
            guard !closed, subscribers.count < Self.maximumSubscribers else { return false }
            subscribers[id] = continuation
            return true
        }
        guard added else { return nil }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            _ = self.lock.withLock { self.subscribers.removeValue(forKey: id) }
        }
        continuation.yield("retry: 2000\n: bgtask events\n\n")
        return (stream, id)
    }

    /// A subscriber's connection closed: its stream ends and its place is free at once (not
    /// at the next heartbeat's failed write).
    func unsubscribe(_ id: UUID) {
        lock.withLock { subscribers.removeValue(forKey: id) }?.finish()
    }

    func publish(_ event: DashboardEvent) {
        let text: String?
        switch event {
        case .launchBegan(let launch): text = Self.frame("launch-began", try? JSONEncoder.control.encode(launch))
        case .launchEnded(let record): text = Self.frame("launch-ended", try? JSONEncoder.control.encode(record))
        }
        guard let text else { return }
        let targets = lock.withLock { Array(subscribers.values) }
        for continuation in targets { continuation.yield(text) }
    }

    /// A comment line every subscriber is sent, so that a closed connection is noticed.
    func heartbeat() {
        let targets = lock.withLock { Array(subscribers.values) }
        for continuation in targets { continuation.yield(": heartbeat\n\n") }
    }

    func close() {
        let targets: [AsyncStream<String>.Continuation] = lock.withLock {
            closed = true
            defer { subscribers = [:] }
            return Array(subscribers.values)
        }
        for continuation in targets { continuation.finish() }
    }

    /// One event: its name and its JSON on one `data:` line (JSON has no raw newline).
    static func frame(_ name: String, _ json: Data?) -> String? {
        guard let json else { return nil }
        return "event: \(name)\ndata: \(String(decoding: json, as: UTF8.self))\n\n"
    }
}

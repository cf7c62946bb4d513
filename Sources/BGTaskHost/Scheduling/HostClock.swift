import Foundation

/// The host's notion of now. `real` is the wall clock; `virtual` is a clock that moves only when
/// told to (`bgtask clock advance 15m`), persisted in the store, so every scheduling decision is
/// reproducible in tests. Launches themselves (budgets, grace) always run in real time.
public final class HostClock: @unchecked Sendable {
    public enum Mode: String, Sendable, Codable { case real, virtual }

    public let mode: Mode
    private let store: PendingRequestStore
    private let lock = NSLock()
    private var virtualNow: Date

    static let settingKey = "clock.virtual"

    public init(mode: Mode, store: PendingRequestStore) throws(BGTaskError) {
        self.mode = mode
        self.store = store
        if let saved = try store.setting(Self.settingKey), let seconds = Double(saved) {
            virtualNow = Date(timeIntervalSince1970: seconds)
        } else {
            // A whole second, so that dates printed to the second are exact.
            virtualNow = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
            if mode == .virtual { try store.setSetting(Self.settingKey, "\(virtualNow.timeIntervalSince1970)") }
        }
    }

    public var now: Date {
        mode == .real ? Date() : lock.withLock { virtualNow }
    }

    /// Moves the virtual clock forward. Refused for the real clock.
    public func advance(by seconds: TimeInterval) throws(BGTaskError) -> Date {
        guard mode == .virtual else {
            throw BGTaskError(.invalidRequest, "the host runs on the real clock; start it with --clock virtual to advance time")
        }
        guard seconds >= 0 else { throw BGTaskError(.invalidRequest, "the clock only moves forward") }
        let next = lock.withLock {
            virtualNow = virtualNow.addingTimeInterval(seconds)
            return virtualNow
        }
        try store.setSetting(Self.settingKey, "\(next.timeIntervalSince1970)")
        return next
    }
}

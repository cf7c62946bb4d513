import BGTaskModel
import Foundation

/// The host's notion of now. `real` is the wall clock; `virtual` is a clock that moves only when
/// told to (`bgtask clock advance 15m`), persisted in the store, so every scheduling decision is
/// reproducible in tests. Launches themselves (budgets, grace) always run in real time.
public final class HostClock: @unchecked Sendable {
    public enum Mode: String, Sendable, Codable { case real, virtual }

    public let mode: Mode
    private let store: any ClockSettings
    private let lock = NSLock()
    private var virtualNow: Date

    package static let settingKey = "clock.virtual"

    /// How far from now a date may be: the virtual clock from the real one (so one advance
    /// moves it at most this far), and a request's `earliestBeginDate` or a submission's delay
    /// from the host's clock. A date beyond it is no schedule but an attack on the arithmetic
    /// (`clock advance 1e308` left no date representable after it).
    public static let maximumOffset: TimeInterval = 100 * 365.25 * 86_400
    package static let maximumOffsetText = "100 years"

    /// Why a persisted virtual clock was not used (it was reset to now), for the host to log.
    public private(set) var resetReason: String?

    package init(mode: Mode, store: any ClockSettings) throws(BGTaskError) {
        self.mode = mode
        self.store = store
        // A whole second, so that dates printed to the second are exact.
        let realNow = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        if let saved = try store.setting(Self.settingKey) {
            if let seconds = Double(saved), let problem = Self.checkDate(seconds, now: Date()) {
                resetReason = "the saved virtual clock (\(saved)) \(problem); reset to now"
            } else if let seconds = Double(saved) {
                virtualNow = Date(timeIntervalSince1970: seconds)
                return
            } else {
                resetReason = "the saved virtual clock ('\(saved)') is not a number; reset to now"
            }
        }
        virtualNow = realNow
        if mode == .virtual || resetReason != nil { try store.setSetting(Self.settingKey, "\(virtualNow.timeIntervalSince1970)") }
    }

    /// Why `date` (seconds since 1970) is refused: not finite, or further than `maximumOffset`
    /// from `now`. Nil when it is usable.
    public static func checkDate(_ date: Double, now: Date) -> String? {
        guard date.isFinite else { return "is not a finite date (\(date))" }
        let offset = date - now.timeIntervalSince1970
        guard abs(offset) <= maximumOffset else {
            return "is \(String(format: "%.3g", abs(offset) / (365.25 * 86_400))) years \(offset > 0 ? "after" : "before") the host's clock, beyond the bound of \(maximumOffsetText)"
        }
        return nil
    }

    public var now: Date {
        mode == .real ? Date() : lock.withLock { virtualNow }
    }

    /// How far the host's clock is ahead of real time (0 on the real clock): a date crosses to
    /// an app, which runs on real time, less this, and comes back from it plus this.
    public var appOffset: TimeInterval {
        mode == .virtual ? now.timeIntervalSince(Date()) : 0
    }

    /// Moves the virtual clock forward. Refused for the real clock.
    public func advance(by seconds: TimeInterval) throws(BGTaskError) -> Date {
        guard mode == .virtual else {
            throw BGTaskError(.invalidRequest, "the host runs on the real clock; start it with --clock virtual to advance time")
        }
        guard seconds.isFinite, seconds >= 0 else {
            throw BGTaskError(.invalidRequest, "clock advance \(seconds.isFinite && seconds >= 0 ? DurationText.format(seconds: seconds) : "\(seconds) s"): the clock only moves forward, by a finite amount")
        }
        // Checked and moved under the lock, persisted before anyone else may move it again: a
        // refused advance leaves the clock, and the store, as they were.
        lock.lock()
        defer { lock.unlock() }
        let next = virtualNow.addingTimeInterval(seconds)
        if let problem = Self.checkDate(next.timeIntervalSince1970, now: Date()) {
            throw BGTaskError(.outOfRange, "clock advance \(DurationText.format(seconds: seconds)): the virtual clock would be at a date that \(problem.replacingOccurrences(of: "the host's clock", with: "real time")) (it runs at most \(Self.maximumOffsetText) ahead of real time)")
        }
        try store.setSetting(Self.settingKey, "\(next.timeIntervalSince1970)")
        virtualNow = next
        return next
    }
}

/// Where a virtual clock keeps its time across restarts (the host's store).
package protocol ClockSettings: AnyObject, Sendable {
    func setting(_ key: String) throws(BGTaskError) -> String?
    func setSetting(_ key: String, _ value: String?) throws(BGTaskError)
}

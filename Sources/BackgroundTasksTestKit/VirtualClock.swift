import Foundation

/// A test scheduler's notion of now: it starts at the real time the scheduler was made (to the
/// second) and moves only when the test says so, as the host's `--clock virtual` does.
///
/// App code computes dates from the real clock (`Date(timeIntervalSinceNow: 15 * 60)`); as the
/// host does, the scheduler moves a submitted `earliestBeginDate` onto this clock (15 minutes
/// after the app's now is 15 minutes after the clock's) and moves pending requests' dates back
/// when the app asks for them. Launches themselves (expiration, grace) run in real time.
public final class VirtualClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date

    public init(now: Date = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))) {
        current = now
    }

    /// The clock's now.
    public var now: Date { lock.withLock { current } }

    /// Moves the clock forward by `duration` (a negative one is refused: the clock only moves
    /// forward) and returns the new now.
    @discardableResult
    public func advance(by duration: Duration) -> Date {
        let seconds = Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
        precondition(seconds >= 0, "VirtualClock.advance(by: \(duration)): the clock only moves forward")
        return lock.withLock {
            current = current.addingTimeInterval(seconds)
            return current
        }
    }

    /// Moves the clock to `date` if it is later than now.
    @discardableResult
    public func advance(to date: Date) -> Date {
        lock.withLock {
            current = max(current, date)
            return current
        }
    }

    /// How far this clock is ahead of the real one: what is added to an app's dates.
    var offsetFromRealTime: TimeInterval { now.timeIntervalSince(Date()) }
}

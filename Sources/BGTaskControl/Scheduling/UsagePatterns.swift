import BGTaskModel
import Foundation

/// When the user will open an app next, predicted from when they opened it before, as iOS
/// schedules background refresh "shortly before" an app's predicted use, favouring the apps used
/// often and starving the ones never opened.
///
/// The model, and all it reads:
/// - **Input**: the app's foreground uses (`bgtask open`) on the host's clock over the last
///   `windowDays` days, at most `keptOpens` of them.
/// - **Habits**: the day is cut into half-hour slots (times of day, UTC); a slot is a habit when
///   the app was opened in it on at least `habitDays` different days of the window.
/// - **Prediction**: the next start of a habit slot after now (today or tomorrow), with how many
///   days of the window it held.
/// - **Policy** (realistic): an app with habits gets its refresh within `lead` before its next
///   predicted use, not before (a due refresh waits for it); an app opened in the window without
///   a habit keeps the usual 15-minute interval; an app not opened in the window at all is
///   refreshed at most every `unusedRefreshInterval`.
public struct UsagePrediction: Sendable, Equatable, Codable {
    /// The next predicted use.
    public var next: Date
    /// The slot's time of day, minutes after midnight UTC.
    public var minuteOfDay: Int
    /// Days of the window the app was opened in that slot, and days the window holds.
    public var days: Int
    public var windowDays: Int

    public static let windowDays = 14
    public static let keptOpens = 200
    public static let slotMinutes = 30
    public static let habitDays = 2
    /// How long before a predicted use the refresh may run.
    public static let lead: TimeInterval = 15 * 60
    /// The most often an app not opened in the window is refreshed.
    public static let unusedRefreshInterval: TimeInterval = 4 * 60 * 60

    public init(next: Date, minuteOfDay: Int, days: Int, windowDays: Int = UsagePrediction.windowDays) {
        self.next = next
        self.minuteOfDay = minuteOfDay
        self.days = days
        self.windowDays = windowDays
    }

    /// The next use after `now` predicted from `opens`, or nil when the app has no habit.
    public static func predict(opens: [Date], now: Date) -> UsagePrediction? {
        let windowStart = now.addingTimeInterval(-Double(windowDays) * 86_400)
        var daysPerSlot: [Int: Set<Int>] = [:]
        for open in opens where open >= windowStart && open <= now {
            let seconds = open.timeIntervalSince1970
            let day = Int((seconds / 86_400).rounded(.down))
            let slot = Int((seconds - Double(day) * 86_400) / 60) / slotMinutes
            daysPerSlot[slot, default: []].insert(day)
        }
        let today = (now.timeIntervalSince1970 / 86_400).rounded(.down) * 86_400
        var best: UsagePrediction?
        for (slot, days) in daysPerSlot where days.count >= habitDays {
            let minute = slot * slotMinutes
            var next = Date(timeIntervalSince1970: today + Double(minute) * 60)
            if next <= now { next = next.addingTimeInterval(86_400) }
            if best == nil || next < best!.next || (next == best!.next && days.count > best!.days) {
                best = UsagePrediction(next: next, minuteOfDay: minute, days: days.count)
            }
        }
        return best
    }

    /// "08:30".
    public var timeOfDay: String { String(format: "%02d:%02d UTC", minuteOfDay / 60, minuteOfDay % 60) }

    /// Whether `opens` holds a use within the window before `now`.
    public static func wasOpened(_ opens: [Date], before now: Date) -> Bool {
        let windowStart = now.addingTimeInterval(-Double(windowDays) * 86_400)
        return opens.contains { $0 >= windowStart && $0 <= now }
    }
}

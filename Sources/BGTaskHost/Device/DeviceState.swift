import BGTaskControl
import BGTaskStore
import BGTaskModel
import Foundation
import _BGTaskSystemShims

/// The device as the host sees it: the machine's power, network and idleness with the
/// operator's overrides (`bgtask device`, kept in the store's settings), and whether it has been
/// unlocked since the host started. Thread-safe: submissions read it off the host queue.
final class DeviceState: @unchecked Sendable {
    private let store: PendingRequestStore
    private let machine = MachineConditionsReader()
    /// The last conditions read, and when (monotonic ns).
    private let cache = LockedValue<(UInt64, DeviceConditions)?>(nil)
    private let unlocked: LockedValue<Bool>
    /// Apps whose own Background App Refresh switch is off: the store's, kept here so that a
    /// launch learns its `backgroundRefreshStatus` without a read on its path.
    private let appRefreshOff: LockedValue<Set<String>>

    init(store: PendingRequestStore) {
        self.store = store
        unlocked = LockedValue((try? store.setting("device.locked")) != "on")
        let states = (try? store.appStates()) ?? [:]
        appRefreshOff = LockedValue(Set(states.values.filter { !$0.refreshEnabled }.map(\.app)))
    }

    /// Whether `app`'s own Background App Refresh switch is off.
    func isAppRefreshOff(_ app: String) -> Bool { appRefreshOff.withLock { $0.contains(app) } }

    /// Sets `app`'s own switch, in the store and here.
    func setAppRefresh(_ app: String, on: Bool) throws(BGTaskError) {
        var state = try store.appState(app)
        state.refreshEnabled = on
        try store.saveAppState(state)
        appRefreshOff.withLock { if on { $0.remove(app) } else { $0.insert(app) } }
    }

    /// The device conditions, read at most every 100 ms (a burst of submissions must not
    /// re-read /sys and the settings for each one); `invalidate` forgets them.
    func conditions() -> DeviceConditions {
        if let (at, cached) = cache.withLock({ $0 }), bgtask_monotonic_ns() < at + 100_000_000 { return cached }
        var overrides: [String: String] = [:]
        for key in DeviceOverrides.keys {
            if let value = try? store.setting("device.\(key)") { overrides[key] = value }
        }
        let fresh = DeviceOverrides.resolve(overrides: overrides, machine: machine, unlockedSinceBoot: unlocked.withLock { $0 })
        cache.withLock { $0 = (bgtask_monotonic_ns(), fresh) }
        return fresh
    }

    func invalidate() { cache.withLock { $0 = nil } }

    /// Notes that the device is unlocked when `conditions` say so (a device once unlocked stays
    /// "unlocked since boot").
    func note(_ conditions: DeviceConditions) {
        if !conditions.locked { unlocked.withLock { $0 = true } }
    }

    /// Holds the thermal state at `state`, or with nil clears the override.
    func setThermalOverride(_ state: ThermalState?) throws(BGTaskError) {
        try store.setSetting("device.thermal", state?.name)
        invalidate()
    }

    /// Forces `condition` on or off, or with nil clears its override.
    func setOverride(_ condition: DeviceCondition, _ value: Bool?) throws(BGTaskError) {
        try store.setSetting("device.\(condition.rawValue)", value.map { $0 ? "on" : "off" })
        invalidate()
    }
}

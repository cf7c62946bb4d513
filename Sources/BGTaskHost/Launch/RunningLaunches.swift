import BGTaskControl
import BGTaskModel
import BGTaskDashboard
import BGTaskSystem
import Foundation

extension LaunchCoordinator {
    /// A running launch as `running` reports it, without its memory (`runningReports` adds it).
    func report(_ launch: RunningLaunch) -> RunningLaunchReport {
        RunningLaunchReport(
            launchID: launch.id, app: launch.app, reason: launch.reason, role: launch.role.rawValue, identifiers: launch.tasks.map(\.identifier),
            startedAt: launch.startedAt, budgetMs: launch.limits.budgetMs, graceMs: launch.limits.graceMs,
            expired: launch.thermalExpired || !launch.expiredTasks.isEmpty, workOver: launch.workOver, pid: launch.pid,
            memoryLimitBytes: launch.limits.memoryBytes)
    }

    /// Every running launch, oldest first, with its memory at the supervisor's last sample.
    func runningReports() -> [RunningLaunchReport] {
        // The keys in order, not the launches: a launch moved at each of a sort's swaps
        // (retaining and releasing its many references) was most of the cost with 1,000.
        let order = running.map { ($0.value.startedAt, $0.key) }.sorted { $0 < $1 }
        return order.map { _, key in
            let launch = running[key]!
            var report = report(launch)
            report.residentBytes = launch.control.residentBytes
            return report
        }
    }

    /// `reports` with the resident memory of those the supervisor does not sample (under a
    /// cgroup's limit), read from /proc: on the caller's thread, not the host's queue.
    nonisolated static func withMemory(_ reports: [RunningLaunchReport]) -> [RunningLaunchReport] {
        reports.map { report in
            var report = report
            // The launch is running as far as the host knows: its pid is its runner's (the
            // supervisor reaps it only once the launch has ended). Its app process's and its
            // children's resident memory, as the memory sampler counts a launch's (not the
            // runner's, nor a PID namespace's init, which share the app's pages).
            if report.residentBytes == nil, let pid = report.pid, pid > 0, let app = ProcessTree.appProcess(of: pid) {
                let bytes = ProcessTree.residentBytes(of: app)
                if bytes > 0 { report.residentBytes = bytes }
            }
            return report
        }
    }
}

/// What the scheduling pass asks of the running launches, counted as they come and go instead
/// of over all of them at each pass (`LaunchCoordinator.tally`), and which launches the device
/// conditions were last enforced on.
struct RunningTally {
    /// Launches whose work is not over (`busyCount`).
    private(set) var busy = 0
    /// Apps with a launch, and how many each has.
    private(set) var apps: Set<String> = []
    private var launchesPerApp: [String: Int] = [:]
    private(set) var clientStarted = 0
    private(set) var background = 0
    private(set) var processing = 0
    /// The conditions `enforce` last applied, and the launches added since: while the
    /// conditions are the same, only those need looking at.
    var enforced: DeviceConditions?
    var unenforced: [String] = []

    private static func runsProcessing(_ launch: LaunchCoordinator.RunningLaunch) -> Bool {
        launch.tasks.contains { $0.kind.isProcessing }
    }

    mutating func noteAdded(_ launch: LaunchCoordinator.RunningLaunch) {
        if !launch.workOver { busy += 1 }
        launchesPerApp[launch.app, default: 0] += 1
        apps.insert(launch.app)
        if launch.role == .foreground || launch.role == .extension { clientStarted += 1 }
        if launch.role != .foreground { background += 1 }
        if Self.runsProcessing(launch) { processing += 1 }
        unenforced.append(launch.id)
    }

    mutating func noteRemoved(_ launch: LaunchCoordinator.RunningLaunch) {
        if !launch.workOver { busy -= 1 }
        let left = (launchesPerApp[launch.app] ?? 1) - 1
        launchesPerApp[launch.app] = left > 0 ? left : nil
        if left <= 0 { apps.remove(launch.app) }
        if launch.role == .foreground || launch.role == .extension { clientStarted -= 1 }
        if launch.role != .foreground { background -= 1 }
        if Self.runsProcessing(launch) { processing -= 1 }
    }

    /// A running launch's work is over (it was not before).
    mutating func noteWorkOver() { busy -= 1 }
}

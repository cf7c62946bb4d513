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

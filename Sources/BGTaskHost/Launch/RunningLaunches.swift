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
        running.values.sorted { ($0.startedAt, $0.id) < ($1.startedAt, $1.id) }.map { launch in
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

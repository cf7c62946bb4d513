import BGTaskControl
import BGTaskDashboard
import BGTaskStore
import Dispatch
import Foundation
import Logging

/// The dashboard as a part of the host (`bgtask host --http-port`): started after the parts
/// it reads, told of each launch as it begins and ends.
final class DashboardPart: HostPart {
    let dashboard: Dashboard
    private let launches: LaunchCoordinator
    private let logger: Logger
    var partName: String { "dashboard" }

    nonisolated init(options: DashboardOptions, verbs: ControlVerbs, launches: LaunchCoordinator, logger: Logger) {
        dashboard = Dashboard(options: options, source: VerbsSource(
            verbs: verbs, store: launches.core.store,
            logsDirectory: launches.core.configuration.stateDirectory.appendingPathComponent("logs", isDirectory: true).path), logger: logger)
        self.launches = launches
        self.logger = logger
    }

    func start() throws(BGTaskError) {
        do {
            _ = try dashboard.start()
        } catch {
            throw BGTaskError(.system, "cannot serve the dashboard on \(dashboard.options.address):\(dashboard.options.port): \(error)")
        }
        let dashboard = self.dashboard
        launches.observer = { event in dashboard.publish(event) }
        launches.core.store.commitObserver.withLock { $0 = { dashboard.metrics.storeCommitted(nanoseconds: $0) } }
    }

    func stop() {
        launches.core.store.commitObserver.withLock { $0 = nil }
        launches.observer = nil
        dashboard.stop()
    }
}

/// The host's verbs as the dashboard's source: each command answered as on the control socket.
/// Launches by hand never wait for their record here (the page follows them live).
private struct VerbsSource: DashboardSource {
    let verbs: ControlVerbs
    let store: PendingRequestStore
    let logsDirectory: String

    func historyJSON(app: String?, limit: Int) throws -> [String] {
        try store.historyJSON(app: app, limit: limit)
    }

    func recordJSON(launchID: String) throws -> String? {
        try store.recordJSON(launchID: launchID)
    }

    func answer(_ command: ControlCommand) -> ControlResponse {
        var command = command
        if case let .simulateLaunch(identifier, app, force, kind, _) = command {
            command = .simulateLaunch(identifier: identifier, app: app, force: force, kind: kind, wait: false)
        }
        let answer = LockedValue<ControlResponse?>(nil)
        let done = DispatchSemaphore(value: 0)
        verbs.handle([command], peer: PeerCredentials(pid: getpid(), uid: geteuid(), gid: getegid())) { responses in
            answer.withLock { $0 = responses.first }
            done.signal()
        }
        done.wait()
        return answer.withLock { $0 } ?? .failure(.internalError, "no answer")
    }
}

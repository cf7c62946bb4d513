import BGTaskControl
import BGTaskModel
import Dispatch
import Foundation

/// Continued-processing tasks in their foreground launches: `ContinuedProcessing` decides, the
/// coordinator carries the decisions out on the launches. On the host queue.
extension LaunchCoordinator {
    /// A continued-processing request runs in the foreground launch that submitted it, at once
    /// when a slot is free; otherwise it waits (`.queue`) or is refused (`.fail`).
    func admitContinued(_ request: TaskRequest, app: String, fromLaunch launchID: String?) -> SubmissionRules.Rejection? {
        guard let launchID, let launch = running[launchID], launch.role == .foreground, !launch.closed else {
            return .init(status: .unavailable, message: "continued-processing requests are submitted from the foreground: open the app (bgtask open \(app)) and submit from it")
        }
        switch continued.admit(request, in: launchID) {
        case .start:
            startContinued(request, in: launchID)
            return nil
        case .queued:
            core.logger.info("continued-processing request queued", metadata: ["launch.id": "\(launchID)", "task.id": "\(request.identifier)"])
            return nil
        case let .refused(rejection):
            return rejection
        }
    }

    func startContinued(_ request: TaskRequest, in launchID: String) {
        guard let app = running[launchID]?.app, let task = addTask(request, kind: .continuedProcessing, to: launchID) else { return }
        continued.started(request, task: task.task, in: launchID, app: app, at: Date())
        core.logger.info("continued-processing task started", metadata: ["launch.id": "\(launchID)", "task.id": "\(request.identifier)"])
        armStallTimer()
    }

    func startQueuedContinued() {
        while let next = continued.nextToStart(isRunning: { running[$0] != nil }) {
            startContinued(next.request, in: next.launchID)
        }
    }

    /// Cancels a running (expired at once) or queued continued-processing task: the launch it
    /// belonged to, or nil when none runs or waits.
    func cancelContinued(_ identifier: String) -> String? {
        switch continued.cancel(identifier) {
        case let .running(id, task)?:
            running[id]?.control.expire(task: task, reason: "cancelled by the user")
            return id
        case let .dequeued(id)?:
            closeIfIdle(id)
            return id
        case nil:
            return nil
        }
    }

    func continuedStatuses() -> [ContinuedTaskStatus] { continued.statuses(at: Date()) }

    /// Expires continued tasks whose progress has not moved for `progressStallInterval`.
    private func armStallTimer() {
        guard stallTimer == nil else { return }
        let stall = core.configuration.progressStallInterval.timeInterval
        let period = max(0.05, min(1, stall / 4))
        let timer = DispatchSource.makeTimerSource(queue: core.queue)
        timer.schedule(deadline: .now() + period, repeating: period)
        timer.setEventHandler { [weak self] in
            guard let self else { return }
            for (id, status) in self.continued.stalled(at: Date()) {
                self.running[id]?.control.expire(task: status.task, reason: "progress stalled")
                self.core.logger.info("expiring a continued-processing task: its progress stalled", metadata: ["launch.id": "\(id)", "task.id": "\(status.identifier)"])
            }
            if self.continued.isEmpty {
                self.stallTimer?.cancel()
                self.stallTimer = nil
            }
        }
        timer.resume()
        stallTimer = timer
    }
}

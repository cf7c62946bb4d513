import BGTaskControl
import BGTaskStore
import BGTaskModel
import Foundation

/// Where task requests come in, from a launch, an extension or a control client: the device's
/// switches first, then Apple's rules and the app's switch inside the store's transaction (a
/// value, `SubmissionRules.Context`: nothing in the transaction calls back here), and a
/// scheduling pass once something was accepted. Continued-processing requests go to the
/// foreground launch that made them. Any thread.
final class Submissions: @unchecked Sendable {
    private let core: HostCore
    private let device: DeviceState
    private let launches: LaunchCoordinator
    private let scheduling: SchedulingLoop

    init(core: HostCore, device: DeviceState, launches: LaunchCoordinator, scheduling: SchedulingLoop) {
        self.core = core
        self.device = device
        self.launches = launches
        self.scheduling = scheduling
    }

    func submit(_ request: TaskRequest, app bundle: PluginBundle, fromLaunch launchID: String? = nil) -> SubmissionRules.Rejection? {
        if request.kind == .continuedProcessing { return submitContinued(request, app: bundle, fromLaunch: launchID) }
        return submitAll([(request, bundle)])[0]
    }

    /// Submits requests (not continued-processing ones) in one group commit: the rejection of
    /// each, or nil once it is durable. Each is decided inside the store's write transaction, in
    /// order, so each sees the ones before it.
    func submitAll(_ items: [(request: TaskRequest, app: PluginBundle)]) -> [SubmissionRules.Rejection?] {
        let conditions = device.conditions()
        let now = core.clock.now
        var rejections: [SubmissionRules.Rejection?] = Array(repeating: nil, count: items.count)
        var submissions: [PendingRequestStore.Submission] = []
        var positions: [Int] = []
        for (position, (request, bundle)) in items.enumerated() {
            if let rejection = SubmissionRules.deviceSwitches(request, conditions) {
                rejections[position] = rejection
                continue
            }
            let rules = SubmissionRules.Context(app: bundle, supportedResources: conditions.supportedResources, now: now)
            submissions.append(.init(app: bundle.identifier, request: request, at: now, rules: rules))
            positions.append(position)
        }
        // The scheduling pass starts as soon as the accepted requests are committed, while the
        // store syncs them to disk (the answer to the client waits for the sync).
        let scheduling = self.scheduling
        let outcomes = core.store.submitAll(submissions, whenVisible: { scheduling.requestEvaluation() })
        for (position, outcome) in zip(positions, outcomes) {
            switch outcome {
            case .success(let rejection):
                rejections[position] = rejection
            case .failure(let error):
                rejections[position] = .init(status: .unavailable, message: "the host could not store the request: \(error)")
            }
        }
        return rejections
    }

    /// A continued-processing request: Apple's rules here, then its foreground launch.
    func submitContinued(_ request: TaskRequest, app bundle: PluginBundle, fromLaunch launchID: String?) -> SubmissionRules.Rejection? {
        let supported = device.conditions().supportedResources
        if let rejection = SubmissionRules.check(request, app: bundle, pending: [], supportedResources: supported, now: core.clock.now) { return rejection }
        return core.sync { launches.admitContinued(request, app: bundle.identifier, fromLaunch: launchID) }
    }
}

@testable import BGTaskHost
import BGTaskModel
import Foundation
import Testing

/// The control protocol's words are a contract: clients and scripts send the verbs and match
/// on the error codes, blocker codes and launch reasons. Each is defined once (`ControlVerb`,
/// `ControlErrorCode`, `BlockerCode`, `LaunchReason`); this pins their spelling, so renaming a
/// case cannot silently change what goes on the wire.
@Suite struct ProtocolStabilityTests {
    @Test func verbsAreStable() {
        #expect(ControlVerb.allCases.map(\.rawValue) == [
            "apps", "submit", "pending", "cancel", "cancel-all", "simulate-launch", "simulate-expire", "history",
            "why", "device", "clock", "status", "extension-run", "open", "progress", "cancel-task",
            "notifications", "pending-notifications", "push", "pushes", "device-token", "transfers", "evict",
        ])
        #expect(ControlRequest.verbs == ControlVerb.allCases.map(\.rawValue))
    }

    @Test func errorCodesAreStable() {
        #expect(ControlErrorCode.allCases.map(\.rawValue) == [
            "unknown-verb", "bad-request", "bad-frame", "not-found", "unavailable", "permission-denied", "too-large",
            "too-many-connections", "too-many-launches", "request-timeout", "out-of-range", "internal",
            "tooManyPendingTaskRequests", "notPermitted", "immediateRunIneligible",
        ])
        // Apple's BGTaskScheduler.Error.Code names, as the SDK maps them back.
        for status in [SubmissionRules.Status.unavailable, .tooManyPendingTaskRequests, .notPermitted, .immediateRunIneligible] {
            #expect(ControlVerbs.code(status).rawValue == "\(status)")
        }
    }

    @Test func blockerCodesAndLaunchReasonsAreStable() {
        #expect(BlockerCode.allCases.map(\.rawValue) == [
            "app-missing", "not-due", "refresh-disabled", "app-refresh-disabled", "low-power-mode", "device-not-idle",
            "no-external-power", "no-network", "data-protected", "penalty", "rate-limit", "app-running", "concurrency",
            "handler-not-registered", "disk-quota", "start-failed",
        ])
        #expect([LaunchReason.scheduled, .simulated, .foreground, .appExtension, .benchmark, .remoteNotification, .backgroundTransfer].map(\.rawValue)
            == ["scheduled", "simulated", "foreground", "extension", "benchmark", "remote-notification", "background-transfer"])
    }

    @Test func aRequestKeepsAnUnknownVerbAsSent() throws {
        let request = try JSONDecoder().decode(ControlRequest.self, from: Data(#"{"verb":"frobnicate"}"#.utf8))
        #expect(request.verb == "frobnicate")
        #expect(request.knownVerb == nil)
        #expect(ControlRequest(.cancelAll, app: "a").verb == "cancel-all")
    }
}

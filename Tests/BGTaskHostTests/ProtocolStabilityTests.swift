@testable import BGTaskHost
import BGTaskControl
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
            "notifications", "pending-notifications", "push", "pushes", "device-token", "transfers", "evict", "metrics", "respond",
            "running",
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
            "handler-not-registered", "disk-quota", "start-failed", "thermal-state", "energy", "usage",
        ])
        #expect([LaunchReason.scheduled, .simulated, .foreground, .appExtension, .benchmark, .remoteNotification, .backgroundTransfer,
                 .notificationResponse].map(\.rawValue)
            == ["scheduled", "simulated", "foreground", "extension", "benchmark", "remote-notification", "background-transfer",
                "notification-response"])
    }

    @Test func aRequestKeepsAnUnknownVerbAsSent() throws {
        let request = try JSONDecoder().decode(ControlRequest.self, from: Data(#"{"verb":"frobnicate"}"#.utf8))
        #expect(request.verb == "frobnicate")
        #expect(request.knownVerb == nil)
        #expect(ControlCommand.cancelAll(app: "a").wire.verb == "cancel-all")
    }

    /// One command of each verb, with every argument it takes set.
    static func sample(_ verb: ControlVerb) -> ControlCommand {
        switch verb {
        case .status: .status
        case .apps: .apps(limit: 10, after: "com.example.a")
        case .submit: .submit(app: "com.example.a", request: TaskRequest(kind: .processing, identifier: "com.example.a.sync", earliestBeginDate: 1.5e9,
                                                                          requiresNetworkConnectivity: true), delay: 90)
        case .pending: .pending(app: "com.example.a")
        case .cancel: .cancel(app: "com.example.a", identifier: "com.example.a.sync")
        case .cancelAll: .cancelAll(app: "com.example.a")
        case .simulateLaunch: .simulateLaunch(identifier: "com.example.a.sync", app: "com.example.a", force: true, kind: .healthResearch, wait: false)
        case .simulateExpire: .simulateExpire(identifier: "com.example.a.sync")
        case .history: .history(app: "com.example.a", limit: 0)
        case .why: .why(identifier: "com.example.a.sync", app: "com.example.a")
        case .device: .device(DeviceChanges([.power: .on, .lowPower: .auto, .gpu: .off], thermal: .serious,
                                            app: .init(app: "com.example.a", refresh: false, notifications: .auto)))
        case .clock: .clock(advance: -0.25)
        case .extensionRun: .extensionRun(identifier: "com.example.a.widget", event: #"{"k":"v"}"#, wait: false)
        case .open: .open(app: "com.example.a", event: "[1]", wait: true)
        case .progress: .progress
        case .cancelTask: .cancelTask(identifier: "com.example.a.export")
        case .notifications: .notifications(app: "com.example.a", after: 42, limit: 7)
        case .pendingNotifications: .pendingNotifications(app: "com.example.a")
        case .push: .push(app: "com.example.a", PushBody(payload: #"{"aps":{"content-available":1}}"#, pushType: "background", priority: 5,
                                                         expiration: 0, collapseID: "c", id: "5B9E0A52-6B5F-4A4E-9C53-3C6B9C6E8F10"))
        case .pushes: .pushes(app: "com.example.a", limit: 3)
        case .deviceToken: .deviceToken(app: "com.example.a")
        case .transfers: .transfers(app: "com.example.a", limit: 1000)
        case .metrics: .metrics(app: "com.example.a")
        case .respond: .respond(notification: 42, action: "com.example.a.reply", wait: true)
        case .running: .running
        case .evict: .evict(app: "com.example.a")
        }
    }

    /// Every command, with its arguments and without the optional ones, comes out of the codec as
    /// it went in, through both of the decoder's readers (the fast one and JSONDecoder).
    @Test func everyCommandRoundTripsThroughTheCodec() throws {
        let bare: [ControlCommand] = [.apps(), .pending(), .history(), .device(), .clock(), .notifications(), .pendingNotifications(),
                                      .pushes(), .transfers(), .simulateLaunch(identifier: "x"), .open(app: "a"), .extensionRun(identifier: "e"),
                                      .respond(notification: 0)]
        for command in ControlVerb.allCases.map(Self.sample) + bare {
            let payload = try ControlCodec.encode(command)
            guard case .command(let decoded) = ControlCodec.decode(payload) else {
                Issue.record("\(command) did not decode: \(ControlCodec.decode(payload))")
                continue
            }
            #expect(decoded == command)
            let reference = try JSONDecoder.control.decode(ControlRequest.self, from: payload)
            #expect(try ControlCommand(wire: reference) == command, "JSONDecoder: \(command)")
            #expect(command.verb.rawValue == reference.verb)
        }
    }

    /// What a command needs is checked once, in the codec, with the host's words for it.
    @Test func aRequestMissingWhatItsCommandNeedsIsRefusedByTheCodec() throws {
        let refusals: [(String, ControlErrorCode, String)] = [
            (#"{"verb":"submit","app":"a"}"#, .badRequest, "submit needs an app and a request"),
            (#"{"verb":"cancel","app":"a"}"#, .badRequest, "cancel needs a task identifier"),
            (#"{"verb":"apps","limit":0}"#, .badRequest, "apps: limit must be at least 1, not 0"),
            (#"{"verb":"device","device":{"volume":"on"}}"#, .badRequest, "unknown condition 'volume'"),
            (#"{"verb":"device","device":{"power":"yes"}}"#, .badRequest, "power is on, off or auto, not 'yes'"),
            (#"{"verb":"device","device":{"app":"a","refresh":"auto"}}"#, .badRequest, "an app's refresh switch is on or off"),
            (#"{"verb":"device","device":{"app":"a"}}"#, .badRequest, "sets its refresh or its notifications"),
            (#"{"verb":"notifications","after":"1e3"}"#, .badRequest, "after must be a notification id"),
            (#"{"verb":"pushes","limit":-1}"#, .badRequest, "pushes: limit must be at least 1"),
            (#"{"verb":"frobnicate"}"#, .unknownVerb, "unknown verb 'frobnicate'"),
        ]
        for (json, code, says) in refusals {
            guard case .refused(let failure) = ControlCodec.decode(Data(json.utf8)) else {
                Issue.record("\(json) was not refused: \(ControlCodec.decode(Data(json.utf8)))")
                continue
            }
            #expect(failure.code == code && failure.message.contains(says), "\(json): \(failure)")
        }
        guard case .malformed(let failure) = ControlCodec.decode(Data("[1,2]".utf8)) else {
            Issue.record("[1,2] was not malformed")
            return
        }
        #expect(failure.code == .badRequest && failure.message.contains("not a control request"))
    }
}

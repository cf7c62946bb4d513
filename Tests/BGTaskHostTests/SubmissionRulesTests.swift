@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskModel
import Foundation
import Testing

/// A bundle built in memory (no files): SubmissionRules only looks at its Info.plist values.
private func makeApp(
    identifier: String = "com.example.app",
    permitted: [String] = ["com.example.app.refresh", "com.example.app.clean", "com.example.app.export.*"],
    modes: Set<String> = ["fetch", "processing"],
    entitlements: [String: Bool] = [:]
) -> PluginBundle {
    PluginBundle(
        kind: .app, url: URL(fileURLWithPath: "/nonexistent/\(identifier).app"), identifier: identifier,
        executableName: "libApp.so", permittedIdentifiers: permitted, backgroundModes: modes,
        mappedHandlers: [], entitlements: entitlements, extensionPoint: nil, extensions: [], invalidExtensions: [])
}

private func expectRejected(
    _ rejection: SubmissionRules.Rejection?, _ status: SubmissionRules.Status, mentions words: [String],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    guard let rejection else {
        Issue.record("expected a \(status) rejection, the request was accepted", sourceLocation: sourceLocation)
        return
    }
    #expect(rejection.status == status, sourceLocation: sourceLocation)
    #expect(rejection.description == rejection.message, sourceLocation: sourceLocation)
    for word in words {
        #expect(rejection.message.contains(word), "'\(word)' missing from: \(rejection.message)", sourceLocation: sourceLocation)
    }
}

private let gpu: UInt32 = 1

@Suite struct SubmissionRulesTests {
    // MARK: PluginBundle matching and kind inference

    @Test func permitsExactAndWildcard() {
        let app = makeApp()
        #expect(app.permits("com.example.app.refresh"))
        #expect(app.permits("com.example.app.clean"))
        #expect(app.permits("com.example.app.export.video"))
        #expect(app.permits("com.example.app.export.video.hd"))
        #expect(!app.permits("com.example.app.export."))
        #expect(!app.permits("com.example.app.export"))
        #expect(!app.permits("com.example.app.exportx"))
        #expect(!app.permits("com.example.app.exportx.video"))
        #expect(!app.permits("com.example.app.refresh2"))
        #expect(!app.permits("com.example.app"))
        #expect(!app.permits(""))
    }

    @Test func continuedProcessingIdentifierOnlyThroughTheWildcard() {
        let app = makeApp()
        #expect(app.isContinuedProcessingIdentifier("com.example.app.export.video"))
        #expect(!app.isContinuedProcessingIdentifier("com.example.app.export."))
        #expect(!app.isContinuedProcessingIdentifier("com.example.app.exportx"))
        #expect(!app.isContinuedProcessingIdentifier("com.example.app.refresh"))
        #expect(!app.isContinuedProcessingIdentifier("com.example.other"))
    }

    @Test func inferredKindFromTheSingleMode() throws {
        #expect(try makeApp(modes: ["fetch"]).inferredKind(of: "com.example.app.refresh") == .refresh)
        #expect(try makeApp(modes: ["processing"]).inferredKind(of: "com.example.app.clean") == .processing)
        #expect(try makeApp(modes: ["fetch", "audio"]).inferredKind(of: "com.example.app.clean") == .refresh)
    }

    @Test func inferredKindOfAWildcardMatchIsContinuedProcessing() throws {
        for modes: Set<String> in [[], ["fetch"], ["processing"], ["fetch", "processing"]] {
            #expect(try makeApp(modes: modes).inferredKind(of: "com.example.app.export.video") == .continuedProcessing)
        }
    }

    @Test func inferredKindIsAmbiguousWithBothModes() {
        let app = makeApp(modes: ["fetch", "processing"])
        let error = #expect(throws: BGTaskError.self) { try app.inferredKind(of: "com.example.app.refresh") }
        #expect(error?.code == .invalidRequest)
        #expect(error?.key == "UIBackgroundModes")
        #expect(error?.file?.hasSuffix("Info.plist") == true)
        #expect(error?.description.contains("--type") == true)
        #expect(error?.description.contains("'com.example.app.refresh'") == true)
    }

    @Test func inferredKindWithNeitherMode() {
        let error = #expect(throws: BGTaskError.self) { try makeApp(modes: []).inferredKind(of: "com.example.app.refresh") }
        #expect(error?.code == .invalidRequest)
        #expect(error?.key == "UIBackgroundModes")
        #expect(error?.description.contains("neither fetch nor processing") == true)
    }

    @Test func inferredKindOfAnIdentifierNotPermitted() {
        let error = #expect(throws: BGTaskError.self) { try makeApp().inferredKind(of: "com.example.app.unknown") }
        #expect(error?.code == .invalidRequest)
        #expect(error?.key == "BGTaskSchedulerPermittedIdentifiers")
        #expect(error?.file?.hasSuffix("Info.plist") == true)
        #expect(error?.description.contains("'com.example.app.unknown' is not permitted") == true)
        #expect(error?.description.contains("com.example.app.refresh, com.example.app.clean, com.example.app.export.*") == true)
    }

    // MARK: What the Info.plist allows

    @Test(arguments: TaskKind.allCases)
    func notPermitted(_ kind: TaskKind) {
        let request = TaskRequest(kind: kind, identifier: "com.example.app.unknown")
        let app = makeApp(entitlements: [PluginBundle.healthResearchEntitlement: true])
        expectRejected(SubmissionRules.check(request, app: app, pending: []), .notPermitted,
                       mentions: ["'com.example.app.unknown'", "BGTaskSchedulerPermittedIdentifiers", "com.example.app"])
    }

    @Test func refreshNeedsFetchMode() {
        let request = TaskRequest(kind: .refresh, identifier: "com.example.app.refresh")
        expectRejected(SubmissionRules.check(request, app: makeApp(modes: ["processing"]), pending: []), .notPermitted,
                       mentions: ["refresh", "UIBackgroundModes", "'fetch'"])
        #expect(SubmissionRules.check(request, app: makeApp(modes: ["fetch"]), pending: []) == nil)
    }

    @Test func processingNeedsProcessingMode() {
        let request = TaskRequest(kind: .processing, identifier: "com.example.app.clean")
        expectRejected(SubmissionRules.check(request, app: makeApp(modes: ["fetch"]), pending: []), .notPermitted,
                       mentions: ["processing", "UIBackgroundModes", "'processing'"])
        #expect(SubmissionRules.check(request, app: makeApp(modes: ["processing"]), pending: []) == nil)
    }

    @Test func healthResearchNeedsTheEntitlement() {
        let request = TaskRequest(kind: .healthResearch, identifier: "com.example.app.clean")
        expectRejected(SubmissionRules.check(request, app: makeApp(), pending: []), .notPermitted,
                       mentions: ["health-research", PluginBundle.healthResearchEntitlement])
        let denied = makeApp(entitlements: [PluginBundle.healthResearchEntitlement: false])
        expectRejected(SubmissionRules.check(request, app: denied, pending: []), .notPermitted,
                       mentions: [PluginBundle.healthResearchEntitlement])
        let entitled = makeApp(entitlements: [PluginBundle.healthResearchEntitlement: true])
        #expect(SubmissionRules.check(request, app: entitled, pending: []) == nil)
    }

    @Test func healthResearchAlsoNeedsProcessingMode() {
        let request = TaskRequest(kind: .healthResearch, identifier: "com.example.app.clean")
        let app = makeApp(modes: ["fetch"], entitlements: [PluginBundle.healthResearchEntitlement: true])
        expectRejected(SubmissionRules.check(request, app: app, pending: []), .notPermitted, mentions: ["'processing'"])
    }

    @Test func continuedProcessingNeedsAWildcardIdentifier() {
        let request = TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.clean", title: "Export")
        expectRejected(SubmissionRules.check(request, app: makeApp(), pending: []), .notPermitted,
                       mentions: ["'com.example.app.clean'", "wildcard", "com.example.app.export.*"])
    }

    @Test func continuedProcessingThroughTheWildcardIsAccepted() {
        let request = TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.video", title: "Export")
        // Needs no background mode.
        #expect(SubmissionRules.check(request, app: makeApp(modes: []), pending: []) == nil)
    }

    @Test func gpuNeedsTheEntitlement() {
        let request = TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.video", requiredResources: gpu)
        expectRejected(SubmissionRules.check(request, app: makeApp(), pending: [], supportedResources: gpu), .notPermitted,
                       mentions: ["GPU", PluginBundle.continuedProcessingGPUEntitlement])
        let denied = makeApp(entitlements: [PluginBundle.continuedProcessingGPUEntitlement: false])
        expectRejected(SubmissionRules.check(request, app: denied, pending: [], supportedResources: gpu), .notPermitted,
                       mentions: [PluginBundle.continuedProcessingGPUEntitlement])
    }

    @Test func gpuNeedsSupportedResources() {
        let request = TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.video", requiredResources: gpu)
        let app = makeApp(entitlements: [PluginBundle.continuedProcessingGPUEntitlement: true])
        expectRejected(SubmissionRules.check(request, app: app, pending: [], supportedResources: 0), .notPermitted,
                       mentions: ["GPU", "supportedResources"])
        #expect(SubmissionRules.check(request, app: app, pending: [], supportedResources: gpu) == nil)
        #expect(SubmissionRules.check(request, app: app, pending: [], supportedResources: 0xFF) == nil)
    }

    @Test func noGPURequiredNeedsNeitherEntitlementNorResources() {
        let request = TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.video", requiredResources: 0)
        #expect(SubmissionRules.check(request, app: makeApp(), pending: [], supportedResources: 0) == nil)
    }

    @Test(arguments: [TaskKind.refresh, .processing, .healthResearch])
    func wildcardIdentifierOnlyAsContinuedProcessing(_ kind: TaskKind) {
        let request = TaskRequest(kind: kind, identifier: "com.example.app.export.video")
        let app = makeApp(entitlements: [PluginBundle.healthResearchEntitlement: true])
        expectRejected(SubmissionRules.check(request, app: app, pending: []), .notPermitted,
                       mentions: ["'com.example.app.export.video'", "continued-processing", kind.rawValue])
    }

    @Test func identifierListedBothExactlyAndByWildcardMayBeRefresh() {
        let app = makeApp(permitted: ["com.example.app.export.*", "com.example.app.export.nightly"])
        let request = TaskRequest(kind: .refresh, identifier: "com.example.app.export.nightly")
        #expect(SubmissionRules.check(request, app: app, pending: []) == nil)
    }

    // MARK: Pending limits

    @Test func oneRefreshAtATime() {
        let app = makeApp(permitted: ["com.example.app.refresh", "com.example.app.refresh2"])
        let pending = [TaskRequest(kind: .refresh, identifier: "com.example.app.refresh")]
        #expect(SubmissionRules.maximumPendingRefresh == 1)
        expectRejected(
            SubmissionRules.check(TaskRequest(kind: .refresh, identifier: "com.example.app.refresh2"), app: app, pending: pending),
            .tooManyPendingTaskRequests, mentions: ["com.example.app", "1 pending refresh", "limit"])
        // Resubmitting the pending identifier replaces it.
        let again = TaskRequest(kind: .refresh, identifier: "com.example.app.refresh", earliestBeginDate: 1_000)
        #expect(SubmissionRules.check(again, app: app, pending: pending) == nil)
    }

    @Test func pendingProcessingDoesNotCountAgainstRefresh() {
        let app = makeApp()
        let pending = [TaskRequest(kind: .processing, identifier: "com.example.app.clean")]
        #expect(SubmissionRules.check(TaskRequest(kind: .refresh, identifier: "com.example.app.refresh"), app: app, pending: pending) == nil)
    }

    private static let processingIdentifiers = (0..<11).map { "com.example.app.p\($0)" }

    @Test func tenProcessingAtATime() {
        let app = makeApp(permitted: Self.processingIdentifiers)
        #expect(SubmissionRules.maximumPendingProcessing == 10)
        let nine = Self.processingIdentifiers.prefix(9).map { TaskRequest(kind: .processing, identifier: $0) }
        let tenth = TaskRequest(kind: .processing, identifier: Self.processingIdentifiers[9])
        #expect(SubmissionRules.check(tenth, app: app, pending: nine) == nil)
        let ten = nine + [tenth]
        let eleventh = TaskRequest(kind: .processing, identifier: Self.processingIdentifiers[10])
        expectRejected(SubmissionRules.check(eleventh, app: app, pending: ten), .tooManyPendingTaskRequests,
                       mentions: ["com.example.app", "10 pending processing", "limit"])
        // Resubmitting one of the ten replaces it.
        let resubmitted = TaskRequest(kind: .processing, identifier: Self.processingIdentifiers[3], requiresExternalPower: true)
        #expect(SubmissionRules.check(resubmitted, app: app, pending: ten) == nil)
    }

    @Test func healthResearchCountsAsProcessing() {
        let app = makeApp(permitted: Self.processingIdentifiers, entitlements: [PluginBundle.healthResearchEntitlement: true])
        let mixed = Self.processingIdentifiers.prefix(10).enumerated().map { index, identifier in
            TaskRequest(kind: index.isMultiple(of: 2) ? .healthResearch : .processing, identifier: identifier)
        }
        let last = Self.processingIdentifiers[10]
        expectRejected(SubmissionRules.check(TaskRequest(kind: .processing, identifier: last), app: app, pending: mixed),
                       .tooManyPendingTaskRequests, mentions: ["10 pending processing"])
        expectRejected(SubmissionRules.check(TaskRequest(kind: .healthResearch, identifier: last), app: app, pending: mixed),
                       .tooManyPendingTaskRequests, mentions: ["10 pending processing"])
        // Refresh and continued-processing requests do not count.
        let others = Array(mixed.prefix(9)) + [TaskRequest(kind: .refresh, identifier: "com.example.app.r")]
        #expect(SubmissionRules.check(TaskRequest(kind: .healthResearch, identifier: last), app: app, pending: others) == nil)
    }

    @Test func continuedProcessingHasNoPendingLimit() {
        let app = makeApp()
        let pending = (0..<20).map { TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.\($0)") }
            + [TaskRequest(kind: .refresh, identifier: "com.example.app.refresh")]
            + (0..<10).map { TaskRequest(kind: .processing, identifier: "com.example.app.p\($0)") }
        let request = TaskRequest(kind: .continuedProcessing, identifier: "com.example.app.export.more")
        #expect(SubmissionRules.check(request, app: app, pending: pending) == nil)
    }

    // MARK: InMemoryRequestBroker

    @Test func brokerReplacesOnResubmit() {
        let broker = InMemoryRequestBroker()
        let app = makeApp()
        let first = TaskRequest(kind: .processing, identifier: "com.example.app.clean", earliestBeginDate: 100)
        let second = TaskRequest(kind: .processing, identifier: "com.example.app.clean", earliestBeginDate: 200, requiresNetworkConnectivity: true)
        #expect(broker.submit(first, app: app) == nil)
        #expect(broker.pending(app: app) == [first])
        #expect(broker.submit(second, app: app) == nil)
        #expect(broker.pending(app: app) == [second])
    }

    @Test func brokerEnforcesTheRefreshLimitAndKeepsRejectedOut() {
        let broker = InMemoryRequestBroker()
        let app = makeApp(permitted: ["com.example.app.refresh", "com.example.app.refresh2"])
        let first = TaskRequest(kind: .refresh, identifier: "com.example.app.refresh")
        #expect(broker.submit(first, app: app) == nil)
        let rejection = broker.submit(TaskRequest(kind: .refresh, identifier: "com.example.app.refresh2"), app: app)
        #expect(rejection?.status == .tooManyPendingTaskRequests)
        #expect(broker.pending(app: app) == [first])
        let unknown = broker.submit(TaskRequest(kind: .refresh, identifier: "com.example.app.nope"), app: app)
        #expect(unknown?.status == .notPermitted)
        #expect(broker.pending(app: app) == [first])
        // After a cancel the other identifier fits.
        broker.cancel(identifier: "com.example.app.refresh", app: app)
        #expect(broker.submit(TaskRequest(kind: .refresh, identifier: "com.example.app.refresh2"), app: app) == nil)
        #expect(broker.pending(app: app).map(\.identifier) == ["com.example.app.refresh2"])
    }

    @Test func brokerCancelsOne() {
        let broker = InMemoryRequestBroker()
        let app = makeApp()
        let refresh = TaskRequest(kind: .refresh, identifier: "com.example.app.refresh")
        let clean = TaskRequest(kind: .processing, identifier: "com.example.app.clean")
        #expect(broker.submit(refresh, app: app) == nil)
        #expect(broker.submit(clean, app: app) == nil)
        #expect(broker.pending(app: app) == [refresh, clean])
        broker.cancel(identifier: "com.example.app.refresh", app: app)
        #expect(broker.pending(app: app) == [clean])
        broker.cancel(identifier: "com.example.app.not-pending", app: app)
        #expect(broker.pending(app: app) == [clean])
    }

    @Test func brokerCancelsAll() {
        let broker = InMemoryRequestBroker()
        let app = makeApp()
        #expect(broker.submit(TaskRequest(kind: .refresh, identifier: "com.example.app.refresh"), app: app) == nil)
        #expect(broker.submit(TaskRequest(kind: .processing, identifier: "com.example.app.clean"), app: app) == nil)
        broker.cancel(identifier: nil, app: app)
        #expect(broker.pending(app: app).isEmpty)
        // Cancelling everything for an app with nothing pending is harmless.
        broker.cancel(identifier: nil, app: makeApp(identifier: "com.example.empty"))
        #expect(broker.pending(app: makeApp(identifier: "com.example.empty")).isEmpty)
    }

    @Test func brokerKeepsAppsApart() {
        let broker = InMemoryRequestBroker()
        let one = makeApp(identifier: "com.example.one", permitted: ["com.example.one.refresh"])
        let two = makeApp(identifier: "com.example.two", permitted: ["com.example.two.refresh"])
        let refreshOne = TaskRequest(kind: .refresh, identifier: "com.example.one.refresh")
        let refreshTwo = TaskRequest(kind: .refresh, identifier: "com.example.two.refresh")
        // Each app has its own refresh limit.
        #expect(broker.submit(refreshOne, app: one) == nil)
        #expect(broker.submit(refreshTwo, app: two) == nil)
        #expect(broker.pending(app: one) == [refreshOne])
        #expect(broker.pending(app: two) == [refreshTwo])
        // An app cannot submit another app's identifier.
        #expect(broker.submit(refreshTwo, app: one)?.status == .notPermitted)
        broker.cancel(identifier: nil, app: one)
        #expect(broker.pending(app: one).isEmpty)
        #expect(broker.pending(app: two) == [refreshTwo])
        broker.cancel(identifier: "com.example.two.refresh", app: one)
        #expect(broker.pending(app: two) == [refreshTwo])
    }
}

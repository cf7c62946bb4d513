import BackgroundTasks
import BackgroundTasksTestKit
import Foundation
import RacyApp
import XCTest

/// The kit from XCTest, in Swift 5 mode: the same API, async test methods.
final class TestKitSwift5Tests: XCTestCase {
    static let racyInfo = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../Fixtures/RacyApp/Info.plist").standardizedFileURL

    func testSubmitAdvanceAndRunWhatIsDue() async throws {
        try await withTestScheduler(try TestApp.infoPlist(Self.racyInfo)) { scheduler in
            RacyApp().registerHandlers()
            let request = BGProcessingTaskRequest(identifier: RacyApp.fixedSyncIdentifier)
            request.earliestBeginDate = Date(timeIntervalSinceNow: 600)
            try await BGTaskScheduler.shared.submitTaskRequest(request)
            let early = await scheduler.runDueTasks()
            XCTAssertTrue(early.tasks.isEmpty)
            scheduler.clock.advance(by: .seconds(600))
            let launch = await scheduler.runDueTasks()
            XCTAssertEqual(launch.outcome(of: RacyApp.fixedSyncIdentifier), .succeeded, "\(launch)")
            XCTAssertNoThrow(try launch.requireNoProblems())

            do {
                try await BGTaskScheduler.shared.submitTaskRequest(BGAppRefreshTaskRequest(identifier: "com.example.elsewhere"))
                XCTFail("an identifier outside BGTaskSchedulerPermittedIdentifiers was accepted")
            } catch BGTaskScheduler.Error.notPermitted {
                // as on iOS
            }
        }
    }

    func testChaosExpirationFindsTheDoubleCompletion() async throws {
        try await withTestScheduler(try TestApp.infoPlist(Self.racyInfo)) { scheduler in
            RacyApp().registerHandlers()
            do {
                try await scheduler.chaosExpiration(of: RacyApp.syncIdentifier, as: .processing, runs: 30)
                XCTFail("chaos expiration did not find the double completion")
            } catch let report as ChaosReport {
                XCTAssertTrue(report.problems.contains(.completedTwice(identifier: RacyApp.syncIdentifier, calls: 2)), "\(report)")
            }
            try await scheduler.chaosExpiration(of: RacyApp.fixedSyncIdentifier, as: .processing, runs: 20)
        }
    }
}

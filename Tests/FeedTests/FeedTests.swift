// The Feed example's tests, written as an app developer writes them: the app's own launch
// (its plugin entry) registers its handlers, and the test scheduler plays the system.
import BackgroundTasks
import BackgroundTasksTestKit
import Feed
import Foundation
import Testing

@Suite struct FeedTests {
    /// The Info.plist the bundle ships with: the test holds the app to it.
    static let app = Result { try TestApp.infoPlist(URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().appendingPathComponent("../../Plugins/Feed/Info.plist").standardizedFileURL) }

    struct FeedItem: Decodable { var id: Int }

    func feed(_ scheduler: TestScheduler) throws -> [FeedItem] {
        try JSONDecoder().decode([FeedItem].self, from: Data(contentsOf: scheduler.containerDirectory.appendingPathComponent("feed.json")))
    }

    @Test func openingTheAppStartsTheRefreshCycle() async throws {
        try await withTestScheduler(try Self.app.get()) { scheduler in
            try await scheduler.launch(bgtaskPluginEntry, role: .foreground)
            #expect(scheduler.pendingRequests.map(\.identifier) == ["com.example.feed.refresh"])
            #expect(await scheduler.runDueTasks().tasks.isEmpty, "the refresh is 15 minutes out")

            scheduler.clock.advance(by: .seconds(15 * 60))
            let launch = await scheduler.runDueTasks()
            #expect(launch.outcome(of: "com.example.feed.refresh") == .succeeded)
            try launch.requireNoProblems()
            #expect(try feed(scheduler).map(\.id) == Array(1...5))
            // Each refresh schedules the next.
            #expect(scheduler.pendingRequests.map(\.identifier) == ["com.example.feed.refresh"])
        }
    }

    @Test func aFullFeedIsCleanedUpOnlyOnExternalPower() async throws {
        try await withTestScheduler(try Self.app.get()) { scheduler in
            try await scheduler.launch(bgtaskPluginEntry, role: .foreground)
            scheduler.device.externalPower = false
            // Eleven refreshes make 55 items, over the app's 50: it asks for a cleanup.
            for _ in 1...11 {
                scheduler.clock.advance(by: .seconds(15 * 60))
                try await scheduler.runDueTasks().requireNoProblems()
            }
            #expect(scheduler.pendingRequests.map(\.identifier).sorted() == ["com.example.feed.cleanup", "com.example.feed.refresh"])
            #expect(scheduler.why("com.example.feed.cleanup")?.contains { $0.contains("external power") } == true)

            scheduler.device.externalPower = true
            let launch = await scheduler.runDueTasks()
            #expect(launch.outcome(of: "com.example.feed.cleanup") == .succeeded)
            #expect(try feed(scheduler).count == 50)
        }
    }

    @Test func theRefreshHandlerCompletesExactlyOnceWhenEverItIsExpired() async throws {
        try await withTestScheduler(try Self.app.get()) { scheduler in
            try await scheduler.launch(bgtaskPluginEntry)
            try await scheduler.chaosExpiration(of: "com.example.feed.refresh", as: .refresh, runs: 30)
        }
    }

    @Test func theAppsRequestsAreRefusedAsOnIOS() async throws {
        try await withTestScheduler(try Self.app.get()) { scheduler in
            try await scheduler.launch(bgtaskPluginEntry)
            scheduler.appRefreshEnabled = false
            do {
                try await BGTaskScheduler.shared.submitTaskRequest(BGAppRefreshTaskRequest(identifier: "com.example.feed.refresh"))
                Issue.record("submitted with Background App Refresh off")
            } catch let error as BGTaskScheduler.Error {
                #expect(error.code == .unavailable)
            }
        }
    }
}

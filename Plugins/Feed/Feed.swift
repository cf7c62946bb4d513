// Feed: the showcase plugin. A news-feed app that refreshes its feed in the background and
// prunes it while the device charges, written as an iOS app delegate would be.
import BackgroundTasks

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "Feed", didFinishLaunching: { launch in
        FeedApp.current = FeedApp(launch: launch)
        FeedApp.current?.didFinishLaunching()
    }, didResume: { launch in
        // The suspended app resumed for a new launch: its handlers are still registered; what
        // this launch brings (the user opening it) is heard here.
        FeedApp.current?.opened(launch)
    })
}

final class FeedApp: Sendable {
    /// The app, made at the process's first launch and kept while the process lives.
    @MainActor static var current: FeedApp?
    @MainActor static var exportRegistered = false
    static let refreshIdentifier = "com.example.feed.refresh"
    static let cleanupIdentifier = "com.example.feed.cleanup"
    static let exportIdentifier = "com.example.feed.export.archive"
    static let maxItems = 50

    let launch: BGTaskLaunch
    let store: FeedStore

    init(launch: BGTaskLaunch) {
        self.launch = launch
        self.store = FeedStore(directory: launch.dataDirectory)
    }

    // MARK: application(_:didFinishLaunchingWithOptions:)

    @MainActor func didFinishLaunching() {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.refreshIdentifier, using: nil) { task in
            self.handleAppRefresh(task: task as! BGAppRefreshTask)
        }
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.cleanupIdentifier, using: nil) { task in
            self.handleFeedCleanup(task: task as! BGProcessingTask)
        }
        opened(launch)
    }

    /// Opened by the user (a launch, or a resume): start the refresh cycle (iOS apps do this on
    /// entering the background). Refreshes schedule the cleanup once the feed outgrows maxItems.
    @MainActor func opened(_ launch: BGTaskLaunch) {
        if launch.role == .foreground {
            scheduleAppRefresh()
            if let event = launch.eventJSON, event.contains("\"export\"") {
                startExport()
            }
        }
    }

    // MARK: Continued processing (iOS 26): an export the user starts and watches

    /// The user tapped "Export": a continued-processing task, registered when needed (its
    /// identifier matches com.example.feed.export.* in the Info.plist) and shown with progress.
    @MainActor func startExport() {
        // Once per process: a resumed app's handler is still registered (a second registration
        // of an identifier ends the app, as on iOS).
        if !Self.exportRegistered {
            Self.exportRegistered = true
            BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.exportIdentifier, using: nil) { task in
                self.handleExport(task: task as! BGContinuedProcessingTask)
            }
        }
        let request = BGContinuedProcessingTaskRequest(identifier: Self.exportIdentifier, title: "Exporting feed", subtitle: "Preparing…")
        request.strategy = .queue
        // iOS 27's submission API: errors (including ones found after submission) arrive here.
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { print("feed: could not start the export: \(error)") }
        }
    }

    func handleExport(task: BGContinuedProcessingTask) {
        let items = store.items()
        let cancelled = CancellationFlag()
        task.expirationHandler = { cancelled.set() }
        task.progress.totalUnitCount = Int64(max(items.count, 1))
        var exported: [FeedItem] = []
        for (index, item) in items.enumerated() {
            if cancelled.isSet { break }
            Thread.sleep(forTimeInterval: 0.05) // formatting a story takes a moment
            exported.append(item)
            task.progress.completedUnitCount = Int64(index + 1)
            task.updateTitle("Exporting feed", subtitle: "\(index + 1) of \(items.count) stories")
        }
        if items.isEmpty { task.progress.completedUnitCount = 1 }
        store.saveExport(exported)
        print("feed: exported \(exported.count) of \(items.count) stories\(cancelled.isSet ? " (cancelled)" : "")")
        task.setTaskCompleted(success: !cancelled.isSet)
    }

    func scheduleAppRefresh() {
        let request = BGAppRefreshTaskRequest(identifier: Self.refreshIdentifier)
        request.earliestBeginDate = Date(timeIntervalSinceNow: 15 * 60)
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { print("feed: could not schedule app refresh: \(error)") }
        }
    }

    func scheduleFeedCleanup() {
        let request = BGProcessingTaskRequest(identifier: Self.cleanupIdentifier)
        request.requiresExternalPower = true
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { print("feed: could not schedule feed cleanup: \(error)") }
        }
    }

    func handleAppRefresh(task: BGAppRefreshTask) {
        // Schedule the next refresh first, so one is pending however this one ends.
        scheduleAppRefresh()

        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        let operation = FetchFeedOperation(store: store)

        task.expirationHandler = {
            // Out of time: cancel the fetch; its completion block completes the task.
            queue.cancelAllOperations()
        }
        operation.completionBlock = {
            if operation.feedCount > Self.maxItems {
                self.scheduleFeedCleanup()
            }
            task.setTaskCompleted(success: !operation.isCancelled)
        }
        queue.addOperation(operation)
    }

    func handleFeedCleanup(task: BGProcessingTask) {
        let result = store.prune(keepingNewest: Self.maxItems)
        print("feed: cleanup removed \(result.removed) items (kept \(result.kept))")
        task.setTaskCompleted(success: true)
    }
}

final class CancellationFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

/// "Downloads" the newest entries: five items numbered on from the last refresh.
final class FetchFeedOperation: Operation, @unchecked Sendable {
    static let itemsPerRefresh = 5
    let store: FeedStore
    private(set) var feedCount = 0

    init(store: FeedStore) { self.store = store }
    override func main() {
        guard !isCancelled else { return }
        let result = store.appendRefresh(itemsPerRefresh: Self.itemsPerRefresh)
        feedCount = result.total
        print("feed: refresh #\(result.refresh) added \(result.added) items (total \(result.total))")
    }
}

struct FeedItem: Codable, Sendable { var id: Int; var title: String }

/// The app's data: `feed.json` (the items, oldest first) and `state.json` (the refresh counter),
/// in the app's data directory, which persists across launches.
final class FeedStore: @unchecked Sendable {
    private struct State: Codable { var refreshCount = 0 }

    private let lock = NSLock()
    private let feedURL: URL
    private let stateURL: URL

    init(directory: URL) {
        feedURL = directory.appendingPathComponent("feed.json")
        stateURL = directory.appendingPathComponent("state.json")
    }

    func appendRefresh(itemsPerRefresh count: Int) -> (refresh: Int, added: Int, total: Int) {
        lock.withLock {
            var state = load(State.self, from: stateURL) ?? State()
            state.refreshCount += 1
            let first = (state.refreshCount - 1) * count + 1
            var items = load([FeedItem].self, from: feedURL) ?? []
            items += (first..<first + count).map { FeedItem(id: $0, title: "Story \($0)") }
            save(items, to: feedURL)
            save(state, to: stateURL)
            return (state.refreshCount, count, items.count)
        }
    }

    func items() -> [FeedItem] {
        lock.withLock { load([FeedItem].self, from: feedURL) ?? [] }
    }

    func saveExport(_ items: [FeedItem]) {
        lock.withLock { save(items, to: feedURL.deletingLastPathComponent().appendingPathComponent("export.json")) }
    }

    func prune(keepingNewest limit: Int) -> (removed: Int, kept: Int) {
        lock.withLock {
            let items = load([FeedItem].self, from: feedURL) ?? []
            let kept = Array(items.suffix(limit))
            if kept.count != items.count { save(kept, to: feedURL) }
            return (items.count - kept.count, kept.count)
        }
    }

    private func load<T: Decodable>(_ type: T.Type, from url: URL) -> T? {
        guard let data = try? Data(contentsOf: url) else { return nil }
        return try? JSONDecoder().decode(type, from: data)
    }

    private func save<T: Encodable>(_ value: T, to url: URL) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        do {
            try encoder.encode(value).write(to: url, options: .atomic)
        } catch {
            print("feed: could not save \(url.lastPathComponent): \(error)")
        }
    }
}

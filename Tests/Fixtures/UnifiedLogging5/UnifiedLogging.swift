// UnifiedLogging: background-task code that logs the way public iOS apps do, with `import os`
// (Logger extensions per category, privacy on interpolations, os_log with formats and OSLog
// categories, signposts), compiled twice: UnifiedLogging5 (Swift 5 language mode) and
// UnifiedLogging6 (Swift 6; the same file, symlinked). The tests read what it logged with
// `bgtask log`.
import BackgroundTasks
import os

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "UnifiedLogging") { _ in FeedApp.shared.didFinishLaunching() }
}

extension Logger {
    private static let subsystem = Bundle.main.bundleIdentifier!

    static let lifecycle = Logger(subsystem: subsystem, category: "lifecycle")
    static let refresh = Logger(subsystem: subsystem, category: "refresh")
    static let network = Logger(subsystem: subsystem, category: "network")
}

extension OSLog {
    static let sync = OSLog(subsystem: Bundle.main.bundleIdentifier ?? "com.example.oslog", category: "sync")
    static let pointsOfInterest = OSLog(subsystem: "com.example.oslog", category: .pointsOfInterest)
}

struct Account: CustomStringConvertible {
    var email: String
    var description: String { "Account(\(email))" }
}

final class FeedApp: @unchecked Sendable {
    static let shared = FeedApp()
    private let logger = Logger(subsystem: "com.example.oslog", category: "FeedApp")
    private let signposter = OSSignposter(subsystem: "com.example.oslog", category: "performance")
    let account = Account(email: "alice@example.com")
    let token = "tok-7f3a9"
    let password = "hunter2"

    func didFinishLaunching() {
        Logger.lifecycle.notice("didFinishLaunching, build \(42)")
        BGTaskScheduler.shared.register(forTaskWithIdentifier: "com.example.oslog.refresh", using: nil) { task in
            self.handleAppRefresh(task: task as! BGAppRefreshTask)
        }
    }

    func handleAppRefresh(task: BGAppRefreshTask) {
        Logger.refresh.info("Refresh started: \(task.identifier, privacy: .public)")
        let state = signposter.beginInterval("fetch")
        let items = 12
        let url = URL(string: "https://feeds.example.com/u/alice")!
        Logger.network.notice("Fetched \(items) items for \(self.account.email) from \(url, privacy: .private)")
        Logger.network.debug("auth token \(self.token, privacy: .private(mask: .hash))")
        Logger.network.info("login \(self.password, privacy: .sensitive) for \(self.account)")
        Logger.network.error("HTTP \(503, privacy: .public) from \(url.host ?? "", privacy: .public); retry in \(2.5, format: .fixed(precision: 1))s")
        Logger.network.warning("slow response: \(1234, format: .decimal(minDigits: 6)) ms, code \(255, format: .hex(includePrefix: true), align: .right(columns: 6))")
        logger.log("plain log, flag \(true), ratio \(0.75)")
        logger.log(level: .fault, "level fault via log(level:)")
        logger.critical("critical is a fault")
        logger.trace("trace is debug")
        Logger().info("default logger entry")
        Logger(OSLog.disabled).error("never written")
        logger.info("two\nlines with a \\ backslash")
        signposter.endInterval("fetch", state)
        signposter.emitEvent("parsed", "\(items) parsed")

        os_log("Legacy %{public}@ fetched %d items for %@", log: .sync, type: .info, "feed", 7, account.email)
        os_log(.error, log: .sync, "Code %{public}d failed: %{private}@ (%.2f%%)", 42, "db-secret", 99.5)
        os_log("plain os_log entry")
        os_log(.debug, log: .sync, "interpolated os_log \(items, privacy: .public) for \(self.account.email)")
        let id = OSSignpostID(log: .pointsOfInterest)
        os_signpost(.begin, log: .pointsOfInterest, name: "Refresh", signpostID: id)
        os_signpost(.end, log: .pointsOfInterest, name: "Refresh", signpostID: id, "done %{public}@", "ok")

        task.expirationHandler = {
            Logger.refresh.error("expired")
        }
        Logger.refresh.notice("Refresh finished")
        task.setTaskCompleted(success: true)
    }
}

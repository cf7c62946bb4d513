/// How many iterations each measurement takes: `--quick` (under 2 minutes on a 2-core
/// machine) or the full run.
struct Iterations {
    var quick: Bool
    /// fork + _exit + waitpid samples for the p50.
    var forkLatency: Int
    /// forks per throughput measurement (sequential, and split over 2 threads).
    var forkThroughput: Int
    /// no-op launches for the latency percentiles.
    var launchLatency: Int
    /// no-op launches per throughput measurement (sequential, and split over 2 threads).
    var launchThroughput: Int
    /// in-process timer and kill floors (50 ms deadlines).
    var timerFloor: Int
    /// 1 s budgets expired.
    var expiry: Int
    /// 200 ms + 200 ms watchdog kills.
    var watchdog: Int
    /// 64 MiB jetsam kills per mechanism.
    var jetsam: Int
    /// rows of the batched SQLite floor, and seconds of its one-row-per-transaction variant.
    var sqliteBatchedRows: Int
    var sqliteSingleSeconds: Double
    /// apps (11 identifiers each) the submission host knows, threads submitting, and seconds
    /// per submission phase.
    var submitApps: Int
    var submitThreads: Int
    /// Concurrent clients for the many-clients figure.
    var submitClients: Int
    var submitSeconds: Double
    var resubmitSeconds: Double
    /// pending requests spread over `pendingApps` apps.
    var pending: Int
    var pendingApps: Int
    /// repeats of each lookup.
    var lookups: Int
    /// seconds of each idle CPU measurement.
    var idleSeconds: Double
    /// End to end through a host: submissions one at a time, apps due at once (and rounds of
    /// them), simulate-launch round trips, pushes.
    var e2eLatency: Int = 500
    var e2eApps: Int = 200
    var e2eRounds: Int = 3
    var e2eSimulate: Int = 100
    var e2ePush: Int = 100
    /// Launches supervised at once, and their budget (s).
    var scaleSizes: [Int] = [10, 100, 1000]
    var scaleBudget: Double = 15
    /// Launches per confinement variant.
    var confinementLatency: Int = 300
    /// The dashboard: launches running, records stored, requests per page, launches watched.
    var dashboardRunning: Int = 1000
    var dashboardRecords: Int = 100_000
    var dashboardRequests: Int = 50
    var dashboardEvents: Int = 50

    static let full = Iterations(
        quick: false, forkLatency: 5000, forkThroughput: 3000, launchLatency: 500, launchThroughput: 300,
        timerFloor: 100, expiry: 100, watchdog: 200, jetsam: 50, sqliteBatchedRows: 200_000, sqliteSingleSeconds: 5,
        submitApps: 3000, submitThreads: 4, submitClients: 32, submitSeconds: 10, resubmitSeconds: 5,
        pending: 1_000_000, pendingApps: 10_000, lookups: 1000, idleSeconds: 10)

    static let quickRun = Iterations(
        quick: true, forkLatency: 1000, forkThroughput: 600, launchLatency: 100, launchThroughput: 100,
        timerFloor: 20, expiry: 12, watchdog: 20, jetsam: 10, sqliteBatchedRows: 50_000, sqliteSingleSeconds: 1.5,
        submitApps: 1000, submitThreads: 4, submitClients: 32, submitSeconds: 3, resubmitSeconds: 2,
        pending: 100_000, pendingApps: 10_000, lookups: 200, idleSeconds: 3,
        e2eLatency: 100, e2eApps: 50, e2eRounds: 1, e2eSimulate: 20, e2ePush: 20,
        scaleSizes: [10, 50], scaleBudget: 6, confinementLatency: 60,
        dashboardRunning: 50, dashboardRecords: 10_000, dashboardRequests: 20, dashboardEvents: 20)
}

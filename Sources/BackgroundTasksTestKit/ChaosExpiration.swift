import Foundation

/// The outcome of `chaosExpiration`: every run, and the ones that broke the rule that a handler
/// ends with exactly one `setTaskCompleted`. Thrown when there is any such run; its description
/// names the seed that reproduces them.
public struct ChaosReport: Error, Sendable, CustomStringConvertible {
    public struct Run: Sendable, CustomStringConvertible {
        /// The first `TestScheduler.calibrationRuns` runs are not expired; the others are, at `moment`.
        public var index: Int
        /// When expiration was delivered, after the launch started (nil: not expired).
        public var moment: Duration?
        public var task: TaskReport
        public var problems: [TestProblem]

        public var description: String {
            "run \(index)" + (moment.map { " expired at \($0)" } ?? " (calibration, not expired)") + ": \(task.outcome.rawValue)"
                + (problems.isEmpty ? "" : ": " + problems.map(\.description).joined(separator: "; "))
        }
    }

    public var identifier: String
    public var seed: UInt64
    /// The shortest unexpired run; moments are drawn from 0 to 1.5 times it.
    public var calibration: Duration?
    public var runs: [Run]

    /// The runs with problems.
    public var failures: [Run] { runs.filter { !$0.problems.isEmpty } }

    /// Every distinct problem found, in the order first seen.
    public var problems: [TestProblem] {
        failures.flatMap(\.problems).reduce(into: []) { if !$0.contains($1) { $0.append($1) } }
    }

    public var description: String {
        let failed = failures
        guard !failed.isEmpty else {
            return "chaos expiration of '\(identifier)': \(runs.count) runs, none broke a rule (seed \(seed))"
        }
        return "chaos expiration of '\(identifier)' (seed \(seed), calibration \(calibration.map { "\($0)" } ?? "none")): \(failed.count) of \(runs.count) runs broke a rule\n"
            + failed.prefix(5).map { "  " + $0.description }.joined(separator: "\n")
            + (failed.count > 5 ? "\n  … and \(failed.count - 5) more" : "")
    }
}

extension TestScheduler {
    /// Runs `identifier` `runs` times, each expired at a random moment across its handler's
    /// work, and checks that every run ends with exactly one `setTaskCompleted` (never two,
    /// never none, and within `grace` of its expiration). Expiration races are where handlers
    /// complete twice (the expiration handler and the cancelled work both complete) or never
    /// (the work's completion path skipped on cancellation).
    ///
    /// Three first runs, not expired, measure the handler; the moments are drawn from zero to
    /// 1.5 times the shortest (at least a millisecond) with a generator seeded by `seed` (random
    /// when nil; the report names it, so a failure can be replayed). The app's state carries
    /// over from run to run, as it does across launches. Throws the `ChaosReport` when a run
    /// broke the rule; returns it when none did.
    /// Unexpired runs before the expired ones (the report's first runs).
    public static let calibrationRuns = 3

    @discardableResult
    public func chaosExpiration(
        of identifier: String, as type: TaskType? = nil, runs: Int = 50, seed: UInt64? = nil,
        grace: Duration = .seconds(1), settle: Duration = .milliseconds(20), timeout: Duration = .seconds(10)
    ) async throws -> ChaosReport {
        let seed = seed ?? UInt64.random(in: 1...UInt64.max)
        var report = ChaosReport(identifier: identifier, seed: seed, calibration: nil, runs: [])

        // The shortest of a few unexpired runs is the least disturbed measure of the work (a
        // loaded machine only ever makes a run longer).
        var durations: [Duration] = []
        for index in 0..<Self.calibrationRuns {
            let calibration = try await start(identifier, as: type).finish(timeout: timeout, grace: grace, settle: settle)
            guard let task = calibration[identifier] else { throw TestKitError("the launch did not run '\(identifier)'") }
            report.runs.append(.init(index: index, moment: nil, task: task, problems: calibration.problems))
            guard calibration.problems.isEmpty else { throw report }
            if let duration = task.duration { durations.append(duration) }
        }
        report.calibration = durations.min()

        let measured = durations.min() ?? .milliseconds(1)
        let slowest = durations.max() ?? measured
        let window = max(measured * 1.5, .milliseconds(1))
        let runGrace = max(grace, slowest * 3)
        var generator = SplitMix64(seed: seed)
        for index in Self.calibrationRuns..<(Self.calibrationRuns + max(runs, 1)) {
            let nanoseconds = Int64(Double(window.components.seconds) * 1e9 + Double(window.components.attoseconds) / 1e9)
            let moment = Duration.nanoseconds(Int64.random(in: 0...max(nanoseconds, 1), using: &generator))
            let launch = try await start(identifier, as: type).finish(expiringAfter: moment, timeout: timeout, grace: runGrace, settle: settle)
            guard let task = launch[identifier] else { throw TestKitError("the launch did not run '\(identifier)'") }
            report.runs.append(.init(index: index, moment: moment, task: task, problems: launch.problems))
        }
        // A completion that came after its run was reported.
        let late = takeProblems()
        if !late.isEmpty, let last = report.runs.indices.last { report.runs[last].problems += late }
        if !report.failures.isEmpty { throw report }
        return report
    }
}

/// A small seeded generator (SplitMix64), so a chaos run can be replayed from its seed.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

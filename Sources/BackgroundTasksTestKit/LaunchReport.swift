import Foundation

/// A task's type, as the run record names it.
public enum TaskType: String, Sendable, CaseIterable {
    case refresh
    case processing
    case healthResearch = "health-research"
    case continuedProcessing = "continued-processing"
}

/// How a task ended, in the run record's words (`bgtask history`).
public enum TaskOutcome: String, Sendable, CaseIterable {
    /// Completed with success.
    case succeeded
    /// Completed without success, or by the system at expiry, the task having no expiration
    /// handler then.
    case failed
    /// Its expiration handler ran and it completed after.
    case expired
    /// Never completed.
    case unfinished
    /// No launch handler was registered for it.
    case notRegistered = "not-registered"
}

/// Something app code did that iOS punishes (a crash, the watchdog) or that breaks the rule every
/// handler must keep: end with exactly one `setTaskCompleted(success:)`.
public enum TestProblem: Sendable, Equatable, CustomStringConvertible {
    /// `setTaskCompleted` called more than once (`calls` times in all).
    case completedTwice(identifier: String, calls: Int)
    /// Never completed, and never expired, before the launch's time out.
    case neverCompleted(identifier: String)
    /// Its expiration was delivered and it did not complete within the grace period: on a
    /// device the watchdog kills the app.
    case expiredWithoutCompleting(identifier: String)
    /// `setTaskCompleted` called after its launch was reported (with how many calls in all).
    case completedAfterLaunchEnded(identifier: String, calls: Int)
    /// A second registration of one identifier: iOS ends the app.
    case registeredTwice(identifier: String)
    /// A registration after the app finished launching (continued processing excepted): iOS
    /// ends the app.
    case registeredAfterLaunch(identifier: String)

    public var identifier: String {
        switch self {
        case .completedTwice(let id, _), .neverCompleted(let id), .expiredWithoutCompleting(let id),
             .completedAfterLaunchEnded(let id, _), .registeredTwice(let id), .registeredAfterLaunch(let id):
            id
        }
    }

    public var description: String {
        switch self {
        case .completedTwice(let id, let calls):
            "'\(id)' called setTaskCompleted \(calls) times; a handler must complete its task exactly once"
        case .neverCompleted(let id):
            "'\(id)' never called setTaskCompleted; a handler must complete its task exactly once"
        case .expiredWithoutCompleting(let id):
            "'\(id)' was expired and did not call setTaskCompleted within the grace period (the watchdog would end the app)"
        case .completedAfterLaunchEnded(let id, let calls):
            "'\(id)' called setTaskCompleted after its launch ended (\(calls) calls in all)"
        case .registeredTwice(let id):
            "launch handler for '\(id)' registered twice (BGTaskScheduler allows one registration per identifier; iOS ends the app)"
        case .registeredAfterLaunch(let id):
            "launch handler for '\(id)' registered after the app finished launching (register in application(_:didFinishLaunchingWithOptions:); iOS ends the app)"
        }
    }
}

/// What happened to one task of a launch.
public struct TaskReport: Sendable, Equatable, CustomStringConvertible {
    public var identifier: String
    public var type: TaskType
    public var outcome: TaskOutcome
    /// The success the task was completed with (by the app, or false by the system), if it was.
    public var success: Bool?
    /// How many times the app called `setTaskCompleted` for it.
    public var completionCalls: Int
    /// Whether its expiration was delivered.
    public var expired: Bool
    /// At expiry: true when the app had an expiration handler, false when the system completed
    /// the task (unsuccessfully) for want of one; nil when it was not expired.
    public var expirationHandled: Bool?
    /// From the handler's call to the first completion, in real time.
    public var duration: Duration?
    /// Broken rules: completed twice, never, or not after expiry.
    public var problems: [TestProblem]

    public var description: String {
        var text = "\(identifier) [\(type.rawValue)] \(outcome.rawValue)"
        if let duration { text += " after \(duration)" }
        if expired { text += expirationHandled == true ? ", expiration handled" : ", expired without an expiration handler" }
        for problem in problems { text += "\n  problem: \(problem)" }
        return text
    }
}

/// What a launch of the test scheduler did: one report per task, in the order they started.
public struct LaunchReport: Sendable, CustomStringConvertible {
    public var tasks: [TaskReport]
    /// The tasks' problems, and the scheduler's since the previous report (registrations, late
    /// completions).
    public var problems: [TestProblem]

    public subscript(identifier: String) -> TaskReport? { tasks.first { $0.identifier == identifier } }

    /// The outcome of the task `identifier`, or nil when the launch did not run it.
    public func outcome(of identifier: String) -> TaskOutcome? { self[identifier]?.outcome }

    /// Throws `TestKitFailure` listing the problems, if there are any.
    public func requireNoProblems() throws {
        if !problems.isEmpty { throw TestKitFailure(problems: problems, context: "the launch") }
    }

    public var description: String {
        (["launch of \(tasks.count) task(s)"] + tasks.map { "  " + $0.description.replacingOccurrences(of: "\n", with: "\n  ") }
            + problems.filter { problem in !tasks.contains { $0.problems.contains(problem) } }.map { "  problem: \($0)" })
            .joined(separator: "\n")
    }
}

/// A test failure the kit found: app code broke a rule of the framework.
public struct TestKitFailure: Error, Sendable, CustomStringConvertible {
    public var problems: [TestProblem]
    public var context: String

    public var description: String {
        "\(context): " + problems.map(\.description).joined(separator: "; ")
    }
}

/// A misuse of the kit or a request it cannot carry out (as opposed to a problem in app code).
public struct TestKitError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

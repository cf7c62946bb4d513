import BGTaskControl
import BGTaskModel
import BGTaskSystem
import Foundation
import _BGTaskSystemShims
#if canImport(Glibc)
import Glibc
#endif

@_exported import enum BGTaskControl.ControlCommand
@_exported import struct BGTaskControl.ControlResponse
@_exported import struct BGTaskControl.ControlFailure
@_exported import struct BGTaskControl.ControlCall
@_exported import struct BGTaskControl.AppsPage
@_exported import struct BGTaskControl.HistoryPage
@_exported import struct BGTaskControl.LaunchAnswer
@_exported import struct BGTaskControl.WhyAnswer
@_exported import struct BGTaskControl.NotificationsAnswer
@_exported import struct BGTaskControl.TransfersPage
@_exported import enum BGTaskControl.ControlErrorCode
@_exported import struct BGTaskControl.DeviceChanges
@_exported import enum BGTaskControl.DeviceCondition
@_exported import enum BGTaskControl.DeviceSetting
@_exported import struct BGTaskControl.RunRecord
@_exported import struct BGTaskControl.StoredRequest
@_exported import struct BGTaskModel.TaskRequest
@_exported import enum BGTaskModel.TaskKind

/// A real `bgtask host`, started from a test on a temporary state directory with the bundles it
/// is given, driven through its control socket (the CLI's verbs), and stopped with every process
/// it started: it runs as the leader of its own process group, and `stop()` (or `deinit`) kills
/// the group and reaps it.
///
/// The executable is `BGTASK_CLI` when set, else the `bgtask` built next to the test binary
/// (`swift build --build-tests` puts both in `.build/debug`); the host finds its runner next to
/// itself (or through `BGTASK_RUNNER`).
///
/// Each verb the host knows has a method here; `send(_:)` sends any `ControlCommand`, so a verb
/// the host gains (a push endpoint, say) is usable from a test the day it exists, before it has
/// a method of its own.
public final class TestHost: @unchecked Sendable {
    /// The temporary directory holding `plugins/`, `state/` and `host.log`.
    public let directory: URL
    public let executable: URL
    public let arguments: [String]
    public var pluginsDirectory: URL { directory.appendingPathComponent("plugins") }
    public var stateDirectory: URL { directory.appendingPathComponent("state") }
    /// The host's stdout and stderr.
    public var logURL: URL { directory.appendingPathComponent("host.log") }

    private let lock = NSLock()
    private var pid: pid_t = 0

    /// The `bgtask` executable: `BGTASK_CLI`, else next to the running test binary.
    public static func defaultExecutable() throws -> URL {
        if let path = ProcessInfo.processInfo.environment["BGTASK_CLI"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let beside = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent("bgtask")
        guard FileManager.default.isExecutableFile(atPath: beside.path) else {
            throw TestKitError("no bgtask executable at \(beside.path) (build it: swift build --product bgtask) and BGTASK_CLI is not set")
        }
        return beside
    }

    /// A host (not yet started) whose plugin directory holds a copy of each of `bundles`
    /// (`Name.app` directories, e.g. from `swift package bgtask-bundle`). `arguments` are
    /// `bgtask host`'s options after `--plugins` and `--state` (default: a virtual clock).
    public init(bundles: [URL] = [], arguments: [String] = ["--clock", "virtual"], executable: URL? = nil) throws {
        self.executable = try executable ?? Self.defaultExecutable()
        self.arguments = arguments
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-testhost-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory.appendingPathComponent("plugins"), withIntermediateDirectories: true)
        for bundle in bundles { try install(bundle) }
    }

    /// Stops the host if a test left it running, and removes the directory.
    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    /// Copies a bundle into the plugin directory (staged, then moved in at once, as operators
    /// are told to), while the host runs or before it starts.
    public func install(_ bundle: URL) throws {
        let staged = directory.appendingPathComponent("staging-\(UUID().uuidString)")
        try FileManager.default.copyItem(at: bundle, to: staged)
        try FileManager.default.moveItem(at: staged, to: pluginsDirectory.appendingPathComponent(bundle.lastPathComponent))
    }

    /// Starts the host and waits (up to `timeout`) until its control socket answers.
    public func start(timeout: Duration = .seconds(30)) throws {
        try lock.withLock {
            guard pid == 0 else { throw TestKitError("the host is already running (pid \(pid))") }
            let log = open(logURL.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            guard log >= 0 else { throw TestKitError("cannot open \(logURL.path): errno \(errno)") }
            defer { close(log) }
            do {
                pid = try Subprocess.spawn(
                    [executable.path, "host", "--plugins", pluginsDirectory.path, "--state", stateDirectory.path] + arguments,
                    environment: ProcessInfo.processInfo.environment, stdout: log, stderr: log)
            } catch {
                throw TestKitError("cannot start \(executable.path): \(error)")
            }
        }
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if (try? ControlClient(stateDirectory: stateDirectory).send(.status))?.ok == true { return }
            if lock.withLock({ bgtask_has_exited(pid) != 0 }) { break }
            usleep(20_000)
        }
        let output = (try? String(contentsOf: logURL, encoding: .utf8)) ?? ""
        stop()
        throw TestKitError("the host did not come up within \(timeout): \(output)")
    }

    /// Whether the host was started and not stopped.
    public var isRunning: Bool { lock.withLock { pid > 0 } }

    /// Stops the host: SIGTERM (it ends its launches), up to `timeout` for it to exit, then
    /// SIGKILL; then kills whatever is left of its process group and reaps the host. Returns
    /// its exit code (nil when it was not running).
    @discardableResult
    public func stop(timeout: Duration = .seconds(10)) -> Int32? {
        lock.withLock {
            guard pid > 0 else { return nil }
            defer { pid = 0 }
            kill(pid, SIGTERM)
            let deadline = ContinuousClock.now + timeout
            while bgtask_has_exited(pid) == 0 && ContinuousClock.now < deadline { usleep(10_000) }
            kill(pid, SIGKILL)
            let status = Subprocess.wait(pid)
            kill(-pid, SIGKILL)
            return status.map(Subprocess.exitCode)
        }
    }

    // MARK: Verbs

    /// Sends any control request and returns the answer as it is (`ok` false with an error
    /// code and message when the host refused it).
    public func send(_ command: ControlCommand) throws -> ControlResponse {
        try ControlClient(stateDirectory: stateDirectory).send(command)
    }

    /// Sends a request as it is on the wire, whatever it holds (for tests of the host's answer to
    /// requests no client of this package sends).
    package func send(wire request: ControlRequest) throws -> ControlResponse {
        try ControlClient(stateDirectory: stateDirectory).send(wire: [request])[0]
    }

    /// Sends `command` and throws the host's refusal (a `ControlFailure`) when it refused it.
    @discardableResult
    public func perform(_ command: ControlCommand) throws -> ControlResponse {
        let response = try send(command)
        if let failure = response.failure { throw failure }
        return response
    }

    /// Sends `call`'s command and returns its typed answer (`try host.call(.pending())` is
    /// `[StoredRequest]`); the host's refusal is thrown as a `ControlFailure`.
    @discardableResult
    public func call<Answer>(_ call: ControlCall<Answer>) throws(ControlFailure) -> Answer {
        try ControlClient(stateDirectory: stateDirectory).call(call)
    }

    /// Submits a request for `app`, as `bgtask submit` does; `earliestIn` is from the host's
    /// (virtual) now.
    public func submit(_ request: TaskRequest, app: String, earliestIn delay: Duration? = nil) throws {
        try call(.submit(app: app, request: request, delay: delay.map(\.seconds)))
    }

    /// Moves the host's virtual clock forward; returns its new now.
    @discardableResult
    public func advanceClock(by duration: Duration) throws -> Date {
        try call(.clock(advance: duration.seconds)).now
    }

    /// Launches the app for `identifier` now (`bgtask simulate-launch`); with `wait`, returns
    /// the launch's record once it ends. `force` runs it without a pending request, as a task of
    /// `type` (needed when the app's background modes do not decide it).
    @discardableResult
    public func simulateLaunch(_ identifier: String, app: String? = nil, force: Bool = false, type: TaskKind? = nil, wait: Bool = true) throws -> RunRecord? {
        try call(.simulateLaunch(identifier: identifier, app: app, force: force, kind: type, wait: wait)).record
    }

    /// Expires the running task `identifier` (`bgtask simulate-expire`).
    public func simulateExpire(_ identifier: String) throws {
        try call(.simulateExpire(identifier: identifier))
    }

    /// Ends `app`'s suspended process now, as jetsam would (`bgtask evict`): its next launch
    /// starts a new process, without the memory of the earlier ones. True when it had one.
    /// (Suspension and resumption come with launches: a launch whose work is over leaves the
    /// app suspended, and the app's next launch resumes it; the records say `resumed`.)
    @discardableResult
    public func evict(_ app: String) throws -> Bool {
        try call(.evict(app: app))
    }

    /// The host's pending requests (of `app`, or every app's).
    public func pending(app: String? = nil) throws -> [StoredRequest] {
        try call(.pending(app: app))
    }

    /// Run records, newest first.
    public func records(app: String? = nil, limit: Int = 50) throws -> [RunRecord] {
        try call(.history(app: app, limit: limit)).records
    }

    /// Waits (bounded) until the host has at least `count` run records; returns them, newest
    /// first.
    public func waitForRecords(count: Int, app: String? = nil, timeout: Duration = .seconds(30)) throws -> [RunRecord] {
        let deadline = ContinuousClock.now + timeout
        while true {
            let records = try self.records(app: app, limit: max(count, 50))
            if records.count >= count { return records }
            if ContinuousClock.now > deadline {
                throw TestKitError("the host has \(records.count) run record(s) after \(timeout), expected \(count)")
            }
            usleep(20_000)
        }
    }

    /// Sets device conditions (`bgtask device`: `.power`, `.network`, `.lowPower`, ... to
    /// `.on`, `.off` or `.auto`).
    public func setDevice(_ overrides: [DeviceCondition: DeviceSetting]) throws {
        try call(.device(DeviceChanges(overrides)))
    }
}

extension Duration {
    /// In seconds, as the control protocol carries durations.
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

import BGTaskHost
import BGTaskControl
import BGTaskSystem
import Foundation
import Testing
import _BGTaskSystemShims

/// The package's build products (the CLI, the runner, the plugin libraries) sit next to the
/// test executable.
enum Products {
    static let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static var cli: String { directory.appendingPathComponent("bgtask").path }
    static func library(_ name: String) -> String { directory.appendingPathComponent("lib\(name).so").path }
}

/// What a CLI invocation printed and how it exited.
struct CLIResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// A scratch directory with a state directory inside, removed by `remove()`.
struct Scratch {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    var state: URL { url.appendingPathComponent("state") }

    func remove() { try? FileManager.default.removeItem(at: url) }

    /// Assembles a bundle with the real `bgtask bundle` command.
    func bundle(_ library: String, info: String, name: String? = nil) throws -> URL {
        let output = url.appendingPathComponent(name ?? "\(library).app")
        let result = try runCLI(["bundle", "--library", Products.library(library),
                                 "--info", Products.packageRoot.appendingPathComponent(info).path,
                                 "--output", output.path])
        try #require(result.status == 0, "bgtask bundle failed: \(result.stderr)")
        return output
    }

    /// `bgtask run BUNDLE --json ...` and its decoded record.
    func run(_ bundle: URL, _ arguments: [String], environment: [String: String] = [:]) throws -> (RunRecord, CLIResult) {
        let result = try runCLI(["run", bundle.path, "--json", "--state", state.path] + arguments, environment: environment)
        let record = try #require(try? RunRecord.decode(Data(result.stdout.utf8)),
                                  "no run record (status \(result.status)): \(result.stdout) \(result.stderr)")
        return (record, result)
    }
}

/// Runs the real CLI binary in its own process group and waits for it (reaping it). A CLI
/// still running after `timeout` has its whole group killed. posix_spawn rather than
/// Foundation's Process, which opens descriptors of its own that the supervisor's leak test
/// (running in parallel in this process) would see.
func runCLI(_ arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(120)) throws -> CLIResult {
    try runCommand([Products.cli] + arguments, environment: environment, timeout: timeout)
}

/// Runs `command` (absolute path first) like `runCLI`.
func runCommand(_ command: [String], environment: [String: String] = [:], timeout: Duration = .seconds(120)) throws -> CLIResult {
    var env = ProcessInfo.processInfo.environment
    for (key, value) in environment { env[key] = value }
    var outPipe: [Int32] = [0, 0], errPipe: [Int32] = [0, 0]
    guard bgtask_pipe_cloexec(&outPipe) == 0, bgtask_pipe_cloexec(&errPipe) == 0 else {
        throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
    }
    let pid: pid_t
    do {
        pid = try Subprocess.spawn(command, environment: env, stdout: outPipe[1], stderr: errPipe[1])
    } catch {
        close(outPipe[0])
        close(errPipe[0])
        close(outPipe[1])
        close(errPipe[1])
        throw POSIXError(POSIXErrorCode(rawValue: error.errno) ?? .EIO)
    }
    close(outPipe[1])
    close(errPipe[1])

    let group = DispatchGroup()
    nonisolated(unsafe) var outData = Data(), errData = Data()
    for (fd, isOut) in [(outPipe[0], true), (errPipe[0], false)] {
        group.enter()
        DispatchQueue.global().async {
            let data = FileHandle(fileDescriptor: fd, closeOnDealloc: true).readDataToEndOfFile()
            if isOut { outData = data } else { errData = data }
            group.leave()
        }
    }
    if group.wait(timeout: .now() + .nanoseconds(Int(timeout.components.seconds) * 1_000_000_000)) == .timedOut {
        kill(-pid, SIGKILL)
        group.wait()
    }
    let status = Subprocess.wait(pid) ?? -1
    kill(-pid, SIGKILL) // anything the CLI left in its group
    return CLIResult(status: status == -1 ? -1 : Subprocess.exitCode(status),
                     stdout: String(decoding: outData, as: UTF8.self),
                     stderr: String(decoding: errData, as: UTF8.self))
}

extension RunRecord {
    func task(_ identifier: String) -> TaskRecord? { tasks.first { $0.identifier == identifier } }

    /// The Misbehaving fixture's behaviours an equivalence test runs through two paths: success,
    /// failure, a double completion, an expiration handled, a watchdog kill, a crash, an exit
    /// and a late registration.
    static let behaviours = ["ok", "fail", "twice", "never", "noexpiry", "segfault", "exit3", "late-register"]

    /// What the record says about the launch's behaviour, without how it was made (launcher,
    /// pids, times): what two equivalent paths must agree on.
    var behaviour: String {
        let tasks = tasks.map {
            "\($0.identifier) \($0.type.rawValue) \($0.outcome.rawValue) handled=\(String(describing: $0.expirationHandled)) success=\(String(describing: $0.success)) expired=\($0.expiredMs != nil)"
        }
        let layers = (sandbox ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value.applied)" }
        return ["termination=\(termination.rawValue) signal=\(signal ?? "-") exit=\(exitStatus.map(String.init) ?? "-") error=\(error != nil)",
                "reason=\(reason) budget=\(budgetMs) grace=\(graceMs) memory=\(memoryLimitBytes) \(memoryMechanism) expiredAt=\(expiredAtMs != nil)",
                "registered=\(registered.sorted()) refused=\(refusedRegistrations.sorted()) submitted=\(submitted.map(\.identifier))",
                "tasks=\(tasks) sandbox=\(layers) resumed=\(String(describing: resumed))"].joined(separator: "\n")
    }
}

/// True when a process with this pid exists (and is not a zombie we could reap).
/// Waits, at most `seconds`, until `condition` holds (looked at every 20 ms); its last answer.
func eventually(within seconds: Double = 5, _ condition: () -> Bool) -> Bool {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

func processExists(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    return stat[stat.index(close, offsetBy: 2)] != "Z"
}

extension RunRecord {
    /// The text of the launch's log file, which the launch must have written.
    func logText(sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let path = try #require(log, "the launch wrote a log", sourceLocation: sourceLocation)
        return try String(contentsOfFile: path, encoding: .utf8)
    }
}

/// Live processes of this machine whose command name (/proc/PID/comm) is `name`: how a test
/// finds what a launch started, whose pid inside the launch's PID namespace is not its own.
func processes(named name: String) -> [pid_t] {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap { entry in
        guard let pid = pid_t(entry),
              let comm = try? String(contentsOfFile: "/proc/\(entry)/comm", encoding: .utf8),
              comm.trimmingCharacters(in: .newlines) == name,
              ProcessTree.status(of: pid)?.state != UInt8(ascii: "Z") else { return nil }
        return pid
    }
}

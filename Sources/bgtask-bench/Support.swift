import BGTaskSystem
import BGTaskHost
import BGTaskControl
import Foundation
import Glibc
import _BGTaskSystemShims

// MARK: Time and statistics

/// CLOCK_MONOTONIC in nanoseconds (the clock the supervisor and the runner stamp with).
func monotonicNs() -> UInt64 { bgtask_monotonic_ns() }

func seconds(since startNs: UInt64) -> Double { Double(monotonicNs() - startNs) / 1e9 }

/// Samples of one figure; percentiles by nearest rank.
struct Samples {
    private(set) var values: [Double] = []
    var count: Int { values.count }
    var isEmpty: Bool { values.isEmpty }

    init(_ values: [Double] = []) { self.values = values }

    mutating func append(_ value: Double) { values.append(value) }
    mutating func append(contentsOf other: Samples) { values.append(contentsOf: other.values) }

    /// The p-th percentile (0...100), nearest rank; NaN when empty.
    func percentile(_ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        let sorted = values.sorted()
        let rank = Int((p / 100 * Double(sorted.count)).rounded(.up))
        return sorted[Swift.min(Swift.max(rank, 1), sorted.count) - 1]
    }

    var p50: Double { percentile(50) }
    var p99: Double { percentile(99) }
    var max: Double { values.max() ?? .nan }
    var min: Double { values.min() ?? .nan }
}

/// Progress on stderr, so that `--json` keeps stdout to the one object.
func progress(_ text: String) {
    FileHandle.standardError.write(Data("bgtask-bench: \(text)\n".utf8))
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Collects values from several threads.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
    var current: Value { withLock { $0 } }
}

/// Runs `body(0..<count)` on `count` threads of their own at once and waits for all of them.
func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let group = DispatchGroup()
    for index in 0..<count {
        group.enter()
        let thread = Thread {
            body(index)
            group.leave()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    group.wait()
}

// MARK: The package's build products

/// The products `swift run -c release` builds sit next to this executable.
enum Products {
    static let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
    static var cli: String { directory.appendingPathComponent("bgtask").path }
    static var runner: String { directory.appendingPathComponent("bgtask-runner").path }
    static var benchLibrary: String { directory.appendingPathComponent("libBenchPlugin.so").path }
    /// The Downloader fixture (a background URL session), for the transfer section.
    static var downloaderLibrary: String { directory.appendingPathComponent("libDownloader.so").path }
    /// `release` or `debug`.
    static var configuration: String { directory.lastPathComponent }

    /// The package root (for `swift build`), from this source file's path or the working
    /// directory.
    static var packageRoot: URL? {
        let fromSource = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        for candidate in [fromSource, URL(fileURLWithPath: FileManager.default.currentDirectoryPath)]
        where FileManager.default.fileExists(atPath: candidate.appendingPathComponent("Package.swift").path) {
            return candidate
        }
        return nil
    }

    /// `swift run bgtask-bench` builds only the bench and its library dependencies: the CLI
    /// (the host), the runner and the bench plugin are separate products. Builds them (a second
    /// or so each when up to date) unless `rebuild` is false and they exist.
    static func ensure(rebuild: Bool) throws {
        let needed = [("bgtask", cli), ("bgtask-runner", runner), ("BenchPlugin", benchLibrary), ("Downloader", downloaderLibrary)]
        for (product, path) in needed {
            let missing = access(path, R_OK) != 0
            guard rebuild || missing else { continue }
            guard let root = packageRoot else {
                if missing { throw BenchError("\(path) is missing and the package root is unknown: run `swift build -c \(configuration)` in the package first") }
                progress("the package root is unknown: using \(path) as it is")
                continue
            }
            progress("swift build -c \(configuration) --product \(product)")
            let status = try waitFor(spawn(["/usr/bin/env", "swift", "build", "--package-path", root.path,
                                            "-c", configuration, "--product", product], stdout: 2, stderr: 2))
            guard status == 0 else { throw BenchError("swift build --product \(product) failed (status \(status))") }
        }
        for (_, path) in needed where access(path, R_OK) != 0 {
            throw BenchError("\(path) is missing after the build")
        }
    }
}

// MARK: Processes

/// posix_spawn `argv` (absolute path first, or /usr/bin/env NAME) in a process group of its
/// own, with stdout and stderr on the given descriptors (nil: /dev/null).
func spawn(_ argv: [String], stdout: Int32?, stderr: Int32?,
           environment: [String: String] = ProcessInfo.processInfo.environment) throws -> pid_t {
    do {
        return try Subprocess.spawn(argv, environment: environment, stdout: stdout, stderr: stderr)
    } catch {
        throw BenchError("cannot start \(argv[0]): \(error)")
    }
}

/// Waits for `pid` and returns its exit status (128 + signal when killed).
@discardableResult
func waitFor(_ pid: pid_t) -> Int32 {
    Subprocess.wait(pid).map(Subprocess.exitCode) ?? 127
}

/// Runs a command and returns its stdout (nil when it cannot be started or fails).
func capture(_ argv: [String]) -> String? {
    var fds: [Int32] = [0, 0]
    guard bgtask_pipe_cloexec(&fds) == 0 else { return nil }
    guard let pid = try? spawn(argv, stdout: fds[1], stderr: nil) else {
        close(fds[0]); close(fds[1])
        return nil
    }
    close(fds[1])
    let data = FileHandle(fileDescriptor: fds[0], closeOnDealloc: true).readDataToEndOfFile()
    guard waitFor(pid) == 0 else { return nil }
    return String(decoding: data, as: UTF8.self)
}

/// What /proc says about a process.
enum ProcStat {
    /// A `kB` line of /proc/PID/status, in bytes.
    static func statusBytes(_ pid: pid_t, _ field: String) -> UInt64? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            let number = line.dropFirst(field.count + 1).split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { UInt64($0) }
            return number.map { $0 * 1024 }
        }
        return nil
    }

    static func rss(_ pid: pid_t) -> UInt64? { statusBytes(pid, "VmRSS") }
    static func peakRSS(_ pid: pid_t) -> UInt64? { statusBytes(pid, "VmHWM") }

    /// utime + stime of every thread, in seconds.
    static func cpuSeconds(_ pid: pid_t) -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return nil }
        // After "pid (comm)": state is field 3, utime 14, stime 15.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let utime = Double(fields[11]), let stime = Double(fields[12]) else { return nil }
        return (utime + stime) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Nanoseconds on a CPU of each thread, by thread id (/proc/PID/task/TID/schedstat: far finer
    /// than the 10 ms ticks of /proc/PID/stat).
    static func cpuNanoseconds(_ pid: pid_t) -> [String: UInt64] {
        guard let tids = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [:] }
        var result: [String: UInt64] = [:]
        for tid in tids {
            let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/schedstat", encoding: .utf8)) ?? ""
            if let ns = text.split(separator: " ").first.flatMap({ UInt64($0) }) { result[tid] = ns }
        }
        return result
    }

    /// Context switches (voluntary and not) of each thread, by thread id: how often it woke up.
    static func contextSwitches(_ pid: pid_t) -> [String: UInt64] {
        guard let tids = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [:] }
        var result: [String: UInt64] = [:]
        for tid in tids {
            guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/status", encoding: .utf8) else { continue }
            for line in text.split(separator: "\n") where line.contains("ctxt_switches:") {
                result[tid, default: 0] += line.split(separator: ":").last.flatMap { UInt64($0.trimmingCharacters(in: .whitespaces)) } ?? 0
            }
        }
        return result
    }

    /// The growth between two per-thread readings (a thread that ended in between takes its
    /// share with it: a slight undercount).
    static func growth(from start: [String: UInt64], to end: [String: UInt64]) -> UInt64 {
        end.reduce(0) { total, entry in
            let before = start[entry.key] ?? 0
            return total + (entry.value >= before ? entry.value - before : 0)
        }
    }

    /// Children of `pid` (every thread's), from /proc/PID/task/*/children.
    static func children(of pid: pid_t) -> [pid_t] {
        guard let tids = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [] }
        return tids.flatMap { tid in
            ((try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/children", encoding: .utf8)) ?? "")
                .split(separator: " ").compactMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }
    }

    static func commandLine(_ pid: pid_t) -> String {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return "" }
        return String(decoding: data.map { $0 == 0 ? UInt8(ascii: " ") : $0 }, as: UTF8.self)
    }

    static func threadCount(_ pid: pid_t) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task").count) ?? 0
    }
}

// MARK: A real host

/// A real `bgtask host` process in its own process group, driven over its control socket.
final class HostProcess {
    let plugins: URL
    let state: URL
    let log: URL
    let arguments: [String]
    /// Variables added to this process's environment for the host.
    let environment: [String: String]
    private(set) var pid: pid_t = 0
    /// Seconds from spawn until the control socket answered.
    private(set) var startSeconds: Double = 0

    init(plugins: URL, state: URL, log: URL, arguments: [String], environment: [String: String] = [:]) {
        self.plugins = plugins
        self.state = state
        self.log = log
        self.arguments = arguments
        self.environment = environment
    }

    var client: ControlClient { ControlClient(stateDirectory: state) }

    func start(timeout: TimeInterval = 600) throws {
        let fd = open(log.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        defer { close(fd) }
        var environment = ProcessInfo.processInfo.environment
        environment.removeValue(forKey: "BGTASK_STATE")
        environment.merge(self.environment) { $1 }
        let started = monotonicNs()
        // BGTASK_BENCH_HOST: another build's `bgtask` (its runner beside it) for an A/B run.
        let cli = ProcessInfo.processInfo.environment["BGTASK_BENCH_HOST"].flatMap { $0.isEmpty ? nil : $0 } ?? Products.cli
        pid = try spawn([cli, "host", "--plugins", plugins.path, "--state", state.path] + arguments,
                        stdout: fd, stderr: fd, environment: environment)
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if (try? client.send(.status))?.ok == true {
                startSeconds = seconds(since: started)
                return
            }
            if bgtask_has_exited(pid) != 0 { break }
            usleep(5_000)
        }
        let output = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        stop()
        throw BenchError("the host did not come up: \(output.suffix(2000))")
    }

    /// SIGTERM, wait, then SIGKILL whatever is left in its group.
    func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        waitFor(pid)
        kill(-pid, SIGKILL)
        pid = 0
    }

    /// Host CPU (% of one core) and wake-ups (context switches) per second over `duration` s.
    func idle(for duration: Double) -> (cpuPercent: Double, wakeupsPerSecond: Double) {
        let cpu0 = ProcStat.cpuNanoseconds(pid)
        let switches0 = ProcStat.contextSwitches(pid)
        let t0 = monotonicNs()
        usleep(UInt32(duration * 1_000_000))
        let elapsed = seconds(since: t0)
        let cpu = Double(ProcStat.growth(from: cpu0, to: ProcStat.cpuNanoseconds(pid))) / 1e9
        let switches = Double(ProcStat.growth(from: switches0, to: ProcStat.contextSwitches(pid)))
        return (cpu / elapsed * 100, switches / elapsed)
    }
}

// MARK: Bundles

/// Writes an app bundle for `libBenchPlugin.so` (hard-linked, or copied across file systems).
func makeBenchBundle(at url: URL, identifier: String, permitted: [String], modes: [String] = ["fetch", "processing"]) throws {
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    let library = url.appendingPathComponent("libBenchPlugin.so")
    if link(Products.benchLibrary, library.path) != 0 {
        try FileManager.default.copyItem(atPath: Products.benchLibrary, toPath: library.path)
    }
    let plist: [String: Any] = [
        "CFBundleIdentifier": identifier,
        "CFBundleExecutable": "libBenchPlugin.so",
        "BGTaskSchedulerPermittedIdentifiers": permitted,
        "UIBackgroundModes": modes,
    ]
    let data = try PropertyListSerialization.data(fromPropertyList: plist, format: .xml, options: 0)
    try data.write(to: url.appendingPathComponent("Info.plist"))
}

// MARK: The machine

struct Machine {
    var cores: Int
    var cpu: String
    var kernel: String
    var swift: String
    var memory: String
    var scratch: String
    var scratchDevice: String
    var build: String
    /// /proc/loadavg when the run began: other work on the machine skews every figure.
    var load: String

    static func describe(scratch: URL) -> Machine {
        let cpuinfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model = cpuinfo.split(separator: "\n").first { $0.hasPrefix("model name") }
            .map { String($0.split(separator: ":", maxSplits: 1).last ?? "").trimmingCharacters(in: .whitespaces) } ?? "unknown"
        var names = utsname()
        uname(&names)
        let release = withUnsafeBytes(of: names.release) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
        let swift = capture(["/usr/bin/env", "swift", "--version"])?
            .split(separator: "\n").first { $0.contains("Swift version") }.map(String.init) ?? "unknown"
        let meminfo = (try? String(contentsOfFile: "/proc/meminfo", encoding: .utf8)) ?? ""
        let total = meminfo.split(separator: "\n").first { $0.hasPrefix("MemTotal:") }
            .flatMap { $0.split(separator: " ").dropFirst().first.flatMap { Double($0) } }
        return Machine(
            cores: sysconf(Int32(_SC_NPROCESSORS_ONLN)), cpu: model, kernel: release, swift: swift,
            memory: total.map { String(format: "%.1f GiB", $0 / 1_048_576) } ?? "unknown",
            scratch: scratch.path, scratchDevice: mountOf(scratch.path), build: Products.configuration,
            load: ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "").split(separator: " ").prefix(3).joined(separator: " "))
    }

    /// The file system holding `path` (device and type), from /proc/self/mounts.
    static func mountOf(_ path: String) -> String {
        let mounts = (try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? ""
        var best: (point: String, text: String) = ("", "unknown")
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 3 else { continue }
            let point = String(fields[1])
            if (path == point || path.hasPrefix(point == "/" ? "/" : point + "/")) && point.count >= best.point.count {
                best = (point, "\(fields[0]) (\(fields[2])) on \(point)")
            }
        }
        return best.text
    }
}

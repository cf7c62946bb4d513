import BGTaskHost
import Foundation
import Testing

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

/// Runs the real CLI binary and waits for it (reaping it).
func runCLI(_ arguments: [String], environment: [String: String] = [:]) throws -> CLIResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: Products.cli)
    process.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    for (key, value) in environment { env[key] = value }
    process.environment = env
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Read both pipes to the end before waiting, so a chatty child never blocks on a full pipe.
    let group = DispatchGroup()
    nonisolated(unsafe) var errData = Data()
    group.enter()
    DispatchQueue.global().async {
        errData = err.fileHandleForReading.readDataToEndOfFile()
        group.leave()
    }
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    process.waitUntilExit()
    return CLIResult(status: process.terminationStatus,
                     stdout: String(decoding: outData, as: UTF8.self),
                     stderr: String(decoding: errData, as: UTF8.self))
}

extension RunRecord {
    func task(_ identifier: String) -> TaskRecord? { tasks.first { $0.identifier == identifier } }
}

/// True when a process with this pid exists (and is not a zombie we could reap).
func processExists(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    return stat[stat.index(close, offsetBy: 2)] != "Z"
}

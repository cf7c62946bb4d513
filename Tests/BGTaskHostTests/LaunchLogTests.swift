@testable import BGTaskHost
import BGTaskLaunch
import Foundation
import Glibc
import Testing

/// The launch log's order: the supervisor's lines come after the child's output written before
/// them, and never inside one of the child's lines.
@Suite struct LaunchLogTests {
    private func withLog(_ body: (LaunchLog, Int32) throws -> Void) throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-log-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("L.log").path
        do {
            let log = try LaunchLog(path: path)
            try body(log, log.childEnd)
        }
        return try String(contentsOfFile: path, encoding: .utf8)
    }

    private func write(_ fd: Int32, _ text: String) {
        _ = Array(text.utf8).withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }

    @Test func aLineThatArrivesMidLineWaitsForItsEnd() throws {
        let text = try withLog { log, child in
            write(child, "one\ntw")
            log.append(level: 1, "after one")
            write(child, "o\nthree\n")
            log.drain()
            log.append(level: 2, "after three")
        }
        #expect(text == "one\ntwo\n[bgtask info] after one\nthree\n[bgtask error] after three\n")
    }

    @Test func heldLinesAreKeptWhenTheChildNeverEndsItsLine() throws {
        let text = try withLog { log, child in
            write(child, "unfinished")
            log.append(level: 1, "held")
            log.closeChildEnd()
            log.drain()
            log.finish()
        }
        #expect(text == "unfinished\n[bgtask info] held\n")
    }
}

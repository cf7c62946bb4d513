import BGTaskModel
import Foundation
import Testing

/// A launch's memory and CPU series as its supervisor writes it (`logs/LAUNCH_ID.samples`).
@Suite struct LaunchSamplesTests {
    private static let start: UInt64 = 1_000_000_000

    /// A writer for a launch's log in a directory of its own (removed by the caller), with the
    /// launch's first sample taken 1 ms in: 5 MiB resident, 2 ms of CPU.
    private func writerWithFirstPoint() throws -> (directory: URL, writer: LaunchSamples.Writer) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("samples-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        var writer = LaunchSamples.Writer(log: directory.appendingPathComponent("20261128T000000-0000abcd.log").path)
        writer.sample(resident: 5 << 20, nowNs: Self.start + 1_000_000, startNs: Self.start) { 2_000_000 }
        return (directory, writer)
    }

    /// A launch over within its first second has one point: no file (it would be an inode per
    /// launch saying what the record says).
    @Test func aOnePointSeriesIsNotWritten() throws {
        let (directory, first) = try writerWithFirstPoint()
        var writer = first
        defer { try? FileManager.default.removeItem(at: directory) }
        let start = Self.start
        // More samples within the first second keep no point.
        writer.sample(resident: 6 << 20, nowNs: start + 400_000_000, startNs: start) { 3_000_000 }
        writer.flush()
        #expect(!FileManager.default.fileExists(atPath: writer.path))
        #expect(LaunchSamples.read(writer.path).isEmpty)
    }

    /// From the second point on, the series is written whole, the first point with it, in order.
    @Test func aSeriesOfTwoPointsIsWrittenWithItsFirst() throws {
        let (directory, first) = try writerWithFirstPoint()
        var writer = first
        defer { try? FileManager.default.removeItem(at: directory) }
        let start = Self.start
        writer.sample(resident: 7 << 20, nowNs: start + 1_200_000_000, startNs: start) { nil }
        writer.flush()
        let points = LaunchSamples.read(writer.path)
        #expect(points.map(\.residentBytes) == [5 << 20, 7 << 20], "\(points)")
        #expect(points.first?.cpuMs == 2 && points.last?.cpuMs == nil, "\(points)")
        #expect(points.map(\.ms) == [1, 1200], "\(points)")
        // A later flush appends only what came since.
        writer.sample(resident: 8 << 20, nowNs: start + 2_500_000_000, startNs: start) { 9_000_000 }
        writer.flush()
        #expect(LaunchSamples.read(writer.path).map(\.residentBytes) == [5 << 20, 7 << 20, 8 << 20])
    }
}

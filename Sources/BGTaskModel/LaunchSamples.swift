import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A launch's memory and CPU over time: the supervisor's memory samples, kept beside the
/// launch's log as `logs/LAUNCH_ID.samples` (what the dashboard's launch page draws). One line
/// per point, `MS RESIDENT_BYTES CPU_MS` (milliseconds since the launch began, the app's
/// resident memory as the jetsam check counts it, the app process's CPU time so far, `-` when
/// it could not be read), after a `#` header.
///
/// Points are taken with the memory sampler's samples, at most every `interval(afterNs:)`:
/// a second at first, then a 120th of the time the launch has run, so a launch of an hour has
/// about 460 points and one of a day about 840; never more than `maximumPoints`. Only where
/// the supervisor samples memory (a limit, no cgroup enforcing it): under a cgroup's limit
/// there is no series. Appended with one `open`/`write`/`close` per point, so a thousand
/// running launches hold no descriptor for it.
public enum LaunchSamples {
    public struct Point: Codable, Sendable, Equatable {
        public var ms: Double
        public var residentBytes: UInt64
        public var cpuMs: Double?

        enum CodingKeys: String, CodingKey {
            case ms
            case residentBytes = "resident_bytes"
            case cpuMs = "cpu_ms"
        }

        public init(ms: Double, residentBytes: UInt64, cpuMs: Double?) {
            self.ms = ms
            self.residentBytes = residentBytes
            self.cpuMs = cpuMs
        }
    }

    public static let maximumPoints = 4096
    static let header = "# bgtask samples v1: ms resident_bytes cpu_ms\n"

    /// The samples file of the launch whose log is `logPath` (`….log` → `….samples`).
    public static func path(forLog logPath: String) -> String {
        (logPath.hasSuffix(".log") ? String(logPath.dropLast(4)) : logPath) + ".samples"
    }

    /// How long after a point taken `elapsedNs` into a launch the next one is due.
    public static func interval(afterNs elapsedNs: UInt64) -> UInt64 {
        max(1_000_000_000, elapsedNs / 120)
    }

    /// Appends `point` (the header first when the file is new). Never follows a link; errors
    /// are ignored (a series is a view, not a record).
    public static func append(_ point: Point, to path: String, first: Bool) {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let cpu = point.cpuMs.map { String(format: "%.1f", $0) } ?? "-"
        let line = (first ? header : "") + String(format: "%.0f %llu ", point.ms, point.residentBytes) + cpu + "\n"
        _ = line.utf8CString.withUnsafeBufferPointer { write(fd, $0.baseAddress, $0.count - 1) }
    }

    /// A launch's points as its supervisor takes them: `sample` at each memory sample, which
    /// writes a point when one is due.
    public struct Writer: Sendable {
        public let path: String
        private var nextNs: UInt64 = 0
        private var count = 0

        public init(log: String) { path = LaunchSamples.path(forLog: log) }

        /// `resident` bytes sampled at `nowNs` (monotonic) of a launch begun at `startNs`; the
        /// app's CPU time is read (`cpuNs`) only when a point is written.
        public mutating func sample(resident: UInt64, nowNs: UInt64, startNs: UInt64, cpuNs: () -> UInt64?) {
            guard nowNs >= nextNs, count < maximumPoints, nowNs >= startNs else { return }
            let elapsed = nowNs - startNs
            nextNs = nowNs + interval(afterNs: elapsed)
            append(Point(ms: Double(elapsed) / 1e6, residentBytes: resident, cpuMs: cpuNs().map { Double($0) / 1e6 }), to: path, first: count == 0)
            count += 1
        }
    }

    /// The points of a samples file, at most `maximumPoints` (malformed lines skipped); empty
    /// when there is none.
    public static func read(_ path: String) -> [Point] {
        guard let data = FileManager.default.contents(atPath: path), data.count <= maximumPoints * 64 + 128 else { return [] }
        var points: [Point] = []
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: " ")
            guard fields.count == 3, let ms = Double(fields[0]), ms.isFinite, let bytes = UInt64(fields[1]) else { continue }
            points.append(Point(ms: ms, residentBytes: bytes, cpuMs: Double(fields[2]).flatMap { $0.isFinite ? $0 : nil }))
            if points.count == maximumPoints { break }
        }
        return points
    }
}

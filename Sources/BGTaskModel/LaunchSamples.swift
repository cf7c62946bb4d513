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
/// there is no series. Appended ten points or ten seconds at a time (`Writer`), with one
/// `open`/`write`/`close`, so a thousand running launches hold no descriptor for it. A launch
/// with a single point (over within its first second) has no file.
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

    /// A point's line in the file.
    static func line(_ point: Point) -> String {
        "\(Int64(point.ms.rounded())) \(point.residentBytes) " + (point.cpuMs.map { String(Double(Int64(($0 * 10).rounded())) / 10) } ?? "-") + "\n"
    }

    /// Appends `text`. Never follows a link; errors are ignored (a series is a view, not a
    /// record).
    static func append(_ text: String, to path: String) {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        _ = text.utf8CString.withUnsafeBufferPointer { write(fd, $0.baseAddress, $0.count - 1) }
    }

    /// A launch's points as its supervisor takes them: `sample` at each memory sample, which
    /// keeps a point when one is due; the points are written out every `flushPoints` points or
    /// `flushInterval`, and at the launch's end (`flush`). Written one by one, a point cost
    /// about 30 µs of a supervision loop (the file's open, write and close on ext4): 6 % of the
    /// host's CPU with 1,000 launches sleeping (perf over `bgtask-bench --only scale`).
    public struct Writer: Sendable {
        public let path: String
        private var nextNs: UInt64 = 0
        private var count = 0
        private var pending = ""
        private var pendingCount = 0
        private var flushedAtNs: UInt64 = 0
        static let flushPoints = 10
        static let flushInterval: UInt64 = 10_000_000_000

        public init(log: String) { path = LaunchSamples.path(forLog: log) }

        /// `resident` bytes sampled at `nowNs` (monotonic) of a launch begun at `startNs`; the
        /// app's CPU time is read (`cpuNs`) only when a point is kept.
        public mutating func sample(resident: UInt64, nowNs: UInt64, startNs: UInt64, cpuNs: () -> UInt64?) {
            guard nowNs >= nextNs, count < maximumPoints, nowNs >= startNs else { return }
            let elapsed = nowNs - startNs
            nextNs = nowNs + interval(afterNs: elapsed)
            if count == 0 { (pending, flushedAtNs) = (header, nowNs) }
            pending += line(Point(ms: Double(elapsed) / 1e6, residentBytes: resident, cpuMs: cpuNs().map { Double($0) / 1e6 }))
            (count, pendingCount) = (count + 1, pendingCount + 1)
            if pendingCount >= Self.flushPoints || nowNs >= flushedAtNs + Self.flushInterval {
                flush()
                flushedAtNs = nowNs
            }
        }

        /// Writes out the points kept since the last write (the launch ended, or is suspended).
        /// A series of one point (a launch over within its first second) is not written: the
        /// point says what the record says (its peak memory, its CPU), and its file was an
        /// inode made, and later removed, per launch. On ext4 without a journal, whose inode
        /// allocation skips every inode freed in the last minute, that file's `open` cost up to
        /// a fifth of a resumed app's host CPU (`bgtask-bench --only e2e` under perf; how much
        /// depends on how many files were removed in the last minute).
        public mutating func flush() {
            guard pendingCount > 0, count >= 2 else { return }
            append(pending, to: path)
            (pending, pendingCount) = ("", 0)
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

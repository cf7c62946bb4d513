import Foundation

extension RunRecord {
    /// What a launch cost the device beside its CPU time (`cpu_ms`), as iOS's energy
    /// accounting and MetricKit count it. Counted by the kernel for the launch's processes (its
    /// rusage once reaped, its /proc counters when it is suspended); a resumed process counts
    /// from its resume.
    public struct EnergyRecord: Codable, Sendable, Equatable {
        /// Bytes the launch caused to be written to storage (pages it dirtied in files:
        /// `write_bytes`, `ru_oublock`); what a tmpfs holds is memory, not counted.
        public var diskWrittenBytes: UInt64
        /// Bytes it caused to be read from storage (not from the page cache).
        public var diskReadBytes: UInt64
        /// Times its threads went to sleep and were woken (voluntary context switches): what
        /// iOS counts as wake-ups.
        public var wakeups: UInt64
        /// Bytes its own TCP connections sent and received (payload; retransmissions count as
        /// sent): a lower bound, sampled per socket (`SocketTraffic`). What the host moved for
        /// its background sessions is the transfers'. Nil in records from before they were counted.
        public var networkSentBytes: UInt64?
        public var networkReceivedBytes: UInt64?
        /// The CPU limit it ran under ("80% of a core over 1m"), or why it had none.
        public var cpuLimit: String?

        public init(diskWrittenBytes: UInt64 = 0, diskReadBytes: UInt64 = 0, wakeups: UInt64 = 0, networkSentBytes: UInt64? = nil,
                    networkReceivedBytes: UInt64? = nil, cpuLimit: String? = nil) {
            self.diskWrittenBytes = diskWrittenBytes
            self.networkSentBytes = networkSentBytes
            self.networkReceivedBytes = networkReceivedBytes
            self.diskReadBytes = diskReadBytes
            self.wakeups = wakeups
            self.cpuLimit = cpuLimit
        }

        enum CodingKeys: String, CodingKey {
            case wakeups
            case diskWrittenBytes = "disk_written_bytes", diskReadBytes = "disk_read_bytes", cpuLimit = "cpu_limit"
            case networkSentBytes = "network_sent_bytes", networkReceivedBytes = "network_received_bytes"
        }

        /// ", 1.2 MiB sent, 300 KiB received on its connections" (nothing when none were counted).
        var networkText: String {
            guard let sent = networkSentBytes, let received = networkReceivedBytes, sent > 0 || received > 0 else { return "" }
            return ", \(RunRecord.bytesText(sent)) sent, \(RunRecord.bytesText(received)) received on its connections"
        }
    }
}

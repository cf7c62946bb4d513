import Foundation
import _BGTaskSystemShims
#if canImport(Glibc)
import Glibc
#endif

/// The network bytes an app's own TCP connections moved during one launch (issue 30, energy
/// accounting), beside the bytes the host moves for its background sessions.
///
/// The kernel counts bytes per socket (`tcp_info`), not per process, and forgets a socket when
/// it closes; no per-process network counter exists without a BPF program. So the launch is
/// sampled: the app process's TCP sockets, each read through a duplicate of its descriptor
/// (sockets.c says how, and why not sock_diag). Each socket's last sample counts, less what it had already moved
/// when the launch began (a resumed process's open connections); a socket opened and closed
/// between two samples is not seen. The figure is a lower bound, exact for connections alive at
/// a sample after their last byte: the supervisor samples at most every quarter second while the
/// launch runs (less often as it runs, and without an open socket), when the app says its work
/// is over, and before any kill. UDP (QUIC) has no byte
/// counters in the kernel and is not counted.
public struct SocketTraffic: Sendable, Equatable {
    public struct Bytes: Sendable, Equatable {
        public var sent: UInt64 = 0
        public var received: UInt64 = 0
    }

    /// Per socket inode: what it had moved when first seen in this launch (0 for one opened
    /// during it) and at its latest sample.
    private var first: [UInt64: Bytes] = [:]
    private var last: [UInt64: Bytes] = [:]
    /// The TCP sockets open at the last sample.
    private var open: Set<UInt64> = []
    /// When the last sample was taken (monotonic ns), for the supervisor's pacing.
    public private(set) var sampledAtNs: UInt64 = 0

    /// Sockets followed per launch at most, and read per sample at most (of 512 socket
    /// descriptors looked at): an app that opens more has the rest left out. A bound on the
    /// host's memory and on each sample's time on a supervision loop (about 5 µs a socket),
    /// not on the app.
    public static let socketLimit = 4096
    public static let socketsPerSample = 256

    public init() {}

    /// Whether the last sample found a TCP socket open (the supervisor samples an app without
    /// one less often).
    public var hasOpenSockets: Bool { !open.isEmpty }

    /// The launch's bytes so far.
    public var total: Bytes {
        var total = Bytes()
        for (inode, now) in last {
            let then = first[inode] ?? Bytes()
            total.sent += now.sent > then.sent ? now.sent - then.sent : 0
            total.received += now.received > then.received ? now.received - then.received : 0
        }
        return total
    }

    /// Samples process `pid`'s sockets. `baseline`: the launch begins now (a resumed process),
    /// so what its open sockets moved so far is not this launch's.
    public mutating func sample(_ pid: pid_t, baseline: Bool = false, now: UInt64) {
        sampledAtNs = now
        var sockets = [bgtask_socket_bytes](repeating: bgtask_socket_bytes(), count: Self.socketsPerSample)
        let count = bgtask_process_tcp_bytes(pid, &sockets, Int32(sockets.count))
        guard count >= 0 else { return }
        open = []
        for socket in sockets.prefix(Int(count)) {
            let bytes = Bytes(sent: socket.sent, received: socket.received)
            if last[socket.inode] == nil {
                guard last.count < Self.socketLimit else { continue }
                first[socket.inode] = baseline ? bytes : Bytes()
            }
            last[socket.inode] = bytes
            open.insert(socket.inode)
        }
    }

    /// The next launch of the same (suspended) process: its sockets open at the last sample,
    /// counted from what they had moved then.
    public func continued() -> SocketTraffic {
        var next = SocketTraffic()
        for inode in open {
            next.first[inode] = last[inode]
            next.last[inode] = last[inode]
        }
        next.open = open
        return next
    }
}

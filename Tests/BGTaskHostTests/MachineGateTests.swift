@testable import BGTaskHost
import BGTaskLaunch
import BGTaskSystem
import Foundation
import Testing

/// The two counters that let the supervision of a sleeping launch skip its expensive looks
/// (BGTaskSystem/MachineGate.swift, `MachineGate`): when they say nothing can have changed, nothing has;
/// when they cannot say, the look is done.
@Suite struct MachineGateTests {
    typealias Counters = MachineGate.Counters
    let second: UInt64 = 1_000_000_000

    @Test func theMachinesCountersAreRead() throws {
        let counters = MachineGate.counters(now: bgtask_monotonic_ns_for_tests())
        #expect(counters.sharedBytes != nil, "Shmem of /proc/meminfo")
        let before = try #require(counters.lastPID, "the last pid of /proc/loadavg")
        // A process made since moves it.
        let child = try Subprocess.spawn(["/bin/true"], environment: [:])
        var status: Int32 = 0
        waitpid(child, &status, 0)
        let after = try #require(MachineGate.counters(now: bgtask_monotonic_ns_for_tests() + 10 * 1_000_000).lastPID)
        #expect(after != before)
    }

    @Test func aWalkIsSkippedOnlyWhileNoProcessWasMade() {
        var gate = MachineGate()
        let t0: UInt64 = 100 * second
        #expect(gate.processesMayHaveStarted(at: t0, Counters(sharedBytes: 0, lastPID: 500)), "never walked")
        gate.walked(at: t0, Counters(sharedBytes: 0, lastPID: 500))
        #expect(!gate.processesMayHaveStarted(at: t0 + second / 10, Counters(sharedBytes: 0, lastPID: 500)))
        #expect(gate.processesMayHaveStarted(at: t0 + second / 10, Counters(sharedBytes: 0, lastPID: 501)), "a process was made")
        #expect(gate.processesMayHaveStarted(at: t0 + second / 10, Counters(sharedBytes: 0, lastPID: nil)), "unreadable: walk")
        #expect(gate.processesMayHaveStarted(at: t0 + second, Counters(sharedBytes: 0, lastPID: 500)), "a second since: walk anyway")
    }

    @Test func theSharedMemoryScanWaitsOnlyWhileTheGrowthCannotCrossTheLimit() {
        var gate = MachineGate()
        let t0: UInt64 = 100 * second
        let mib: UInt64 = 1 << 20
        let headroom = 200 * mib
        func due(_ at: UInt64, holding: UInt64 = 0, _ shared: UInt64?) -> Bool {
            gate.sharedMemoryMayMatter(at: at, holding: holding, headroom: headroom, Counters(sharedBytes: shared, lastPID: 1))
        }
        #expect(due(t0, 1000 * mib), "the first look scans")
        #expect(!due(t0 + 1, 1100 * mib), "100 MiB more on the machine cannot take the launch over its limit")
        #expect(due(t0 + 2, 1200 * mib), "200 MiB more could")
        // The machine frees 300 MiB, then grows by the headroom again: measured from the lowest.
        #expect(!due(t0 + 3, 900 * mib))
        #expect(due(t0 + 4, 1100 * mib), "200 MiB over the lowest since the last scan")
        #expect(!due(t0 + 5, 1100 * mib))
        #expect(due(t0 + 6, holding: 1, 1100 * mib), "a launch that holds shared memory is scanned every time")
        #expect(due(t0 + 7, nil), "unreadable: scan")
        #expect(due(t0 + 8 + second, 1100 * mib), "a second since the last scan: scan anyway")
    }
}

/// CLOCK_MONOTONIC, as the supervision reads it.
private func bgtask_monotonic_ns_for_tests() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

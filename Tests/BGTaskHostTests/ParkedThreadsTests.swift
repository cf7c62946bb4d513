@testable import BGTaskHost
import Foundation
import Testing

@Suite struct ParkedThreadsTests {
    /// Jobs one after another reuse one parked thread; a burst starts as many as it needs and
    /// leaves at most `maximumIdle` parked; every job runs once.
    @Test func jobsReuseParkedThreadsAndABurstLeavesFewBehind() {
        let pool = ParkedThreads(name: "test.parked", maximumIdle: 2)
        let ran = LockedValue([Int]())
        let threads = LockedValue(Set<String>())
        for index in 0..<20 {
            let done = DispatchSemaphore(value: 0)
            pool.run {
                ran.withLock { $0.append(index) }
                threads.withLock { _ = $0.insert("\(pthread_self())") }
                done.signal()
            }
            done.wait()
            // The thread parks after its job: wait until it has.
            for _ in 0..<500 where pool.counts.idle == 0 { usleep(1000) }
        }
        #expect(ran.withLock { $0 } == Array(0..<20))
        #expect(pool.counts.started == 1, "one thread served twenty jobs one after another: \(pool.counts)")
        #expect(threads.withLock { $0.count } == 1)

        // Ten at once, each held until all have started: ten threads, two parked after.
        let release = DispatchSemaphore(value: 0)
        let group = DispatchGroup()
        for _ in 0..<10 {
            group.enter()
            pool.run {
                release.wait()
                group.leave()
            }
        }
        for _ in 0..<10 { release.signal() }
        #expect(group.wait(timeout: .now() + 30) == .success)
        for _ in 0..<500 where pool.counts.idle < 2 { usleep(1000) }
        #expect(pool.counts.started == 10, "\(pool.counts)")
        #expect(pool.counts.idle == 2, "\(pool.counts)")
    }
}

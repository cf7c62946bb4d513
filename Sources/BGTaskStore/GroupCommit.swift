import Foundation

/// Group commit: writes that arrive while a commit is in progress are gathered and run in the
/// next transaction together, so N concurrent callers pay for one sync instead of N.
///
/// No thread of its own (leader/followers): a caller that finds no commit in progress becomes
/// the leader, takes every queued write, runs `commit` on them and hands each its outcome; the
/// others sleep until theirs arrives or until they become the leader of the next group. A lone
/// caller therefore commits at once, with no hand-off to another thread.
package final class GroupCommit<Work, Outcome>: @unchecked Sendable {
    /// One caller's writes, and their outcomes once committed.
    private final class Entry {
        let works: [Work]
        var outcomes: [Outcome]?
        init(_ works: [Work]) { self.works = works }
    }

    private let condition = NSCondition()
    private var queued: [Entry] = []
    private var leading = false
    private var counters = (writes: 0, commits: 0, largest: 0)

    /// How many writes and commits so far, and the largest group (for tests and the benchmark).
    package var statistics: (writes: Int, commits: Int, largestGroup: Int) {
        condition.withLock { (counters.writes, counters.commits, counters.largest) }
    }

    /// Runs `works` (in order, all in the same group) and returns their outcomes. `commit` gets
    /// the group's works in arrival order and returns one outcome for each, in that order; it
    /// runs on the leader's thread with no lock held.
    package func perform(_ works: [Work], commit: ([Work]) -> [Outcome]) -> [Outcome] {
        guard !works.isEmpty else { return [] }
        let entry = Entry(works)
        condition.lock()
        defer { condition.unlock() }
        queued.append(entry)
        while entry.outcomes == nil {
            if leading {
                condition.wait()
                continue
            }
            leading = true
            let group = queued
            queued = []
            condition.unlock()
            let outcomes = commit(group.flatMap(\.works))
            condition.lock()
            precondition(outcomes.count == group.reduce(0) { $0 + $1.works.count }, "a group commit must give one outcome per write")
            // Outcomes are published under the lock: followers read them under it.
            var next = outcomes[...]
            for member in group {
                member.outcomes = Array(next.prefix(member.works.count))
                next = next.dropFirst(member.works.count)
            }
            counters.writes += outcomes.count
            counters.commits += 1
            counters.largest = max(counters.largest, outcomes.count)
            leading = false
            condition.broadcast()
        }
        return entry.outcomes!
    }
}

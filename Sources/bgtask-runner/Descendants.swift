import BGTaskProcesses
import Glibc
import _BGTaskSystemShims

/// SIGKILLs every descendant of this process (it is their child subreaper), repeating until
/// none is left, and reaps the direct children. Called once all tasks have ended. Returns
/// whether there were any.
///
/// A runner with no child has no descendant (orphans are re-parented to it), and most
/// launches start none: that is asked of `waitid` first, so the usual launch reads nothing
/// from /proc (every /proc/PID entry it creates makes the host's reap of it slower).
@discardableResult
func killDescendants() -> Bool {
    guard bgtask_has_children() != 0 else { return false }
    for _ in 0..<64 {
        let pids = ProcessTree.descendants(of: getpid())
        if pids.isEmpty { break }
        for pid in pids { kill(pid, SIGKILL) }
        for pid in ProcessTree.children(of: getpid()) {
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
    }
    return true
}

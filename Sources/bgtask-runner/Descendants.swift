import BGTaskSystem
import Glibc
import _BGTaskSystemShims

/// SIGKILLs every descendant of this process (it is their child subreaper), repeating until
/// none is left, and reaps the direct children. Called once all tasks have ended. Returns
/// whether there were any.
///
/// A runner with no child has no descendant (orphans are re-parented to it), and most
/// launches start none: that is asked of `waitid` first, so the usual launch reads nothing
/// from /proc (every /proc/PID entry it creates makes the host's reap of it slower).
///
/// Under Landlock's signal scoping the launch may signal only its own processes, and may read
/// no other process's /proc entry: `kill(-1)` (every process it may signal but itself) is then
/// exactly its descendants, and `waitpid(-1)` reaps them as they come back to it.
@discardableResult
func killDescendants() -> Bool {
    guard bgtask_has_children() != 0 else { return false }
    if Sandbox.signalsScoped {
        for _ in 0..<64 {
            kill(-1, SIGKILL)
            var status: Int32 = 0
            while waitpid(-1, &status, WNOHANG) > 0 {}
            if bgtask_has_children() == 0 { break }
            usleep(1_000)
        }
        return true
    }
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

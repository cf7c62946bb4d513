import BGTaskProcesses
import Glibc

/// SIGKILLs every descendant of this process (it is their child subreaper), repeating until
/// none is left, and reaps the direct children. Called once all tasks have ended.
func killDescendants() {
    for _ in 0..<64 {
        let pids = ProcessTree.descendants(of: getpid())
        if pids.isEmpty { return }
        for pid in pids { kill(pid, SIGKILL) }
        for pid in ProcessTree.children(of: getpid()) {
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
    }
}

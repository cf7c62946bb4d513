import Foundation
import Glibc

/// SIGKILLs every descendant of this process (it is their child subreaper), repeating until
/// none is left, and reaps the direct children. Called once all tasks have ended.
func killDescendants() {
    for _ in 0..<64 {
        let pids = descendants(of: getpid())
        if pids.isEmpty { return }
        for pid in pids { kill(pid, SIGKILL) }
        for pid in children(of: getpid()) {
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
    }
}

private func descendants(of root: pid_t) -> [pid_t] {
    var result: [pid_t] = []
    var queue = children(of: root)
    while !queue.isEmpty {
        let pid = queue.removeFirst()
        result.append(pid)
        queue.append(contentsOf: children(of: pid))
    }
    return result
}

private func children(of pid: pid_t) -> [pid_t] {
    let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return threads.flatMap { tid -> [pid_t] in
        let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/children", encoding: .utf8)) ?? ""
        return text.split(separator: " ").compactMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }
}

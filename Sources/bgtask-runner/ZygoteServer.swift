import BGTaskWire
import Foundation
import Glibc
import _BGTaskSystemShims

/// `bgtask-runner --zygote`: a launcher the host starts once and asks to fork one child per
/// launch, so a launch costs a fork instead of an exec and a Swift runtime start-up.
///
/// Protocol on fd 3 (SOCK_SEQPACKET): the zygote first sends `ready N` (N: its thread count;
/// the host uses it only if N is 1). Each request is one packet of environment overrides
/// (`KEY=VALUE` separated by NULs) carrying three descriptors (SCM_RIGHTS): the launch
/// channel, stdin, and the log for stdout and stderr. The zygote answers `pid P` or
/// `error TEXT`. End of stream: the host is gone, and so is the zygote.
///
/// The zygote must stay single-threaded: nothing here may start a thread (no Dispatch queues,
/// no Foundation run loops). The child it forks (with CLONE_PARENT, so the host is the child's
/// parent) returns from `serve()` and becomes an ordinary runner.
enum ZygoteServer {
    static func serve() {
        let control: Int32 = 3
        warmUp()
        reply(control, "ready \(bgtask_thread_count())")
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            var fds: [Int32] = [-1, -1, -1]
            var count: Int32 = 3
            let received = buffer.withUnsafeMutableBytes { raw in
                bgtask_recv_fds(control, &fds, &count, raw.baseAddress, raw.count)
            }
            if received <= 0 { _exit(0) }
            let received3 = Int(count) == 3
            guard received3 else {
                for fd in fds.prefix(Int(count)) { close(fd) }
                reply(control, "error expected 3 descriptors, got \(count)")
                continue
            }
            let environment = buffer[0..<received].split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            let pid = bgtask_clone_parent()
            if pid == 0 {
                becomeLaunch(channel: fds[0], stdin: fds[1], log: fds[2], environment: environment)
                return
            }
            for fd in fds { close(fd) }
            reply(control, pid > 0 ? "pid \(pid)" : "error clone: \(String(cString: strerror(errno)))")
        }
    }

    /// In the child: descriptors 0-3 as a spawned runner has them, nothing else; its own process
    /// group; default signals; the launch's environment.
    private static func becomeLaunch(channel: Int32, stdin: Int32, log: Int32, environment: [String]) {
        setpgid(0, 0)
        bgtask_reset_signals()
        dup2(stdin, 0)
        dup2(log, 1)
        dup2(log, 2)
        dup2(channel, 3) // replaces this process's copy of the zygote's socket
        bgtask_close_from(4)
        for entry in environment {
            guard let equals = entry.firstIndex(of: "=") else { continue }
            setenv(String(entry[..<equals]), String(entry[entry.index(after: equals)...]), 1)
        }
    }

    /// Touches what every launch uses, so children inherit it ready: the JSON coders and the
    /// message types' metadata. Starts no thread.
    private static func warmUp() {
        let assignment = LaunchAssignment(
            launchID: "", role: .background, bundleIdentifier: "a.b", bundlePath: "", executablePath: "",
            dataDirectory: "", permittedIdentifiers: [], tasks: [TaskAssignment(task: 1, identifier: "a.b", kind: .refresh)],
            mappedHandlers: [])
        if let data = try? JSONEncoder().encode(ParentMessage.start(assignment)) {
            _ = try? JSONDecoder().decode(ParentMessage.self, from: data)
        }
        if let data = try? JSONEncoder().encode(ChildMessage.taskCompleted(task: 1, success: true, at: 0)) {
            _ = try? JSONDecoder().decode(ChildMessage.self, from: data)
        }
    }

    private static func reply(_ fd: Int32, _ text: String) {
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }
}

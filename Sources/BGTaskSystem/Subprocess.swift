import Foundation
import _BGTaskSystemShims
#if canImport(Glibc)
import Glibc
#endif

/// Starting and waiting for child processes, one way for the host, the bench and the tests.
public enum Subprocess {
    /// posix_spawn of `argv[0]` (an absolute path) as the leader of a new process group, with
    /// `stdin`, `stdout`, `stderr` as 0-2 (nil: /dev/null), `descriptor3` as 3 (nil: none),
    /// every other descriptor closed, no signal blocked and every signal at its default.
    public static func spawn(_ argv: [String], environment: [String: String],
                             stdin: Int32? = nil, stdout: Int32? = nil, stderr: Int32? = nil,
                             descriptor3: Int32? = nil) throws(SystemError) -> pid_t {
        let null = open("/dev/null", O_RDWR | O_CLOEXEC)
        guard null >= 0 else { throw SystemError("open /dev/null", errno: errno) }
        defer { close(null) }
        var pid: pid_t = 0
        let rc = withCStrings(argv) { cArgv in
            withCStrings(environment.map { "\($0.key)=\($0.value)" }) { cEnvp in
                bgtask_spawn(argv[0], cArgv, cEnvp, descriptor3 ?? -1, stdin ?? null, stdout ?? null, stderr ?? null, &pid)
            }
        }
        guard rc == 0 else { throw SystemError("posix_spawn", path: argv[0], errno: rc) }
        return pid
    }

    /// Waits for the child `pid` (EINTR retried) and returns its wait status, or nil when it is
    /// not this process's child (already reaped).
    public static func wait(_ pid: pid_t, usage: UnsafeMutablePointer<rusage>? = nil) -> Int32? {
        var status: Int32 = 0
        return retryingEINTR { bgtask_wait4(pid, &status, 0, usage) } == pid ? status : nil
    }

    /// An exit code for a wait status: its exit status, or 128 + the signal that ended it.
    public static func exitCode(_ status: Int32) -> Int32 {
        bgtask_wifexited(status) != 0 ? bgtask_wexitstatus(status) : 128 + bgtask_wtermsig(status)
    }
}

/// Lends `strings` as a NULL-terminated C array (argv, envp) for the duration of `body`.
public func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    let pointers = strings.map { strdup($0) } + [nil]
    defer { pointers.forEach { free($0) } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}

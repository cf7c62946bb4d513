#if canImport(Glibc)
import Glibc
#endif

/// Runs a system call, retrying on EINTR, and turns -1 into a `BGTaskError` that names the
/// call (the swift-system `valueOrErrno` / NIO `syscall(where:)` pattern).
@discardableResult
func syscall<T: FixedWidthInteger>(_ name: String, _ body: () -> T) throws(BGTaskError) -> T {
    while true {
        let result = body()
        if result != -1 { return result }
        let error = errno
        if error == EINTR { continue }
        throw BGTaskError(.system, errno: error, "\(name) failed")
    }
}

/// Signal names as `kill -l` prints them, for run records.
enum SignalName {
    static func of(_ signal: Int32) -> String {
        switch signal {
        case SIGHUP: "SIGHUP"
        case SIGINT: "SIGINT"
        case SIGQUIT: "SIGQUIT"
        case SIGILL: "SIGILL"
        case SIGTRAP: "SIGTRAP"
        case SIGABRT: "SIGABRT"
        case SIGBUS: "SIGBUS"
        case SIGFPE: "SIGFPE"
        case SIGKILL: "SIGKILL"
        case SIGUSR1: "SIGUSR1"
        case SIGSEGV: "SIGSEGV"
        case SIGUSR2: "SIGUSR2"
        case SIGPIPE: "SIGPIPE"
        case SIGALRM: "SIGALRM"
        case SIGTERM: "SIGTERM"
        case SIGXCPU: "SIGXCPU"
        case SIGXFSZ: "SIGXFSZ"
        case SIGSYS: "SIGSYS"
        default: "SIG\(signal)"
        }
    }
}

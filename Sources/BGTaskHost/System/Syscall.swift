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

/// `mkdir -p`: creates `path` and any missing parents (mode 0755). One `mkdir` call when the
/// directory exists already, which is the case for every launch but an app's first.
func makeDirectories(_ path: String) throws(BGTaskError) {
    if mkdir(path, 0o755) == 0 { return }
    switch errno {
    case EEXIST:
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw BGTaskError(.system, file: path, "exists and is not a directory")
        }
    case ENOENT:
        let parent = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        guard !parent.isEmpty, parent != path else { throw BGTaskError(.system, file: path, errno: ENOENT, "cannot create the directory") }
        try makeDirectories(parent)
        if mkdir(path, 0o755) != 0 && errno != EEXIST { throw BGTaskError(.system, file: path, errno: errno, "cannot create the directory") }
    default:
        throw BGTaskError(.system, file: path, errno: errno, "cannot create the directory")
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

#if canImport(Glibc)
import Glibc
#endif

/// A system call that failed: which, on what, and its errno. The system layer's one error;
/// each module above it says what it means in its own terms (the host: `BGTaskError`).
public struct SystemError: Error, CustomStringConvertible, Equatable, Sendable {
    public var operation: String
    public var path: String?
    public var errno: Int32

    public init(_ operation: String, path: String? = nil, errno: Int32) {
        self.operation = operation
        self.path = path
        self.errno = errno
    }

    public var description: String {
        "\(path.map { "\($0): " } ?? "")\(operation): \(String(cString: strerror(errno)))"
    }
}

/// Runs `body` again while it fails with EINTR (-1 and errno EINTR), and returns what it
/// returned last: for calls whose other failures the caller handles itself.
@inline(__always)
public func retryingEINTR<T: FixedWidthInteger>(_ body: () -> T) -> T {
    while true {
        let result = body()
        if result == -1 && errno == EINTR { continue }
        return result
    }
}

/// Runs a system call, retrying on EINTR, and turns -1 into a `SystemError` that names the call
/// (the swift-system `valueOrErrno` / NIO `syscall(where:)` pattern).
@discardableResult
public func valueOrErrno<T: FixedWidthInteger>(_ operation: String, path: String? = nil, _ body: () -> T) throws(SystemError) -> T {
    let result = retryingEINTR(body)
    if result == -1 { throw SystemError(operation, path: path, errno: errno) }
    return result
}

/// Directories, made the same way everywhere.
public enum Directories {
    /// `mkdir -p`: creates `path` and any missing parents with `mode`. One `mkdir` call when
    /// the directory exists already (every launch's container but an app's first).
    /// `syncingParents`: each parent whose entries changed is fsynced, so a new directory
    /// survives a crash (what a database's directory needs). Throws for the path that could
    /// not be made (`exists and is not a directory` is ENOTDIR).
    public static func make(_ path: String, mode: mode_t = 0o755, syncingParents: Bool = false) throws(SystemError) {
        if mkdir(path, mode) == 0 {
            if syncingParents { syncParent(of: path) }
            return
        }
        switch errno {
        case EEXIST:
            var info = stat()
            guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
                throw SystemError("mkdir", path: path, errno: ENOTDIR)
            }
        case ENOENT:
            let parent = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
            guard !parent.isEmpty, parent != path else { throw SystemError("mkdir", path: path, errno: ENOENT) }
            try make(parent, mode: mode, syncingParents: syncingParents)
            if mkdir(path, mode) != 0 && errno != EEXIST { throw SystemError("mkdir", path: path, errno: errno) }
            if syncingParents { syncParent(of: path) }
        default:
            throw SystemError("mkdir", path: path, errno: errno)
        }
    }

    /// fsync of the directory holding `path` (its new entry made durable). Best effort.
    public static func syncParent(of path: String) {
        let parent = path.lastIndex(of: "/").map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        let fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = retryingEINTR { fsync(fd) }
        close(fd)
    }
}

/// Signal names as `kill -l` prints them, for run records.
public enum SignalName {
    public static func of(_ signal: Int32) -> String {
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

/// A loopback TCP port nothing listens on now: port 0 bound on 127.0.0.1, read back, closed.
/// Whoever binds it next gets it (unless another process is quicker); a port that refuses
/// connections, for tests, or one to hand a server that takes its port on its command line.
public func unusedLoopbackPort() throws(SystemError) -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw SystemError("socket", errno: errno) }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw SystemError("bind 127.0.0.1:0", errno: errno) }
    return Int(UInt16(bigEndian: address.sin_port))
}

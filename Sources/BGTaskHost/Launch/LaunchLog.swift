import Glibc
import _BGTaskSystemShims

/// A launch's log, `logs/LAUNCH_ID.log`: the child's stdout and stderr, which reach it through a
/// pipe the supervisor drains, and the supervisor's own lines (registration refusals, the
/// plugin's `log` calls), in the order they happened.
///
/// The file is created at its first byte: a launch that writes nothing leaves no file and
/// costs no inode. (An inode is not free: ext4 without a journal skips every inode deleted in
/// the last minute when it allocates one, which with logs pruned as launches end cost up to a
/// millisecond of the supervisor's time per launch.)
final class LaunchLog {
    let path: String
    /// The pipe's write end, for the child's descriptors 1 and 2 (until `closeChildEnd`).
    private(set) var childEnd: Int32
    /// The pipe's read end (non-blocking), -1 once the child side is closed for good.
    private(set) var readEnd: Int32
    private var file: Int32 = -1
    /// Why the file could not be written, once (then the log's bytes are dropped).
    private(set) var failure: String?
    private var buffer: [UInt8] = []

    init(path: String) throws(BGTaskError) {
        self.path = path
        var fds: [Int32] = [-1, -1]
        try syscall("pipe2") { bgtask_pipe_cloexec(&fds) }
        readEnd = fds[0]
        childEnd = fds[1]
        _ = fcntl(readEnd, F_SETFL, fcntl(readEnd, F_GETFL) | O_NONBLOCK)
    }

    deinit {
        closeChildEnd()
        if readEnd >= 0 { close(readEnd) }
        if file >= 0 { close(file) }
    }

    /// Whether anything was written (the file exists).
    var written: Bool { file >= 0 }

    /// Once the child has its copy.
    func closeChildEnd() {
        if childEnd >= 0 { close(childEnd) }
        childEnd = -1
    }

    /// Moves what the pipe holds into the file. Returns false once every writer is gone (the
    /// read end is then closed).
    @discardableResult
    func drain() -> Bool {
        guard readEnd >= 0 else { return false }
        // Not zeroed: read() fills what is used (a launch that prints nothing costs no memset).
        if buffer.isEmpty { buffer = [UInt8](unsafeUninitializedCapacity: 64 * 1024) { $1 = $0.count } }
        while true {
            let n = buffer.withUnsafeMutableBytes { read(readEnd, $0.baseAddress, $0.count) }
            if n > 0 {
                buffer.withUnsafeBytes { write(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                continue
            }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return true }
            close(readEnd)
            readEnd = -1
            return false
        }
    }

    /// A line of the supervisor's, tagged with its level (`[bgtask error] ...`).
    func append(level: Int32, _ text: String) {
        // The child's output before it, first: it was written first.
        drain()
        let tag = level >= 2 ? "error" : level == 1 ? "info" : "debug"
        Array("[bgtask \(tag)] \(text)\n".utf8).withUnsafeBytes { write($0) }
    }

    private func write(_ bytes: UnsafeRawBufferPointer) {
        if file < 0 {
            guard failure == nil else { return }
            file = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o640)
            guard file >= 0 else {
                failure = "\(path): \(String(cString: strerror(errno)))"
                return
            }
        }
        var offset = 0
        while offset < bytes.count {
            let n = Glibc.write(file, bytes.baseAddress! + offset, bytes.count - offset)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                failure = "\(path): \(String(cString: strerror(errno)))"
                return
            }
            offset += n
        }
    }
}

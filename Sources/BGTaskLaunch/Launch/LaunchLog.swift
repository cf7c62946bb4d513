import BGTaskControl
import BGTaskSystem
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
///
/// Bounded twice: the file keeps at most `limit` bytes (what comes after is read and discarded,
/// and counted in `droppedBytes`, which the record reports), and one `drain` reads at most
/// `drainBudget` bytes, so a launch writing as fast as it can does not keep the supervisor's
/// loop from its deadlines (expiry, the watchdog): the loop comes back for the rest.
///
/// The file is the host's, in a directory a launch may be able to write: it is made new
/// (`O_EXCL`, mode 0600) and never through a link, so nothing a launch put at its path (a
/// symlink, a hard link, a FIFO, a file) is ever followed, appended to or opened.
///
/// Whose lines they are is the host's word, not the child's: the file's first line, written
/// as the file is made and before any byte of the child's, is the host's header naming the
/// launch's app and launch (`LaunchLogHeader`), and readers take an entry's app from it, never
/// from the line (which the child writes, in any format it likes).
package final class LaunchLog {
    package let path: String
    /// The most the file keeps, in bytes.
    package let limit: UInt64
    /// The pipe's write end, for the child's descriptors 1 and 2 (until `closeChildEnd`).
    package private(set) var childEnd: Int32
    /// The pipe's read end (non-blocking), -1 once the child side is closed for good.
    package private(set) var readEnd: Int32
    private var file: Int32 = -1
    /// Why the file could not be written, once (then the log's bytes are dropped).
    package private(set) var failure: String?
    /// Bytes that could not be written (the disk was full).
    package private(set) var lostBytes: UInt64 = 0
    /// The log took its grant from the host's reserve for logs (once per launch).
    private var grantTaken = false
    /// The host's reserve beside the log's directory (`STATE/logs` → `STATE/reserve`).
    private var reserveDirectory: String? {
        guard let slash = path.lastIndex(of: "/") else { return nil }
        let directory = path[..<slash]
        guard let parent = directory.lastIndex(of: "/") else { return nil }
        return String(path[..<parent]) + "/reserve"
    }
    private var buffer: [UInt8] = []
    /// Bytes written to the file.
    package private(set) var keptBytes: UInt64 = 0
    /// Bytes read past `limit` and discarded.
    package private(set) var droppedBytes: UInt64 = 0
    /// The child's output kept so far ends inside a line (a partial write, or stdio's buffer
    /// flushed mid-line).
    private var midLine = false
    /// The supervisor's lines that came while the child was inside a line: they go in after the
    /// line ends, so that no line of the child's is cut in two.
    private var heldLines: [UInt8] = []
    /// The host's first line (`LaunchLogHeader.line`), nil for none.
    private let header: String?

    /// The most the supervisor's lines may wait for the child to end its line: past it the
    /// child's line is cut (a newline is put in) and they go in, so a child that never ends a
    /// line while it sends `log` calls cannot grow the host's memory.
    package static let heldLinesLimit = 1 << 20

    /// What one `drain()` reads at most: a few reads' worth (well under a millisecond).
    package static let drainBudget = 256 * 1024
    /// What the last drain, after the launch's processes are gone, reads at most: whatever a
    /// pipe can hold (1 MiB at most, unless raised by root), with room to spare, yet bounded if
    /// something that escaped the launch still writes.
    package static let finalDrainBytes = 16 << 20

    package init(path: String, limit: UInt64 = LaunchLimits.defaultLogLimitBytes, header: LaunchLogHeader? = nil) throws(BGTaskError) {
        self.path = path
        self.limit = limit
        self.header = header?.line
        var fds: [Int32] = [-1, -1]
        try syscall("pipe2") { bgtask_pipe_cloexec(&fds) }
        readEnd = fds[0]
        childEnd = fds[1]
        _ = fcntl(readEnd, F_SETFL, fcntl(readEnd, F_GETFL) | O_NONBLOCK)
    }

    /// The log of a launch that resumes a kept process: the process's stdout and stderr are the
    /// pipe it already has (`readEnd`, taken over from the previous launch's log).
    package init(path: String, limit: UInt64, header: LaunchLogHeader?, adopting readEnd: Int32) {
        self.path = path
        self.limit = limit
        self.header = header?.line
        self.readEnd = readEnd
        childEnd = -1
    }

    /// Gives up the pipe's read end (the process stays, suspended, and its next launch's log
    /// takes the pipe over): after what is in the pipe was drained, the file is finished and
    /// the read end is the caller's to keep.
    package func detachReadEnd() -> Int32 {
        let fd = readEnd
        readEnd = -1
        return fd
    }

    deinit {
        finish()
        closeChildEnd()
        if readEnd >= 0 { close(readEnd) }
        if file >= 0 { close(file) }
    }

    /// Whether anything was written (the file exists).
    package var written: Bool { file >= 0 }

    /// Whether output was discarded past `limit`.
    package var truncated: Bool { droppedBytes > 0 }

    /// Once the child has its copy.
    package func closeChildEnd() {
        if childEnd >= 0 { close(childEnd) }
        childEnd = -1
    }

    /// Moves what the pipe holds into the file, `budget` bytes at most. Returns false once every
    /// writer is gone (the read end is then closed).
    @discardableResult
    package func drain(budget: Int = LaunchLog.drainBudget) -> Bool {
        guard readEnd >= 0 else { return false }
        // Not zeroed: read() fills what is used (a launch that prints nothing costs no memset).
        if buffer.isEmpty { buffer = [UInt8](unsafeUninitializedCapacity: 64 * 1024) { $1 = $0.count } }
        var left = budget
        while left > 0 {
            let n = retryingEINTR { buffer.withUnsafeMutableBytes { read(readEnd, $0.baseAddress, min($0.count, left)) } }
            if n > 0 {
                left -= n
                buffer.withUnsafeBytes { keepChild(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                continue
            }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return true }
            close(readEnd)
            readEnd = -1
            finish()
            return false
        }
        return true
    }

    /// A line of the supervisor's, tagged with its level (`[bgtask error] ...`): after the
    /// child's output that came before it, and never inside one of the child's lines (held until
    /// the line ends when the child was in the middle of one).
    package func append(level: Int32, _ text: String) {
        // The child's output before it, first: it was written first.
        drain()
        let tag = level >= 2 ? "error" : level == 1 ? "info" : "debug"
        let line = Array("[bgtask \(tag)] \(text)\n".utf8)
        if midLine && readEnd >= 0 && heldLines.count + line.count > Self.heldLinesLimit {
            Array("\n".utf8).withUnsafeBytes { keep($0) }
            midLine = false
            flushHeld()
            line.withUnsafeBytes { keep($0) }
        } else if midLine && readEnd >= 0 {
            heldLines += line
        } else {
            line.withUnsafeBytes { keep($0) }
        }
    }

    /// The child's output, with held lines let in at the end of the line they waited for.
    private func keepChild(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        var rest = bytes
        if !heldLines.isEmpty, let newline = bytes.firstIndex(of: UInt8(ascii: "\n")) {
            keep(UnsafeRawBufferPointer(rebasing: bytes[...newline]))
            midLine = false
            flushHeld()
            rest = UnsafeRawBufferPointer(rebasing: bytes[(newline + 1)...])
            if rest.isEmpty { return }
        }
        keep(rest)
        midLine = rest.last != UInt8(ascii: "\n")
    }

    private func flushHeld() {
        guard !heldLines.isEmpty else { return }
        let held = heldLines
        heldLines = []
        held.withUnsafeBytes { keep($0) }
    }

    /// Lets in the held lines once the child's output has ended (its last line unfinished: they
    /// start a line of their own). Call before the record is made.
    package func finish() {
        guard !heldLines.isEmpty else { return }
        if midLine {
            Array("\n".utf8).withUnsafeBytes { keep($0) }
            midLine = false
        }
        flushHeld()
    }

    /// Writes what fits under `limit` and counts the rest; the first time output is cut, a line
    /// in the file says so.
    private func keep(_ bytes: UnsafeRawBufferPointer) {
        let room = keptBytes < limit ? Int(min(UInt64(bytes.count), limit - keptBytes)) : 0
        if room > 0 {
            write(UnsafeRawBufferPointer(rebasing: bytes[0..<room]))
            keptBytes += UInt64(room)
        }
        guard room < bytes.count else { return }
        if droppedBytes == 0 {
            Array("\n[bgtask error] log truncated at its limit of \(limit) bytes: later output is discarded (the run record's log_bytes_dropped counts it)\n".utf8)
                .withUnsafeBytes { write($0) }
        }
        droppedBytes += UInt64(bytes.count - room)
    }

    private func write(_ bytes: UnsafeRawBufferPointer) {
        if file < 0 {
            if failure == nil { file = create() }
            guard file >= 0 else {
                lostBytes += UInt64(bytes.count)
                return
            }
        }
        var offset = 0
        while offset < bytes.count {
            let n = retryingEINTR { Glibc.write(file, bytes.baseAddress! + offset, bytes.count - offset) }
            guard n > 0 else {
                let error = errno
                // The disk is full (another app filled it): the log takes its one grant from
                // the host's reserve for logs, and the write is tried again (see StoreReserve).
                if (error == ENOSPC || error == EDQUOT), !grantTaken, let reserve = reserveDirectory {
                    grantTaken = true
                    if StoreReserve.grantLogSpace(reserve: reserve, to: file, at: Int64(lseek(file, 0, SEEK_CUR))) { continue }
                }
                if failure == nil { failure = "\(path): \(String(cString: strerror(error)))" }
                lostBytes += UInt64(bytes.count - offset)
                return
            }
            offset += n
        }
    }

    /// Makes the file: new (`O_EXCL`: nothing at the path is opened, a FIFO included), never
    /// through a symlink (the name or its directory), owner-only. Whatever a launch planted at
    /// the name (it knows its launch id) is removed first (`unlinkat` removes a link, not its
    /// target), once. -1, with `failure` set, when the file cannot be made.
    private func create() -> Int32 {
        let slash = path.lastIndex(of: "/")
        let directory = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard directoryFD >= 0 else {
            failure = "\(directory): \(String(cString: strerror(errno))) (a log directory that is a symlink is not followed)"
            return -1
        }
        defer { close(directoryFD) }
        for attempt in 0..<2 {
            let fd = openat(directoryFD, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if fd >= 0 {
                // The header first: whose log this is, before any byte of the child's.
                if let header {
                    let bytes = Array((header + "\n").utf8)
                    var offset = 0
                    while offset < bytes.count {
                        let n = retryingEINTR { bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) } }
                        guard n > 0 else { break }
                        offset += n
                    }
                }
                return fd
            }
            let error = errno
            if error == ENOSPC || error == EDQUOT {
                // No inode left (an app made files until there was none): one of the host's
                // spare inodes, beside the logs (`StoreReserve`), takes the log's name.
                if let reserve = reserveDirectory {
                    let spare = StoreReserve.takeSpareInode(reserve: reserve, into: directoryFD, name: name)
                    if spare >= 0 { return spare }
                }
            }
            guard error == EEXIST, attempt == 0 else {
                failure = "\(path): \(String(cString: strerror(error)))"
                return -1
            }
            unlinkat(directoryFD, name, 0)
        }
        return -1
    }
}

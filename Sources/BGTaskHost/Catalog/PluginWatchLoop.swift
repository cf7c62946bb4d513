import BGTaskControl
import BGTaskSystem
import Foundation
import _BGTaskSystemShims
#if canImport(Glibc)
import Glibc
#endif

/// The inside of `PluginDirectoryWatcher`: one inotify descriptor with a watch on the plugin
/// directory and on each bundle in it (and its `PlugIns/` and each `.appex` there), a stop pipe,
/// and the loop that polls both on the watcher's thread.
///
/// Thread safety: `watches`, `paths` and `onChange` belong to the loop thread once `run()`
/// starts (the initializer fills them before the thread exists); `stopRequested` and
/// `loopThread` are guarded by `lock`.
final class PluginWatchLoop: @unchecked Sendable {
    /// What a watched directory is, which decides what its entries mean.
    enum Level { case root, bundle, plugIns, appex }

    static let mask: UInt32 = UInt32(IN_CREATE) | UInt32(IN_DELETE) | UInt32(IN_MOVED_TO) | UInt32(IN_MOVED_FROM)
        | UInt32(IN_CLOSE_WRITE) | UInt32(IN_ATTRIB) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)

    let directory: String
    private let debounce: Duration
    private var onChange: (@Sendable () -> Void)?
    private let inotifyFD: Int32
    /// The stop signal: a self-pipe (Swift's Glibc module has no `eventfd`), written once by
    /// `requestStop`.
    private let stopRead: Int32
    private let stopWrite: Int32

    private var watches: [Int32: (path: String, level: Level)] = [:]
    private var paths: [String: Int32] = [:]

    private let lock = NSLock()
    private var stopRequested = false
    private var loopThread: pthread_t?

    init(directory: URL, debounce: Duration, onChange: @escaping @Sendable () -> Void) throws(BGTaskError) {
        self.directory = directory.path
        self.debounce = max(debounce, .zero)
        self.onChange = onChange

        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else {
            throw BGTaskError(.system, file: directory.path, errno: errno, "cannot watch the plugin directory: inotify_init1 failed")
        }
        var pipe: [Int32] = [-1, -1]
        guard bgtask_pipe_cloexec(&pipe) == 0 else {
            let error = errno
            close(fd)
            throw BGTaskError(.system, file: directory.path, errno: error, "cannot watch the plugin directory: pipe2 failed")
        }
        inotifyFD = fd
        stopRead = pipe[0]
        stopWrite = pipe[1]

        guard watch(self.directory, .root) else {
            let error = errno
            close(fd)
            close(pipe[0])
            close(pipe[1])
            throw BGTaskError(.system, file: directory.path, errno: error, "cannot watch the plugin directory: inotify_add_watch failed")
        }
    }

    /// True on the loop's own thread (inside `onChange`).
    var isRunningOnLoopThread: Bool {
        lock.lock()
        defer { lock.unlock() }
        guard let loopThread else { return false }
        return pthread_equal(loopThread, pthread_self()) != 0
    }

    private var isStopRequested: Bool {
        lock.lock()
        defer { lock.unlock() }
        return stopRequested
    }

    /// Makes `run()` return without calling `onChange` again. Called once (the watcher
    /// guards it).
    func requestStop() {
        lock.lock()
        stopRequested = true
        lock.unlock()
        var byte: UInt8 = 1
        _ = retryingEINTR { write(stopWrite, &byte, 1) }
        close(stopWrite)
    }

    /// The loop: waits for inotify events or the stop signal; after an event, waits `debounce`
    /// of quiet (each event restarts it), then calls `onChange` once. Deadlines are poll
    /// timeouts. Closes the inotify descriptor and the pipe's read end when it ends.
    func run() {
        lock.lock()
        loopThread = pthread_self()
        lock.unlock()
        defer {
            close(inotifyFD)
            close(stopRead)
            onChange = nil // whatever the closure holds is released here, on this thread
        }

        let clock = ContinuousClock()
        var deadline: ContinuousClock.Instant?
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: 64 * 1024, alignment: MemoryLayout<inotify_event>.alignment)
        defer { buffer.deallocate() }

        while !isStopRequested {
            var timeout: Int32 = -1
            if let due = deadline {
                let remaining = due - clock.now
                if remaining <= .zero {
                    deadline = nil
                    guard !isStopRequested else { break }
                    onChange?()
                    continue
                }
                timeout = Self.milliseconds(remaining)
            }
            var fds = [pollfd(fd: inotifyFD, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: stopRead, events: Int16(POLLIN), revents: 0)]
            let ready = poll(&fds, 2, timeout)
            if ready < 0 {
                if errno == EINTR || errno == ENOMEM { continue }
                break
            }
            if fds[1].revents != 0 { break }
            if fds[0].revents & Int16(POLLNVAL | POLLERR) != 0 { break }
            if fds[0].revents & Int16(POLLIN) != 0, drain(buffer, size: 64 * 1024) {
                deadline = clock.now + debounce
            }
        }
    }

    /// A poll timeout for `duration`, rounded up to the next millisecond (so the loop does not
    /// wake just before the deadline and spin).
    static func milliseconds(_ duration: Duration) -> Int32 {
        let (seconds, attoseconds) = duration.components
        let milliseconds = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: max(milliseconds, 0))
    }

    /// Reads every pending event and keeps the watches in step. True when one of them may
    /// change the catalog.
    private func drain(_ buffer: UnsafeMutableRawPointer, size: Int) -> Bool {
        var relevant = false
        let header = MemoryLayout<inotify_event>.size
        while true {
            let count = read(inotifyFD, buffer, size)
            if count < 0 {
                if errno == EINTR { continue }
                return relevant // EAGAIN: drained
            }
            if count == 0 { return relevant }
            var offset = 0
            while offset + header <= count {
                let wd = buffer.loadUnaligned(fromByteOffset: offset, as: Int32.self)
                let mask = buffer.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
                let length = Int(buffer.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                let nameBytes = UnsafeRawBufferPointer(start: buffer + offset + header, count: min(length, count - offset - header))
                let name = String(decoding: nameBytes.prefix { $0 != 0 }, as: UTF8.self)
                if handle(wd: wd, mask: mask, name: name) { relevant = true }
                offset += header + length
            }
        }
    }

    /// One event. True when it may change the catalog.
    private func handle(wd: Int32, mask: UInt32, name: String) -> Bool {
        if mask & UInt32(IN_Q_OVERFLOW) != 0 {
            // Events were lost: watch everything afresh and rescan.
            resync()
            return true
        }
        if mask & UInt32(IN_IGNORED) != 0 {
            // The kernel dropped the watch (its directory was deleted, or we removed it).
            if let watched = watches.removeValue(forKey: wd), paths[watched.path] == wd {
                paths[watched.path] = nil
            }
            return false
        }
        guard let watched = watches[wd] else { return false } // an event of a watch just removed
        guard !name.isEmpty else { return true }               // the watched directory itself

        let appeared = mask & (UInt32(IN_CREATE) | UInt32(IN_MOVED_TO)) != 0
        let went = mask & (UInt32(IN_DELETE) | UInt32(IN_MOVED_FROM)) != 0
        let child = watched.path + "/" + name
        let childLevel: Level?
        switch watched.level {
        case .root:
            // Only `*.app` entries are bundles; the catalog ignores everything else.
            guard name.hasSuffix(".app") else { return false }
            childLevel = .bundle
        case .bundle:
            childLevel = name == "PlugIns" ? .plugIns : nil
        case .plugIns:
            childLevel = name.hasSuffix(".appex") ? .appex : nil
        case .appex:
            childLevel = nil
        }
        if let childLevel {
            // A moved-away directory keeps its watch (and would report from its new place).
            if went { unwatch(child) }
            if appeared { watch(child, childLevel) }
        }
        return true
    }

    /// Watches `path` (a directory; anything else fails) and the directories below it that
    /// matter at its level. False when the watch could not be added (errno says why).
    @discardableResult
    private func watch(_ path: String, _ level: Level) -> Bool {
        let wd = inotify_add_watch(inotifyFD, path, Self.mask | UInt32(IN_ONLYDIR))
        guard wd >= 0 else { return false }
        if let previous = watches[wd], previous.path != path, paths[previous.path] == wd {
            paths[previous.path] = nil // the same directory, moved: one watch per inode
        }
        watches[wd] = (path, level)
        paths[path] = wd
        // Entries that were there before the watch (a bundle moved in whole, or files written
        // between its creation and now) are seen by the rescan this event leads to.
        switch level {
        case .root:
            for name in entries(of: path) where name.hasSuffix(".app") { watch(path + "/" + name, .bundle) }
        case .bundle:
            watch(path + "/PlugIns", .plugIns)
        case .plugIns:
            for name in entries(of: path) where name.hasSuffix(".appex") { watch(path + "/" + name, .appex) }
        case .appex:
            break
        }
        return true
    }

    /// Removes the watches on `path` and below it.
    private func unwatch(_ path: String) {
        let prefix = path + "/"
        for (wd, watched) in watches where watched.path == path || watched.path.hasPrefix(prefix) {
            inotify_rm_watch(inotifyFD, wd) // EINVAL when the kernel already dropped it: fine
            watches[wd] = nil
            if paths[watched.path] == wd { paths[watched.path] = nil }
        }
    }

    /// After a queue overflow: drops every watch below the directory and adds them again from
    /// what is there now.
    private func resync() {
        for (wd, watched) in watches where watched.level != .root {
            inotify_rm_watch(inotifyFD, wd)
        }
        watches = watches.filter { $0.value.level == .root }
        paths = paths.filter { watches[$0.value] != nil }
        watch(directory, .root)
    }

    private func entries(of path: String) -> [String] {
        (try? DirectoryListing.names(in: path)) ?? []
    }
}

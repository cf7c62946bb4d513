import BGTaskControl
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The host's state directory (the database, the control socket, every launch's log, the
/// apps' containers): made with the mode it needs, and locked so that one host at a time uses
/// it. Used by `bgtask host` (through TaskHost) and `bgtask run`.
public enum StateDirectory {

    /// The state directory's mode: owner-only (0700); as root 0711, because launches then run
    /// as their apps' own uids and must pass through it to their containers (by path: every
    /// Foundation API an app uses). Either way no one else can list it or read what is in it:
    /// the database and logs are 0600, `logs/` 0700, the control socket 0600.
    public static var mode: mode_t { geteuid() == 0 ? 0o711 : 0o700 }

    /// Creates the state directory with `stateDirectoryMode`, with its `logs` (0700), or makes
    /// an existing one so when this user owns it: it holds the database, the control socket and
    /// every launch's log. Returns a warning when it cannot be (another owner, or a shared
    /// directory with the sticky bit, such as /tmp, which is left alone).
    public static func prepare(_ directory: URL) throws(BGTaskError) -> String? {
        let path = directory.path
        let mode = Self.mode
        if mkdir(path, mode) != 0 && errno != EEXIST {
            do {
                try FileManager.default.createDirectory(at: directory.deletingLastPathComponent(), withIntermediateDirectories: true)
            } catch {
                throw BGTaskError(.system, file: path, "cannot create the state directory: \(error.localizedDescription)")
            }
            if mkdir(path, mode) != 0 && errno != EEXIST {
                throw BGTaskError(.system, file: path, errno: errno, "cannot create the state directory")
            }
        }
        var warning: String?
        var info = stat()
        if stat(path, &info) == 0, info.st_mode & 0o777 != mode {
            if info.st_uid == geteuid() && info.st_mode & S_ISVTX == 0 {
                chmod(path, mode)
            } else if info.st_mode & 0o066 != 0 {
                warning = "the state directory \(path) is open to others (mode \(String(info.st_mode & 0o7777, radix: 8))) and not this user's own to restrict: use a directory of its own (\(String(mode, radix: 8)))"
            }
        }
        let logs = path + "/logs"
        if mkdir(logs, 0o700) != 0 && errno == EEXIST {
            // Through a descriptor that is the directory itself: never a link's target.
            let fd = Glibc.open(logs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            if fd >= 0 {
                fchmod(fd, 0o700)
                close(fd)
            }
        }
        return warning
    }

    /// `STATE/bgtask.lock`, held (flock) while this value lives, with the holder's pid in it.
    public final class Lock: @unchecked Sendable {
        private let fd: Int32

        /// Takes the lock, or says which host holds it (`.hostRunning`).
        public init(_ directory: URL) throws(BGTaskError) {
            let path = directory.appendingPathComponent("bgtask.lock").path
            let fd = try syscall("open \(path)") { Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
            guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
                let holder = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
                close(fd)
                throw BGTaskError(.hostRunning, file: path, "another bgtask host (pid \(holder)) is running on this state directory")
            }
            ftruncate(fd, 0)
            let pid = Array("\(getpid())\n".utf8)
            _ = pwrite(fd, pid, pid.count, 0)
            self.fd = fd
        }

        deinit { close(fd) }
    }
}

import BGTaskControl
import Glibc

/// Whether the apps' own uids can reach their containers. A root host runs each app as a uid of
/// its own (`AppIdentities`), which is neither the owner nor in the group of the directories
/// above the state directory: every one of them must let others search it (the x bit for
/// others), or the app cannot open its own container, its HOME, by path. A state directory
/// beneath a 0700 home (root's default `~/.local/state` before `/var/lib/bgtask` was) failed
/// every launch this way; the host now refuses to start on one, and says which directory and
/// what to do.
public enum ContainerReach {
    /// Throws when a directory from `/` down to `stateDirectory` (which must exist) does not let
    /// others search it. The state directory itself is the host's (0711 as root: searchable,
    /// not listable), so it is checked with the rest.
    /// Called by the host as it starts and by `bgtask run`, when launches run as their own uids.
    public static func check(stateDirectory: String) throws(BGTaskError) {
        var resolved = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard realpath(stateDirectory, &resolved) != nil else {
            throw BGTaskError(.system, file: stateDirectory, errno: errno, "cannot resolve the state directory")
        }
        let path = String(decoding: resolved.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if let blocking = firstUnsearchable(path) {
            throw BGTaskError(.launch, file: blocking.path, """
                the apps' own uids cannot reach their containers under the state directory \(path): \
                \(blocking.path) is mode \(String(blocking.mode & 0o7777, radix: 8)) (uid \(blocking.owner)) and does not let others \
                search it. Use a state directory every uid may search down to (a root host's default is \
                /var/lib/bgtask), or `chmod o+x \(blocking.path)`
                """)
        }
    }

    /// The first directory on the way from `/` to `path` (an absolute, resolved path) that others
    /// may not search, with its mode and owner; nil when every one allows it.
    package static func firstUnsearchable(_ path: String) -> (path: String, mode: mode_t, owner: uid_t)? {
        var prefix = ""
        var candidates = ["/"]
        for component in path.split(separator: "/") {
            prefix += "/" + component
            candidates.append(prefix)
        }
        for candidate in candidates {
            var info = stat()
            guard stat(candidate, &info) == 0 else { return (candidate, 0, 0) }
            if info.st_mode & S_IXOTH == 0 { return (candidate, info.st_mode, info.st_uid) }
        }
        return nil
    }
}

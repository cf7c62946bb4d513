#if os(Linux)
import BGTaskControl
import Foundation
import Glibc
import Logging

extension CgroupV2 {
    /// `--cgroup auto`: the cgroup this process was started in, used for launches only when it
    /// was delegated to this process (systemd's `Delegate=yes`: the unit in
    /// `Packaging/systemd/`).
    ///
    /// Delegated means all of: the process is in a cgroup v2 hierarchy (`0::PATH` in
    /// /proc/self/cgroup) whose mount is visible (/proc/self/mountinfo); PATH is not the root
    /// of the hierarchy (the root belongs to the init system); `memory` and `pids` are in its
    /// `cgroup.controllers`; it carries systemd's delegation mark (the `trusted.delegate` or
    /// `user.delegate` extended attribute set to 1), or, for a process that is not root, it is
    /// owned by this process's uid (a root process can write every cgroup, so writability proves
    /// nothing for it); the directory, its `cgroup.procs` and `cgroup.subtree_control` are
    /// writable; and this process is the only one in it.
    ///
    /// Claiming it follows systemd's delegation rules (docs/CGROUP_DELEGATION.md: the
    /// "no processes in inner nodes" rule): the host moves itself into a `host` child, enables
    /// `memory` and `pids` for the children, and launches get their groups under a `launches`
    /// child, which has them enabled for its own children. Nothing outside the delegated
    /// directory is ever written.
    ///
    /// The inputs are read through paths that tests point at fake files: tests never write to
    /// the machine's own hierarchy.
    package struct Delegation {
        package var selfCgroupFile = "/proc/self/cgroup"
        package var mountInfoFile = "/proc/self/mountinfo"
        package var pid: pid_t = getpid()
        package var euid: uid_t = geteuid()

        package init(selfCgroupFile: String = "/proc/self/cgroup", mountInfoFile: String = "/proc/self/mountinfo",
                     pid: pid_t = getpid(), euid: uid_t = geteuid()) {
            self.selfCgroupFile = selfCgroupFile
            self.mountInfoFile = mountInfoFile
            self.pid = pid
            self.euid = euid
        }

        /// The controllers a claimed cgroup must offer, and that are enabled below it.
        package static let controllers = ["memory", "pids"]

        package enum Finding: Equatable {
            /// The delegated directory (the cgroup this process is in).
            case delegated(URL)
            /// Why there is no usable delegation.
            case refused(String)
        }

        /// Looks for the delegation; reads only.
        package func find() -> Finding {
            guard let membership = try? String(contentsOfFile: selfCgroupFile, encoding: .utf8) else {
                return .refused("cannot read \(selfCgroupFile)")
            }
            guard let line = membership.split(separator: "\n").first(where: { $0.hasPrefix("0::") }) else {
                return .refused("this process is in no cgroup v2 hierarchy (\(selfCgroupFile) has no 0:: line: cgroup v1 only)")
            }
            let path = String(line.dropFirst(3))
            guard path != "/" else {
                return .refused("this process is in the root of the cgroup v2 hierarchy, which belongs to the init system: nothing is delegated to it (run the host from its systemd unit, which sets Delegate=yes)")
            }
            guard let directory = Self.directory(of: path, mountInfo: (try? String(contentsOfFile: mountInfoFile, encoding: .utf8)) ?? "") else {
                return .refused("no cgroup2 file system mounted here shows this process's cgroup \(path) (\(mountInfoFile))")
            }
            let dir = directory.path
            let available = CgroupV2.words(dir + "/cgroup.controllers")
            let missing = Self.controllers.filter { !available.contains($0) }
            guard missing.isEmpty else {
                return .refused("\(dir)/cgroup.controllers lacks \(missing.joined(separator: " and ")) (on a hybrid layout they are bound to cgroup v1; with systemd, Delegate=yes hands them to the unit)")
            }
            guard Self.hasDelegationMark(dir) || (euid != 0 && Self.owner(of: dir) == euid) else {
                return .refused("\(dir) is not delegated to this process (no trusted.delegate or user.delegate mark\(euid == 0 ? "; as root, being able to write it proves nothing" : ", and not owned by uid \(euid)"): set Delegate=yes on the unit)")
            }
            for file in ["", "/cgroup.procs", "/cgroup.subtree_control"] where access(dir + file, W_OK) != 0 {
                return .refused("\(dir + file) is not writable by this process (\(String(cString: strerror(errno))))")
            }
            let others = ((try? String(contentsOfFile: dir + "/cgroup.procs", encoding: .utf8)) ?? "")
                .split(separator: "\n").compactMap { pid_t($0) }.filter { $0 != pid }
            guard others.isEmpty else {
                return .refused("\(dir) holds other processes (pids \(others.prefix(8).map(String.init).joined(separator: ", "))): the host must be alone in it to move into a leaf and enable controllers for its launches")
            }
            return .delegated(directory)
        }

        /// Takes the delegated `directory`: moves this process into `directory/host`, enables
        /// the controllers for the children, makes `directory/launches` with the controllers
        /// enabled for launch groups, and removes launch groups a previous host left there.
        /// Returns `directory/launches`, the root of every launch's group.
        ///
        /// Call it once, from the host's process, before it starts any other process (the
        /// zygote, a launch): a process left in `directory` would make enabling controllers fail.
        package func claim(_ directory: URL) throws(BGTaskError) -> URL {
            let host = directory.appendingPathComponent("host")
            let launches = directory.appendingPathComponent("launches")
            try Self.makeGroup(host)
            try CgroupV2.write(host.path + "/cgroup.procs", "\(pid)")
            try Self.makeGroup(launches)
            let enable = Self.controllers.map { "+" + $0 }.joined(separator: " ")
            try CgroupV2.write(directory.path + "/cgroup.subtree_control", enable)
            try CgroupV2.write(launches.path + "/cgroup.subtree_control", enable)
            // A host that died left its launches' groups (systemd empties the unit's cgroup
            // when the unit stops, so normally there are none).
            for name in (try? FileManager.default.contentsOfDirectory(atPath: launches.path)) ?? [] where name.hasPrefix("bgtask-") {
                let stale = LaunchGroup(url: launches.appendingPathComponent(name))
                stale.killAll()
                _ = rmdir(stale.url.path)
            }
            return launches
        }

        /// Where `path` (a cgroup v2 path, as /proc/self/cgroup gives it) is in this mount
        /// namespace: under the last cgroup2 mount whose root contains it.
        package static func directory(of path: String, mountInfo: String) -> URL? {
            var found: URL?
            for line in mountInfo.split(separator: "\n") {
                // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
                guard let dash = line.range(of: " - ") else { continue }
                let fields = line[..<dash.lowerBound].split(separator: " ")
                let tail = line[dash.upperBound...].split(separator: " ")
                guard fields.count >= 5, tail.first == "cgroup2" else { continue }
                let root = unescape(fields[3]), mountPoint = unescape(fields[4])
                let relative: Substring
                if root == "/" {
                    relative = path[...]
                } else if path == root || path.hasPrefix(root + "/") {
                    relative = path.dropFirst(root.count)
                } else {
                    continue
                }
                found = URL(fileURLWithPath: mountPoint + (relative.isEmpty || relative == "/" ? "" : relative))
            }
            return found
        }

        /// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
        package static func unescape(_ field: Substring) -> String {
            guard field.contains("\\") else { return String(field) }
            var bytes: [UInt8] = []
            var rest = Array(field.utf8)[...]
            while let byte = rest.first {
                if byte == UInt8(ascii: "\\"), rest.count >= 4,
                   let value = UInt8(String(decoding: rest.dropFirst().prefix(3), as: UTF8.self), radix: 8) {
                    bytes.append(value)
                    rest = rest.dropFirst(4)
                } else {
                    bytes.append(byte)
                    rest = rest.dropFirst()
                }
            }
            return String(decoding: bytes, as: UTF8.self)
        }

        /// systemd marks the cgroups of units with `Delegate=yes`: `trusted.delegate` (set by
        /// the system manager, readable by root only) and, from v252 on, `user.delegate` (which
        /// the user manager can set too), each "1".
        package static func hasDelegationMark(_ path: String) -> Bool {
            ["trusted.delegate", "user.delegate"].contains { extendedAttribute($0, of: path) == "1" }
        }

        /// getxattr(2), looked up at run time: Swift's Glibc module has no <sys/xattr.h>.
        package static func extendedAttribute(_ name: String, of path: String) -> String? {
            typealias GetXattr = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int
            guard let symbol = dlsym(nil, "getxattr") else { return nil }
            let getxattr = unsafeBitCast(symbol, to: GetXattr.self)
            var buffer = [UInt8](repeating: 0, count: 64)
            let count = buffer.withUnsafeMutableBytes { getxattr(path, name, $0.baseAddress, $0.count) }
            guard count >= 0 else { return nil }
            return String(decoding: buffer[..<count], as: UTF8.self)
        }

        package static func owner(of path: String) -> uid_t? {
            var info = stat()
            return stat(path, &info) == 0 ? info.st_uid : nil
        }

        /// mkdir, where an existing group (from a previous host in the same cgroup) is fine.
        private static func makeGroup(_ url: URL) throws(BGTaskError) {
            if mkdir(url.path, 0o755) != 0 && errno != EEXIST {
                throw BGTaskError(.system, file: url.path, errno: errno, "cannot create the cgroup")
            }
        }
    }
}

extension LaunchSupervisor {
    /// The default `processLimit`: the pids controller counts threads as well as processes,
    /// and one Swift process may run up to 255 Dispatch worker threads; 512 still stops a fork
    /// bomb within milliseconds, long before it harms the host.
    public static let defaultProcessLimit = 512

    /// `--cgroup auto`: claims the cgroup this process was started in when it was delegated to
    /// it (see `CgroupV2.Delegation`) and returns the directory under which launches get their
    /// groups; otherwise returns nil, and one log line says why (memory is then sampled).
    ///
    /// Call it once, on the host's (or `bgtask run`'s) main thread, before anything starts a
    /// launch or the zygote: it moves this process into the delegated directory's `host` child.
    public static func claimDelegatedCgroup(logger: Logger) -> URL? {
        claimDelegatedCgroup(CgroupV2.Delegation(), logger: logger)
    }

    package static func claimDelegatedCgroup(_ delegation: CgroupV2.Delegation, logger: Logger) -> URL? {
        switch delegation.find() {
        case .refused(let reason):
            logger.warning("cgroup auto: no delegated cgroup v2, memory is sampled and launches have no process limit: \(reason)")
            return nil
        case .delegated(let directory):
            do {
                let launches = try delegation.claim(directory)
                let notes = (try? CgroupV2.LaunchGroup.validate(root: launches)) ?? []
                logger.info("cgroup auto: using the delegated cgroup \(directory.path): the host moved into host/, launches get memory.max, pids.max and cgroup.kill in launches/\(notes.isEmpty ? "" : "; " + notes.joined(separator: "; "))")
                return launches
            } catch {
                logger.warning("cgroup auto: cannot use the delegated cgroup \(directory.path), memory is sampled and launches have no process limit: \(error)")
                return nil
            }
        }
    }
}
#endif

#if os(Linux)
extension LaunchSupervisor {
    /// Fallbacks already logged by this process: each is said once, not at every launch.
    private static let reportedFallbacks = LockedValue<Set<String>>([])

    /// Logs the `fallbacks` of a launch's cgroup (files the kernel lacks, and what is done
    /// instead) that this process has not logged before. Any thread.
    package static func reportOnce(_ fallbacks: [String], logger: Logger) {
        guard !fallbacks.isEmpty else { return }
        let fresh = reportedFallbacks.withLock { seen in fallbacks.filter { seen.insert($0).inserted } }
        for note in fresh { logger.warning("cgroup: \(note)") }
    }
}
#endif

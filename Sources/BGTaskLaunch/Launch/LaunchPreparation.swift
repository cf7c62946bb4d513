import BGTaskControl
import BGTaskSystem
import BGTaskModel
import BGTaskWire
import Foundation
import Glibc
import Logging
import _BGTaskSystemShims

/// What a launch needs made before its process starts (containers, identity, environment,
/// cgroup) and what is left to clean after it.
extension LaunchSupervisor {
    /// A `rusage` that says only `cpuNs` of CPU time (user), for records of kept processes,
    /// which are not reaped.
    package static func usage(cpuNs: UInt64) -> rusage {
        var usage = rusage()
        usage.ru_utime.tv_sec = Int(cpuNs / 1_000_000_000)
        usage.ru_utime.tv_usec = Int(cpuNs % 1_000_000_000 / 1000)
        return usage
    }

    /// The last line the runner wrote to the launch log (its own `bgtask-runner:` words, up to
    /// 512 bytes read from the file's end), or nil. Only for a launch that failed before it
    /// loaded the plugin: no app code has written there.
    package static func lastRunnerLine(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_size > 0 else { return nil }
        let length = min(Int(info.st_size), 512)
        var bytes = [UInt8](repeating: 0, count: length)
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, length, off_t(info.st_size) - off_t(length)) }
        guard count > 0 else { return nil }
        let line = String(decoding: bytes[..<count], as: UTF8.self).split(separator: "\n").last.map(String.init)
        guard let line, line.hasPrefix("bgtask-runner:") else { return nil }
        return line
    }

    /// The record's `disk`: the app's use against its quota, how it is enforced, and a log lost.
    package static func diskRecord(_ plan: LaunchPlan, use: DiskUse?, exceeded: String?, logError: String?) -> RunRecord.DiskRecord {
        let quota = plan.limits.diskQuota
        return RunRecord.DiskRecord(
            bytes: use?.bytes, inodes: use?.inodes, quotaBytes: quota.bytes, quotaInodes: quota.inodes,
            enforcement: quota.isOn ? ProjectQuotas.cachedEnforcement(plan.dataDirectory.deletingLastPathComponent().path) : nil,
            exceeded: exceeded, logError: logError)
    }

    /// The app's container laid out as on iOS (its HOME), the containers of the app groups it
    /// is granted (`AppGroupOwners`: the group's owner, its extensions, the operator's grant;
    /// the rest refused, with why) and the log directory; the identity the launch runs as.
    /// Paths as strings once (URL operations are a measurable part of a short launch).
    package func prepareContainers(_ plan: LaunchPlan) throws(BGTaskError) -> (groups: [AppGroup], refused: [String: String], identity: LaunchIdentity?) {
        let dataPath = plan.dataDirectory.path
        let logPath = plan.logFile.path
        let made = try prepareContainer(dataPath, subdirectories: AppContainer.directories)
        let decision = try AppGroupOwners(stateDirectory: plan.groupsDirectory.deletingLastPathComponent())
            .decide(app: plan.bundle.containingApp ?? plan.bundle.identifier, groups: plan.bundle.appGroups, claim: true)
        let groups = try decision.granted.map { identifier throws(BGTaskError) in
            let directory = AppContainer.groupDirectory(root: plan.groupsDirectory.path, identifier: identifier)
            _ = try prepareContainer(directory, subdirectories: AppContainer.groupDirectories)
            return AppGroup(identifier: identifier, directory: directory)
        }
        try makeDirectories(logPath.lastIndex(of: "/").map { String(logPath[..<$0]) } ?? ".")
        let identity = try identity(for: plan, container: dataPath, groups: groups)
        // A directory the app had removed and the host made again is the host's (root's): the
        // app's again, or it could not write its own Caches. (A new container is given whole.)
        if let identity { for path in made { lchown(path, identity.uid, identity.gid) } }
        return (groups, decision.refused, identity)
    }

    /// What a prepared container looked like: its directory's and its Library's identity and
    /// modification time. Every directory a container must have lives in one of the two (see
    /// `AppContainer.directories`), so while neither changed, none was removed or replaced.
    package struct ContainerStamp: Equatable {
        package var root: [Int]
        package var library: [Int]

        package init?(_ path: String) {
            func read(_ path: String) -> [Int]? {
                var info = stat()
                guard fstatat(AT_FDCWD, path, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFDIR else { return nil }
                return [Int(info.st_dev), Int(info.st_ino), info.st_mtim.tv_sec, info.st_mtim.tv_nsec]
            }
            guard let root = read(path), let library = read(path + "/Library") else { return nil }
            (self.root, self.library) = (root, library)
        }
    }

    /// Containers as this process last prepared them, by path: one unchanged since is not made
    /// again (two stat calls instead of a score of opens and mkdirs before every launch).
    package static let preparedContainers = LockedValue([String: ContainerStamp]())

    /// What a launch's environment changes over the host's own.
    package func environment(_ plan: LaunchPlan) -> [String: String] {
        var overrides = AppContainer.environment(container: plan.dataDirectory.path)
        overrides["BGTASK_LAUNCH_ID"] = plan.launchID
        overrides["BGTASK_BUNDLE_ID"] = plan.bundle.identifier
        if getenv("SWIFT_BACKTRACE") == nil { overrides["SWIFT_BACKTRACE"] = "enable=no" }
        for (key, value) in plan.environment { overrides[key] = value }
        if !confine { overrides[AppContainer.pidNamespaceSwitch] = "off" }
        if confine && !sandboxFailsClosed { overrides[AppContainer.sandboxModeVariable] = SandboxMode.bestEffort.rawValue }
        return overrides
    }

    /// Starts the launch's runner: forked from the zygote (the fast path), or spawned when the
    /// zygote cannot serve. Its pid, and whether it was forked; it is in `activeRunners` before
    /// anyone may look for orphans.
    package func startRunner(_ plan: LaunchPlan, channel: Int32, stdin: Int32, log: Int32,
                             metadata: Logger.Metadata) -> Result<(pid: pid_t, forked: Bool), BGTaskError> {
        let overrides = environment(plan)
        return Self.spawnLock.withLock {
            if let zygote {
                do {
                    let pid = try zygote.launch(channel: channel, stdin: stdin, log: log, environment: overrides)
                    _ = Self.activeRunners.withLock { $0.insert(pid) }
                    return .success((pid, true))
                } catch {
                    logger.warning("zygote unavailable; spawning the runner instead", metadata: metadata.merging(["error": "\(error)"]) { $1 })
                }
            }
            var environment = ProcessInfo.processInfo.environment
            for (key, value) in overrides { environment[key] = value }
            do {
                let pid = try Subprocess.spawn([runnerPath, plan.bundle.identifier], environment: environment,
                                               stdin: stdin, stdout: log, stderr: log, descriptor3: channel)
                _ = Self.activeRunners.withLock { $0.insert(pid) }
                return .success((pid, false))
            } catch let error as SystemError {
                return .failure(BGTaskError(.launch, file: runnerPath, errno: error.errno, "cannot spawn the runner"))
            } catch {
                return .failure(BGTaskError(.launch, file: runnerPath, "cannot spawn the runner: \(error)"))
            }
        }
    }

    /// The launch's cgroup under `root` with `pid` in it, or nil (logged) when it cannot be had:
    /// memory is then sampled, and there is no process limit.
    package func launchGroup(under root: URL, for pid: pid_t, plan: LaunchPlan) -> CgroupV2.LaunchGroup? {
        do {
            let group = try CgroupV2.LaunchGroup.create(
                under: root, launchID: plan.launchID,
                memoryMax: plan.limits.memoryLimitBytes > 0 ? plan.limits.memoryLimitBytes : nil, processMax: processLimit)
            Self.reportOnce(group.fallbacks, logger: logger)
            do {
                try group.add(pid)
                return group
            } catch {
                group.remove()
                throw error
            }
        } catch {
            logger.warning("launch cgroup unavailable: memory is sampled, no process limit", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// After the runner `pid` was reaped: what its cgroup saw, and whatever the plugin left
    /// behind dies with the launch: its process group, and every orphan re-parented to this
    /// process (setsid cannot escape a subreaper).
    package func cleanUp(after pid: pid_t, cgroup: CgroupV2.LaunchGroup?, _ state: inout LaunchState) {
        _ = Self.activeRunners.withLock { $0.remove(pid) }
        if let cgroup {
            if cgroup.oomKills > 0, state.killed == nil { state.killed = .jetsam }
            state.peakRSS = max(state.peakRSS, cgroup.peakBytes ?? 0)
            cgroup.killAll()
        }
        kill(-pid, SIGKILL)
        // A runner that ended its launch itself and never had a child left nothing to find
        // (its orphans would have been its children: it is their subreaper).
        if !state.finished || state.hadDescendants || state.killed != nil {
            Self.reapOrphans(sparing: zygote?.processes ?? [], launchGroup: pid)
        }
    }

    /// What the runner is told about its launch. Without a cgroup, an `RLIMIT_DATA` backstop
    /// well above the limit catches a runaway between two samples.
    package func assignment(_ plan: LaunchPlan, cgroup: CgroupV2.LaunchGroup?, groups: [AppGroup], identity: LaunchIdentity?) -> LaunchAssignment {
        LaunchAssignment(
            launchID: plan.launchID, role: plan.role, bundleIdentifier: plan.bundle.identifier,
            bundlePath: plan.bundle.url.path, executablePath: plan.bundle.executableURL.path,
            dataDirectory: plan.dataDirectory.path, permittedIdentifiers: plan.bundle.permittedIdentifiers,
            tasks: plan.tasks, mappedHandlers: plan.bundle.mappedHandlers, eventJSON: plan.eventJSON,
            supportedResources: plan.supportedResources,
            memoryBackstopBytes: cgroup == nil && plan.limits.memoryLimitBytes > 0
                ? max(plan.limits.memoryLimitBytes * 4, plan.limits.memoryLimitBytes + (2 << 30)) : nil,
            appGroups: groups, confine: confine, identity: identity,
            processLimit: identity == nil ? nil : processLimit.map { UInt32(clamping: $0) })
    }

    /// The uid, gid and groups the launch runs as, with its container and its groups'
    /// containers given to them; nil unless the host may choose (it is root and confines).
    package func identity(for plan: LaunchPlan, container: String, groups: [AppGroup]) throws(BGTaskError) -> LaunchIdentity? {
        guard let identities, confine else { return nil }
        // The app's uid must reach its container through the state directory: traverse (x),
        // never list or read, for others; what is in it stays owner-only.
        let containers = (container as NSString).deletingLastPathComponent
        AppIdentities.allowTraversal([(containers as NSString).deletingLastPathComponent, containers, plan.groupsDirectory.path])
        let uid = try identities.uid(forApp: plan.bundle.containingApp ?? plan.bundle.identifier)
        AppIdentities.giveContainer(container, uid: uid, gid: uid)
        var gids: [UInt32] = []
        for group in groups {
            let gid = try identities.gid(forGroup: group.identifier)
            AppIdentities.giveGroupContainer(group.directory, subdirectories: AppContainer.groupDirectories, gid: gid)
            gids.append(gid)
        }
        return LaunchIdentity(uid: uid, gid: uid, groups: gids)
    }

    /// Makes `path` and its `subdirectories` (relative, parents first), never through a link:
    /// the container is the app's, and an app that swapped its `Library` for a symbolic link
    /// to /etc must not make the host (root) create `/etc/Caches`. Each directory is reached
    /// from its parent's descriptor with O_NOFOLLOW and made with mkdirat; a link, or anything
    /// but a directory, where one is expected is left alone (the app broke its own layout).
    /// A few system calls each: this runs before every launch, unless the container is as this
    /// process last left it (`preparedContainers`). Returns the directories it made.
    package func prepareContainer(_ path: String, subdirectories: [String]) throws(BGTaskError) -> [String] {
        let stamp = ContainerStamp(path)
        if let stamp, Self.preparedContainers.withLock({ $0[path] == stamp }) { return [] }
        var made: [String] = []
        if mkdir(path, 0o755) == 0 { made.append(path) } else { try makeDirectories(path) }
        let root = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard root >= 0 else {
            throw BGTaskError(.system, file: path, errno: errno, "the app container is not a directory (a symbolic link is refused)")
        }
        defer { close(root) }
        for subdirectory in subdirectories {
            let parts = subdirectory.split(separator: "/").map(String.init)
            var parent = root
            var opened: [Int32] = []
            defer { opened.forEach { close($0) } }
            for part in parts.dropLast() {
                let fd = openat(parent, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                guard fd >= 0 else { break }
                opened.append(fd)
                parent = fd
            }
            guard opened.count == parts.count - 1, let name = parts.last else { continue }
            if mkdirat(parent, name, 0o755) == 0 {
                made.append(path + "/" + subdirectory)
            } else if errno != EEXIST {
                throw BGTaskError(.system, file: path + "/" + subdirectory, errno: errno, "cannot create the app container's directory")
            }
        }
        // Remembered once made (a failure above is tried again at the next launch).
        let prepared = ContainerStamp(path)
        Self.preparedContainers.withLock { $0[path] = prepared }
        return made
    }


    /// Kills the launch: its process group (or its cgroup), in one syscall.
    ///
    /// What left the group (setsid) is not looked for here: when the runner dies, it is
    /// re-parented to this process (a child subreaper) and killed as an orphan once the runner
    /// is reaped (`reapOrphans`). A walk of the runner's threads while they die would make the
    /// runner's reap spin in the kernel for milliseconds (the /proc entries the walk creates;
    /// see docs/decisions/no-proc-on-the-launch-path.md), and the watchdog's kill is measured to the reap.
    package static func terminate(_ pid: pid_t, cgroup: CgroupV2.LaunchGroup?) {
        cgroup?.killAll()
        kill(-pid, SIGKILL)
        // The runner by pid too: a child the zygote forked a moment ago may not have made its
        // process group yet, and the group kill would miss it.
        kill(pid, SIGKILL)
    }
}

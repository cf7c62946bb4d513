import BGTaskModel
import BGTaskWire
import Glibc
import _BGTaskSystemShims

/// The confinement a launch applies to itself, on the runner's main thread, after the app
/// process is prepared and before the parent reader starts or any plugin code is loaded (so
/// every thread the launch will have inherits it, and no plugin code runs unconfined).
///
/// - Landlock: the launch reads and executes only the system's directories and libraries and its
///   own bundle; it writes only its container (with its `tmp`) and its app groups; it may signal
///   only its own processes (not the host, not another launch) and reach only its own abstract
///   sockets. Not the state directory: other containers, the database, the logs and the control
///   socket are out of its reach.
/// - seccomp-bpf: no new namespaces, no CLONE_PARENT sibling, no giving up the subreaper (so
///   every process a launch makes stays in its tree, where the supervisor counts and kills it),
///   no ptrace or cross-process memory, mounts, modules, bpf, keyrings, io_uring, and only the
///   native system-call ABI.
/// - no_new_privs.
/// Every layer the kernel or the privileges at hand cannot give is reported with its reason, in
/// the record's `sandbox`; none is dropped silently.
enum Sandbox {
    /// What every launch may read and execute besides its bundle. All of /proc: libdispatch
    /// reads /proc/TID/stat of each of its worker threads (and traps when it cannot), and a
    /// thread's /proc/TID is not beneath the process's /proc/PID, so no narrower rule works.
    /// Another process's entries that matter (environ, mem, fd, root, cwd) need ptrace access,
    /// which Landlock refuses outside the launch's domain; environ alone is checked only by uid,
    /// so it stays readable while launches run as the host's uid (see the `uid` layer).
    static let systemDirectories = ["/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/sys", "/run", "/proc"]

    /// True once Landlock confines this launch's signals to its own processes: then `kill(-1)`
    /// reaches exactly the launch's processes (see `killDescendants`).
    nonisolated(unsafe) static var signalsScoped = false
    /// Character devices every launch may read and write.
    static let devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"]

    /// The ruleset with the system's part granted (`prepareRuleset`), or -1; made by a zygote
    /// spare while it waits, so a launch adds only its bundle and containers.
    nonisolated(unsafe) static var preparedRuleset: Int32 = -1
    nonisolated(unsafe) static var preparedABI: Int32 = 0
    nonisolated(unsafe) static var preparationError: String?

    /// Makes the ruleset and grants what every launch may read and execute and the devices.
    /// Library directories beneath a system directory need no rule of their own.
    /// Async-signal-safe: no — allocates, and Landlock's errors are formatted; the spare (or the
    /// launch), an ordinary process.
    static func prepareRuleset() {
        if libraryDirectories.isEmpty { findLibraryDirectories() }
        var abi: Int32 = 0
        let ruleset = bgtask_landlock_create(&abi)
        preparedABI = abi
        guard ruleset >= 0 else {
            preparationError = abi <= 0 ? "landlock: not available in this kernel" : "landlock: create_ruleset: \(String(cString: strerror(errno)))"
            return
        }
        let readExec = systemDirectories + libraryDirectories.filter { directory in
            !systemDirectories.contains { directory == $0 || directory.hasPrefix($0 + "/") }
        }
        var error = [CChar](repeating: 0, count: 512)
        guard withCStrings(readExec, { bgtask_landlock_allow(ruleset, $0, Int32(readExec.count), Int32(BGTASK_LANDLOCK_READ_EXECUTE), &error, error.count) }) == 0,
              withCStrings(devices, { bgtask_landlock_allow(ruleset, $0, Int32(devices.count), Int32(BGTASK_LANDLOCK_DEVICE), &error, error.count) }) == 0 else {
            close(ruleset)
            preparationError = text(error)
            return
        }
        preparedRuleset = ruleset
    }

    /// The directories of the libraries this process has loaded (the Swift runtime's may be
    /// anywhere): found once in the zygote, inherited by its children.
    nonisolated(unsafe) static var libraryDirectories: [String] = []

    /// Async-signal-safe: no — dl_iterate_phdr (the loader's lock) and allocation; the zygote,
    /// before it forks (a spare only if the zygote found none).
    static func findLibraryDirectories() {
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        let used = bgtask_loaded_library_directories(&buffer, buffer.count)
        libraryDirectories = buffer[..<used].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    }

    /// Becomes the app's own user (when the host, as root, gave the launch an identity): its
    /// uid and gid, its app groups' gids and nothing else, RLIMIT_NPROC for its uid (a fork
    /// bomb's ceiling: the kernel counts the processes of each uid), umask 007 (what it makes in
    /// a group's setgid container is the group's). Before anything else of the app's happens;
    /// a launch that cannot drop root does not run.
    static func becomeApp(_ assignment: LaunchAssignment) -> SandboxLayer {
        guard let identity = assignment.identity else {
            return SandboxLayer(applied: false, detail: geteuid() == 0
                ? "runs as root: confinement is off (--no-sandbox)"
                : "runs as the host's uid \(geteuid()) (a host that is not root cannot give each app its own)")
        }
        let groups = identity.groups
        guard bgtask_become_user(identity.uid, identity.gid, groups, Int32(groups.count), assignment.processLimit ?? 0) == 0 else {
            launchFailed("cannot run as the app's uid \(identity.uid): \(String(cString: strerror(errno)))")
        }
        let limit = assignment.processLimit.map { ", at most \($0) processes" } ?? ""
        return SandboxLayer(applied: true, detail: "uid \(identity.uid), gid \(identity.gid)\(groups.isEmpty ? "" : ", groups \(identity.groups.map(String.init).joined(separator: " "))")\(limit)")
    }

    /// The launch's PID namespace, made before the launch arrives (by the zygote's spare, or
    /// as a spawned runner starts): what it starts ends with it, and it sees no other process.
    nonisolated(unsafe) static var pidNamespace = SandboxLayer(applied: false, detail: "not entered")

    /// Why this zygote's launches get no PID namespace (nil: they do), decided once.
    nonisolated(unsafe) static var namespacesUnavailable: String?

    /// The zygote, once: whether its spares may make namespaces (a throwaway child tries, since
    /// a spare that failed half-way would already be the host's child).
    /// Async-signal-safe: no — allocates; the zygote, before it forks (the throwaway child of
    /// `bgtask_namespaces_available` runs raw system calls only).
    static func checkNamespaces() {
        if switchedOff() { return }
        var error = [CChar](repeating: 0, count: 512)
        if bgtask_namespaces_available(&error, error.count) == 0 { namespacesUnavailable = text(error) }
    }

    /// True (and the reason noted) when the host turned confinement off (--no-sandbox).
    private static func switchedOff() -> Bool {
        guard let value = getenv(AppContainer.pidNamespaceSwitch), String(cString: value) == "off" else { return false }
        namespacesUnavailable = "confinement is off for this launch (--no-sandbox)"
        return true
    }

    /// In the app's process: records whether it is in a namespace of its own.
    /// Async-signal-safe: no — builds strings; the app's first Swift after the clone, in a copy of
    /// a single-threaded maker (the zygote, or a spawned runner), so an ordinary process.
    static func notePidNamespace(_ entered: Bool, error: String? = nil) {
        pidNamespace = entered
            ? SandboxLayer(applied: true, detail: "pid \(getpid()) of its own namespace, with its own /proc; what it starts ends with it")
            : SandboxLayer(applied: false, detail: error ?? namespacesUnavailable ?? "not entered")
    }

    /// A spawned runner, as it starts: becomes the outer process, and carries on as the app.
    /// No probe first: `bgtask_enter_pid_namespace` fails cleanly, with its reason, when it
    /// cannot unshare.
    /// Async-signal-safe: no — allocates before and after `bgtask_enter_pid_namespace`: first
    /// thing in main.swift, while the runner is single-threaded (which that call checks); the app
    /// returns through it as an ordinary process.
    static func enterPidNamespace() {
        if switchedOff() { return notePidNamespace(false) }
        var error = [CChar](repeating: 0, count: 512)
        let entered = bgtask_enter_pid_namespace(&error, error.count) == 0
        notePidNamespace(entered, error: entered ? nil : text(error))
    }

    /// Why the launch's own Landlock rules could not be added (`grantLaunchPaths`), or nil.
    nonisolated(unsafe) static var grantError: String?

    /// Adds the launch's own rules to the ruleset: its bundle (read and execute), its container
    /// and its app groups (read and write). Called as root, before `becomeApp`: the rules are
    /// made from descriptors the host's uid opens, so a bundle or state directory beneath a
    /// directory the app's uid cannot traverse (a 0700 home) still gets its rules (the app then
    /// reaches its container by path only when `ContainerReach` passed at the host's start).
    /// Async-signal-safe: no — allocates; the launch, an ordinary process, single-threaded.
    static func grantLaunchPaths(_ assignment: LaunchAssignment) {
        startedAsRoot = geteuid() == 0
        guard assignment.confine, !layersSwitchedOff().contains("landlock") else { return }
        if preparedRuleset < 0 { prepareRuleset() }
        guard preparedRuleset >= 0 else { return }
        var error = [CChar](repeating: 0, count: 512)
        let readWrite = [assignment.dataDirectory] + assignment.appGroups.map(\.directory)
        let granted = withCStrings([assignment.bundlePath]) {
            bgtask_landlock_allow(preparedRuleset, $0, 1, Int32(BGTASK_LANDLOCK_READ_EXECUTE), &error, error.count)
        } == 0 && withCStrings(readWrite) {
            bgtask_landlock_allow(preparedRuleset, $0, Int32(readWrite.count), Int32(BGTASK_LANDLOCK_READ_WRITE), &error, error.count)
        } == 0
        if !granted {
            close(preparedRuleset)
            preparedRuleset = -1
            grantError = text(error)
        }
    }

    /// Whether a layer that cannot be applied fails the launch (`required`, the default) or is
    /// only reported (`best-effort`, which the operator names: `--sandbox best-effort`).
    static var failsClosed: Bool {
        guard let value = getenv(AppContainer.sandboxModeVariable) else { return true }
        return String(cString: value) != SandboxMode.bestEffort.rawValue
    }

    /// Confines the launch with every layer it can have, and says which it has. `failure` is
    /// set when a layer this machine offers could not be applied and the host requires every
    /// one (the default): the caller reports the layers, then fails the launch with it.
    static func apply(_ assignment: LaunchAssignment) -> (layers: [String: SandboxLayer], failure: String?) {
        var layers: [String: SandboxLayer] = ["pid_namespace": pidNamespace]
        guard assignment.confine else {
            for name in ["landlock", "seccomp", "no_new_privs"] {
                layers[name] = SandboxLayer(applied: false, detail: "confinement is off for this launch (--no-sandbox)")
            }
            return (layers, nil)
        }
        // Layers this machine offers (and the operator did not leave off) that did not apply.
        var failed: [String] = []
        layers["no_new_privs"] = bgtask_set_no_new_privs() == 0
            ? SandboxLayer(applied: true, detail: "set")
            : SandboxLayer(applied: false, detail: "prctl: \(String(cString: strerror(errno)))")
        if layers["no_new_privs"]?.applied == false { failed.append("no_new_privs") }
        if !pidNamespace.applied && namespacesOffered { failed.append("pid_namespace") }

        let switchedOff = layersSwitchedOff()
        if preparedRuleset < 0 && grantError == nil && !switchedOff.contains("landlock") { prepareRuleset() }
        var error = [CChar](repeating: 0, count: 512)
        if switchedOff.contains("landlock") {
            if preparedRuleset >= 0 { close(preparedRuleset) }
            preparedRuleset = -1
            layers["landlock"] = SandboxLayer(applied: false, detail: "left off by \(AppContainer.sandboxLayersSwitch) (a benchmark's switch)")
        } else if let grantError {
            layers["landlock"] = SandboxLayer(applied: false, detail: grantError)
            failed.append("landlock")
        } else if preparedRuleset < 0 {
            layers["landlock"] = SandboxLayer(applied: false, detail: preparationError ?? "landlock: not available in this kernel")
            // Offered (the kernel has an ABI) and yet not prepared: a failure, not an absence.
            if preparedABI > 0 { failed.append("landlock") }
        } else {
            var abi = Int(preparedABI)
            if bgtask_landlock_restrict(preparedRuleset, &error, error.count) != 0 { abi = 0 }
            preparedRuleset = -1
            signalsScoped = abi >= 6
            layers["landlock"] = abi > 0
                ? SandboxLayer(applied: true, detail: "ABI \(abi): files\(abi >= 6 ? ", signals and abstract sockets" : " only (signal and socket scoping need ABI 6)")")
                : SandboxLayer(applied: false, detail: text(error))
            if abi == 0 { failed.append("landlock") }
        }

        error = [CChar](repeating: 0, count: 512)
        if let installed = filterInSpare {
            layers["seccomp"] = installed
        } else if switchedOff.contains("seccomp") {
            layers["seccomp"] = SandboxLayer(applied: false, detail: "left off by \(AppContainer.sandboxLayersSwitch) (a benchmark's switch)")
        } else {
            layers["seccomp"] = bgtask_apply_syscall_filter(&error, error.count) == 0
                ? SandboxLayer(applied: true, detail: "deny-list filter, native ABI only")
                : SandboxLayer(applied: false, detail: text(error))
            if layers["seccomp"]?.applied == false { failed.append("seccomp") }
        }
        guard !failed.isEmpty, failsClosed else { return (layers, nil) }
        let reasons = failed.map { name in
            let detail = layers[name]?.detail ?? "not applied"
            return detail.hasPrefix(name + ": ") ? detail : "\(name): \(detail)"
        }.joined(separator: "; ")
        return (layers, "confinement failed closed: \(failed.joined(separator: ", ")) could not be applied, and this machine offers \(failed.count == 1 ? "it" : "them") (\(reasons)); fix the cause, or start the host with --sandbox best-effort to launch without \(failed.count == 1 ? "it" : "them")")
    }

    /// Whether this machine gives launches a PID namespace: the zygote's probe passed, or a
    /// spawned runner runs as root (which may always unshare one). A launch without one where
    /// it is offered fails closed.
    static var namespacesOffered: Bool {
        if switchedOff() { return false }
        return namespacesUnavailable == nil && startedAsRoot
    }

    /// Whether the launch began as root (noted by `grantLaunchPaths`, before `becomeApp`).
    nonisolated(unsafe) static var startedAsRoot = false

    /// Whether this zygote's spares install the system-call filter while they wait (its launches
    /// are confined, and the benchmark's switch does not leave the filter off). Set once, in the
    /// zygote, before its first spare.
    nonisolated(unsafe) static var spareFilters = false
    /// The filter this process installed while it was a spare: the launch's `seccomp` layer.
    nonisolated(unsafe) static var filterInSpare: SandboxLayer?

    /// In a spare, after its rehearsal and before it waits for a launch: the filter every
    /// confined launch gets (the same for every app), so that the launch does not pay for it on
    /// its way to the handler (the kernel checks and compiles the program: about 120 µs, a
    /// tenth of a launch through the host). The spare makes itself its processes' subreaper
    /// first (the runner's own call, later, is one the filter refuses), and sets
    /// no_new_privs first when it is not root (the kernel requires one or the other).
    /// A failure here is not final: the launch tries again in `apply` and reports that.
    /// Async-signal-safe: no — a spare, an ordinary process.
    static func installFilterInSpare() {
        _ = bgtask_set_child_subreaper()
        if geteuid() != 0 && bgtask_set_no_new_privs() != 0 { return }
        var error = [CChar](repeating: 0, count: 512)
        guard bgtask_apply_syscall_filter(&error, error.count) == 0 else { return }
        filterInSpare = SandboxLayer(applied: true, detail: "deny-list filter, native ABI only (installed in the spare before its launch)")
    }

    /// The layers `AppContainer.sandboxLayersSwitch` names (unset: none).
    static func layersSwitchedOff() -> Set<Substring> {
        guard let value = getenv(AppContainer.sandboxLayersSwitch) else { return [] }
        return Set(String(cString: value).split(separator: ","))
    }

    private static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Lends `strings` as a C array of C strings for the duration of `body`.
    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { UnsafePointer(strdup($0)) }
        defer { copies.forEach { free(UnsafeMutablePointer(mutating: $0)) } }
        return copies.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}

import Glibc

/// An app's container as iOS lays it out, and the environment that makes Linux's Foundation
/// resolve its directories inside it. Shared by the host, which prepares the directories and
/// sets the environment, and the runner, which applies it in a zygote child.
///
/// How Foundation on Linux finds each directory (swift-foundation and swift-corelibs-foundation,
/// read at the versions Swift 6.3 ships):
/// - `NSHomeDirectory()`, `homeDirectoryForCurrentUser`, `URL.homeDirectory`: `CFFIXED_USER_HOME`
///   first (the variable the iOS simulator sets), then the passwd entry (root's /root), then HOME.
/// - `urls(for: .documentDirectory)`: the home above + `Documents` (XDG user directories, none
///   configured under the container's XDG_CONFIG_HOME).
/// - `.cachesDirectory`: `XDG_CACHE_HOME`; `.applicationSupportDirectory`: `XDG_DATA_HOME`.
/// - `UserDefaults`: CoreFoundation's preferences, `XDG_CONFIG_HOME/<domain>.plist`.
/// - `NSTemporaryDirectory()`, `FileManager.temporaryDirectory`: `TMPDIR`.
public enum AppContainer {
    /// The directories of a container, parents first.
    public static let directories = [
        "Documents", "Library", "Library/Caches", "Library/Application Support", "Library/Preferences", "tmp",
    ]

    /// The directories of an app group's shared container, parents first.
    public static let groupDirectories = ["Library", "Library/Caches", "Library/Preferences"]

    /// The environment a launch of the app whose container is `path` runs with.
    public static func environment(container path: String) -> [String: String] {
        [
            "HOME": path,
            "CFFIXED_USER_HOME": path,
            "TMPDIR": path + "/tmp",
            "XDG_CONFIG_HOME": path + "/Library/Preferences",
            "XDG_CACHE_HOME": path + "/Library/Caches",
            "XDG_DATA_HOME": path + "/Library/Application Support",
        ]
    }

    /// Variables CoreFoundation reads once, when libFoundation is loaded (CFRuntime.c's
    /// `__CFEnv` keeps the pointers `getenv` returned then, and answers from them alone). A
    /// zygote child inherits the zygote's pointers, so a `setenv` after the fork is invisible to
    /// CoreFoundation (UserDefaults would land in the host user's ~/.config). The host starts the
    /// zygote with these reserved (`reservedValue`), and a child writes its values into the
    /// reserved bytes in place (`setInPlace`), where both `getenv` and CoreFoundation see them.
    public static let snapshottedVariables = ["HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"]

    /// `off` in the environment of a zygote or runner whose launches run unconfined
    /// (--no-sandbox): they make no PID namespace (which comes before the launch is known).
    public static let pidNamespaceSwitch = "BGTASK_PID_NAMESPACE"

    /// Layers a launch leaves off, comma-separated (`landlock`, `seccomp`), in the environment of
    /// a zygote or runner: the benchmark's switch to price one layer at a time
    /// (`bgtask-bench --only confinement`). Never set by the host; a launch that leaves a layer
    /// off says so in its record's `sandbox`, as for --no-sandbox.
    public static let sandboxLayersSwitch = "BGTASK_SANDBOX_LAYERS_OFF"

    /// `best-effort` in a launch's environment when the operator asked for it (`bgtask host
    /// --sandbox best-effort`): a layer the machine offers that cannot be applied is reported in
    /// the record and the launch runs. Unset (`required`): such a launch fails, with the reason.
    public static let sandboxModeVariable = "BGTASK_SANDBOX_MODE"

    /// `1` in the environment of a zygote whose launches are confined: each spare installs the
    /// system-call filter (the same for every app) while it waits, instead of the launch on its
    /// way to the handler. The zygote removes it from its environment at once.
    public static let zygoteConfinesSwitch = "BGTASK_ZYGOTE_CONFINES"

    /// A harmless placeholder with room for any path: "/" spelled with PATH_MAX - 1 slashes.
    public static let reservedValue = String(repeating: "/", count: Int(PATH_MAX) - 1)

    /// Sets `key` to `value`, in place when the current value is at least as long (keeping
    /// the string's address, which CoreFoundation may hold), with `setenv` otherwise.
    /// Only for a single-threaded process (a zygote child before it runs any other code).
    public static func setInPlace(_ key: String, _ value: String) {
        if let current = getenv(key), strlen(current) >= value.utf8.count {
            value.withCString { _ = strcpy(current, $0) }
        } else {
            setenv(key, value, 1)
        }
    }

    /// The shared container of app group `identifier` under `root` (the state directory's
    /// `groups`).
    public static func groupDirectory(root: String, identifier: String) -> String {
        root + "/" + identifier
    }

    /// Where CoreFoundation keeps the `UserDefaults` domain `domain` of a container (an app's
    /// or a group's): `UserDefaults(suiteName: group)` lands in the app's, iOS keeps it in the
    /// group's, so the runner links the first to the second.
    public static func preferencesFile(in directory: String, domain: String) -> String {
        directory + "/Library/Preferences/" + domain + ".plist"
    }
}

/// An app group the bundle is entitled to, with its shared directory.
public struct AppGroup: Codable, Sendable, Equatable {
    public var identifier: String
    public var directory: String

    public init(identifier: String, directory: String) {
        self.identifier = identifier
        self.directory = directory
    }
}

/// One confinement layer of a launch, as its run record reports it (DESIGN.md: "sandbox").
/// How much confinement the operator asks of every launch (`--sandbox`).
public enum SandboxMode: String, Codable, Sendable, CaseIterable {
    /// Every layer the machine offers, or the launch fails with the reason (the default).
    case required
    /// Every layer that applies; one the machine offers that cannot be applied is reported in
    /// the record's `sandbox`, and the launch runs without it.
    case bestEffort = "best-effort"
    /// None (`--no-sandbox`): for debugging a plugin the sandbox stops.
    case off
}

/// What becomes of an app's process when a launch's work is over (`--app-lifecycle`).
public enum AppLifecycle: String, Codable, Sendable, CaseIterable {
    /// As on iOS (the default): the app finishes its main queue's turn and is suspended, its
    /// memory kept; the app's next launch resumes the same process, until memory pressure
    /// evicts it or it dies.
    case ios
    /// A fresh process per launch, which exits when the launch's work is over: no state
    /// survives from one launch to the next (catches apps that rely on it by accident).
    case fresh
}

public struct SandboxLayer: Codable, Sendable, Equatable {
    public var applied: Bool
    /// What the layer is (`ABI 7`), or why the launch runs without it.
    public var detail: String

    public init(applied: Bool, detail: String) {
        self.applied = applied
        self.detail = detail
    }

    /// The layers' names, in the record's order.
    public static let names = ["landlock", "seccomp", "no_new_privs", "pid_namespace", "uid"]
}

/// Who a launch runs as, when the host can choose (it runs as root): the app's own uid, its gid,
/// and its app groups' gids as supplementary groups.
public struct LaunchIdentity: Codable, Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var groups: [UInt32]

    public init(uid: UInt32, gid: UInt32, groups: [UInt32]) {
        self.uid = uid
        self.gid = gid
        self.groups = groups
    }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import Foundation
import Glibc
import Logging
import Testing

/// The host as a service: per-launch cgroup limits (memory.max, pids.max, cgroup.kill), `--cgroup
/// auto`'s delegation check and claim, the systemd units and `Packaging/install.sh`.
///
/// Nothing here writes to the machine's own cgroup hierarchy: the cgroup tests play the kernel
/// with plain files in a temporary directory (a fake /proc/self/cgroup, mountinfo and cgroup
/// tree), and the install tests stage into a temporary root or only print.
@Suite struct ServiceTests {
    // MARK: A launch's cgroup

    @Test func aLaunchGroupWritesItsLimitsAndEndsWithCgroupKill() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let group = try FakeCgroup(scratch.url.appendingPathComponent("bgtask-L1"),
                                   files: ["memory.max", "memory.swap.max", "memory.oom.group", "memory.peak", "pids.max", "cgroup.procs", "cgroup.kill"])
        var launch = CgroupV2.LaunchGroup(url: group.url)
        try launch.configure(memoryMax: 64 << 20, processMax: 512)
        try launch.add(4242)
        #expect(group["memory.max"] == "67108864")
        #expect(group["memory.swap.max"] == "0")
        #expect(group["memory.oom.group"] == "1")
        #expect(group["pids.max"] == "512")
        #expect(group["cgroup.procs"] == "4242")
        #expect(launch.processLimit == 512)
        #expect(launch.fallbacks.isEmpty, "\(launch.fallbacks)")
        launch.killAll()
        #expect(group["cgroup.kill"] == "1")
    }

    @Test func aLaunchGroupWithoutAProcessLimitOrMemoryLimitWritesNeither() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let group = try FakeCgroup(scratch.url.appendingPathComponent("bgtask-L2"),
                                   files: ["memory.max", "memory.oom.group", "memory.peak", "pids.max", "cgroup.kill"])
        var launch = CgroupV2.LaunchGroup(url: group.url)
        try launch.configure(memoryMax: nil, processMax: nil)
        #expect(group["memory.max"] == "")
        #expect(group["pids.max"] == "")
        #expect(launch.processLimit == nil)
        #expect(launch.fallbacks.isEmpty)
    }

    /// An older kernel (or a directory without the pids controller) lacks files: the group says
    /// which, does without them, and kills one by one after freezing the group.
    @Test func aLaunchGroupFallsBackWhereTheKernelLacksAFileAndSaysWhich() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let group = try FakeCgroup(scratch.url.appendingPathComponent("bgtask-L3"), files: ["memory.max", "cgroup.procs", "cgroup.freeze"])
        var launch = CgroupV2.LaunchGroup(url: group.url)
        try launch.configure(memoryMax: 64 << 20, processMax: 512)
        #expect(group["memory.max"] == "67108864")
        #expect(launch.processLimit == nil, "no pids.max: no process limit")
        for file in ["pids.max", "cgroup.kill", "memory.oom.group", "memory.peak"] {
            #expect(launch.fallbacks.contains { $0.hasPrefix(file + " is missing") }, "\(file): \(launch.fallbacks)")
        }

        // Without cgroup.kill, the processes cgroup.procs lists are killed one by one.
        let sleeper = Process()
        sleeper.executableURL = URL(fileURLWithPath: "/bin/sleep")
        sleeper.arguments = ["30"]
        try sleeper.run()
        try "\(sleeper.processIdentifier)\n".write(to: group.url.appendingPathComponent("cgroup.procs"), atomically: false, encoding: .utf8)
        launch.killAll()
        sleeper.waitUntilExit()
        #expect(sleeper.terminationReason == .uncaughtSignal)
        #expect(sleeper.terminationStatus == SIGKILL)
        #expect(group["cgroup.freeze"] == "1", "frozen first, so nothing in it forks while the list is read")
    }

    /// A memory.max write the kernel refuses is an error, not a fallback: the launch is sampled.
    @Test func aLaunchGroupWithoutTheMemoryControllerIsAnError() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let group = try FakeCgroup(scratch.url.appendingPathComponent("bgtask-L4"), files: ["pids.max"])
        var launch = CgroupV2.LaunchGroup(url: group.url)
        #expect(throws: BGTaskError.self) { try launch.configure(memoryMax: 1 << 20, processMax: 16) }
    }

    @Test func aCgroupDirectorySaysWhatItsLaunchesWillGoWithout() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let full = try FakeCgroup(scratch.url.appendingPathComponent("full"), contents: [
            "cgroup.controllers": "memory pids", "cgroup.subtree_control": "memory pids", "cgroup.kill": ""])
        #expect(try CgroupV2.LaunchGroup.validate(root: full.url).isEmpty)

        let bare = try FakeCgroup(scratch.url.appendingPathComponent("bare"), contents: [
            "cgroup.controllers": "memory", "cgroup.subtree_control": "memory"])
        let notes = try CgroupV2.LaunchGroup.validate(root: bare.url)
        #expect(notes.contains { $0.contains("pids controller is not enabled") && $0.contains("pids.max") }, "\(notes)")
        #expect(notes.contains { $0.hasPrefix("cgroup.kill is missing") }, "\(notes)")

        let noMemory = try FakeCgroup(scratch.url.appendingPathComponent("nomem"), contents: [
            "cgroup.controllers": "pids", "cgroup.subtree_control": "pids"])
        #expect(throws: BGTaskError.self) { try CgroupV2.LaunchGroup.validate(root: noMemory.url) }
    }

    // MARK: --cgroup auto: finding a delegation

    @Test func aDelegatedCgroupIsFound() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let machine = try FakeMachine(scratch.url)
        try #require(machine.markDelegated(), "skipped: this file system has no user extended attributes for a fake delegation mark")
        #expect(machine.delegation.find().delegatedPath == machine.service.url.path)
    }

    /// Each way a cgroup can fail to be delegated to the host, with the reason `auto` logs.
    @Test func autoRefusesWhatIsNotDelegatedAndSaysWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        var cases: [(String, (FakeMachine) throws -> Void, String)] = [
            ("cgroup v1 only", { try $0.write(cgroup: "4:memory:/user.slice\n1:name=systemd:/user.slice\n") }, "no cgroup v2 hierarchy"),
            ("root of the hierarchy", { try $0.write(cgroup: "0::/\n") }, "root of the cgroup v2 hierarchy"),
            ("no cgroup2 mount", { try $0.write(mountInfo: "22 1 0:21 / /proc rw - proc proc rw\n") }, "no cgroup2 file system"),
            ("hybrid: controllers on v1", { try $0.service.set("cgroup.controllers", "") }, "lacks memory and pids"),
            ("no pids", { try $0.service.set("cgroup.controllers", "cpu io memory") }, "lacks pids"),
            ("other processes", { try $0.service.set("cgroup.procs", "4242\n777\n") }, "holds other processes (pids 777)"),
        ]
        cases.append(("no delegation mark, as root", { _ in }, "not delegated to this process"))
        for (index, (name, breakIt, reason)) in cases.enumerated() {
            let machine = try FakeMachine(scratch.url.appendingPathComponent("m\(index)"))
            if name != "no delegation mark, as root" { _ = machine.markDelegated() }
            try breakIt(machine)
            guard case .refused(let why) = machine.delegation.find() else {
                Issue.record("\(name): found a delegation")
                continue
            }
            #expect(why.contains(reason), "\(name): \(why)")
        }
    }

    /// Not root: a cgroup this uid owns is delegated to it (systemd chowns it for User=), mark
    /// or not. Root can write every cgroup, so for root only the mark counts (tested above).
    @Test func aCgroupOwnedByTheHostsUidIsDelegatedWithoutAMark() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        var machine = try FakeMachine(scratch.url)
        if getuid() == 0 {
            #expect(chown(machine.service.url.path, 4242, 4242) == 0)
            machine.delegation.euid = 4242
        } else {
            machine.delegation.euid = getuid()
        }
        #expect(machine.delegation.find().delegatedPath == machine.service.url.path)
    }

    @Test func theCgroupIsFoundUnderTheMountThatShowsIt() {
        let path = "/system.slice/bgtask.service"
        let unified = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        #expect(CgroupV2.Delegation.directory(of: path, mountInfo: unified)?.path == "/sys/fs/cgroup/unified/system.slice/bgtask.service")
        // A container's mount shows only its own subtree: its root is the container's cgroup.
        let container = "35 31 0:29 /system.slice /run/my\\040cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
        #expect(CgroupV2.Delegation.directory(of: path, mountInfo: container)?.path == "/run/my cgroup/bgtask.service")
        #expect(CgroupV2.Delegation.directory(of: "/user.slice/x", mountInfo: container) == nil)
        // cgroup v1 mounts are not it.
        #expect(CgroupV2.Delegation.directory(of: path, mountInfo: "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") == nil)
    }

    // MARK: --cgroup auto: claiming it

    /// The host moves itself into host/ (a process must live in a leaf), enables memory and pids
    /// for the children, makes launches/ with them enabled for launch groups, and ends the
    /// groups a previous host left.
    @Test func claimingMovesTheHostIntoALeafAndEnablesControllersForLaunches() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let machine = try FakeMachine(scratch.url)
        try #require(machine.markDelegated(), "skipped: this file system has no user extended attributes for a fake delegation mark")
        // The kernel makes a new cgroup's files; the fake has them ready.
        let host = try FakeCgroup(machine.service.url.appendingPathComponent("host"), files: ["cgroup.procs"])
        let launches = try FakeCgroup(machine.service.url.appendingPathComponent("launches"), contents: [
            "cgroup.controllers": "memory pids", "cgroup.subtree_control": "", "cgroup.kill": ""])
        let stale = try FakeCgroup(launches.url.appendingPathComponent("bgtask-stale"), files: ["cgroup.kill"])

        let log = CapturedLog()
        let root = LaunchSupervisor.claimDelegatedCgroup(machine.delegation, logger: log.logger)
        #expect(root?.path == launches.url.path)
        #expect(host["cgroup.procs"] == "4242")
        #expect(machine.service["cgroup.subtree_control"] == "+memory +pids")
        #expect(launches["cgroup.subtree_control"] == "+memory +pids")
        #expect(stale["cgroup.kill"] == "1", "a stale launch group is killed")
        #expect(log.lines.count == 1, "\(log.lines)")
        #expect(log.lines.first?.hasPrefix("info cgroup auto: using the delegated cgroup \(machine.service.url.path)") == true, "\(log.lines)")
    }

    @Test func withoutADelegationAutoSaysWhyInOneLine() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let machine = try FakeMachine(scratch.url)
        try machine.write(cgroup: "0::/\n")
        let log = CapturedLog()
        #expect(LaunchSupervisor.claimDelegatedCgroup(machine.delegation, logger: log.logger) == nil)
        #expect(log.lines.count == 1)
        #expect(log.lines.first?.hasPrefix("warning cgroup auto: no delegated cgroup v2, memory is sampled") == true, "\(log.lines)")
        #expect(machine.service["cgroup.subtree_control"] == "", "nothing written")
    }

    /// `bgtask run --cgroup auto` on this machine. It cannot claim anything here, whatever the
    /// machine: the CLI shares its cgroup with this test process, and a cgroup holding another
    /// process is never claimed. The launch runs, sampled, and one line says why.
    @Test func runWithCgroupAutoFallsBackToTheSamplerAndSaysWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")
        let (record, result) = try scratch.run(app, ["--task", "com.example.feed.refresh:refresh", "--cgroup", "auto"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(record.memoryMechanism == "sampler")
        #expect(record.processLimit == nil)
        let lines = result.stderr.split(separator: "\n").filter { $0.contains("cgroup auto:") }
        #expect(lines.count == 1, "\(result.stderr)")
        #expect(lines.first?.contains("no delegated cgroup v2, memory is sampled") == true, "\(result.stderr)")
    }

    @Test func theProcessLimitIsARecordFieldAndAnOption() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app")
        var (record, _) = try scratch.run(app, ["--task", "com.example.feed.refresh:refresh"])
        #expect(record.processLimit == nil)
        var object = try #require(try JSONSerialization.jsonObject(with: record.jsonData()) as? [String: Any])
        #expect(object["process_limit"] == nil, "absent when the launch had none")
        #expect(object["memory_mechanism"] as? String == "sampler")
        record.processLimit = 512
        object = try #require(try JSONSerialization.jsonObject(with: record.jsonData()) as? [String: Any])
        #expect(object["process_limit"] as? Int == 512)
        #expect(try RunRecord.decode(record.jsonData()) == record)
        #expect(record.description.contains("processes: at most 512 (pids.max)"))

        let help = try runCLI(["host", "--help"])
        #expect(help.stdout.contains("--max-processes"), "\(help.stdout)")
        #expect(help.stdout.contains("<dir|auto>"), "\(help.stdout)")
        let bad = try runCLI(["run", app.path, "--task", "com.example.feed.refresh:refresh", "--max-processes=-1", "--state", scratch.state.path])
        #expect(bad.status == 64)
        #expect(bad.stderr.contains("--max-processes"), "\(bad.stderr)")
    }

    // MARK: The systemd units

    static let systemUnit = Products.packageRoot.appendingPathComponent("Packaging/systemd/bgtask.service")
    static let userUnit = Products.packageRoot.appendingPathComponent("Packaging/systemd/user/bgtask.service")

    /// What the units must say, directive by directive (docs/host.md explains each).
    @Test func theUnitsDelegateACgroupAndHardenTheHost() throws {
        for url in [Self.systemUnit, Self.userUnit] {
            let directives = try Self.directives(url)
            let name = url.path
            for (key, value) in [
                ("Delegate", "yes"), ("KillMode", "mixed"), ("Restart", "on-failure"), ("OOMPolicy", "continue"),
                ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"), ("LockPersonality", "yes"),
                ("RestrictRealtime", "yes"), ("SystemCallArchitectures", "native"),
                ("RestrictAddressFamilies", "AF_UNIX AF_NETLINK AF_INET AF_INET6"),
            ] {
                #expect(directives[key] == value, "\(name): \(key)=\(directives[key] ?? "(none)")")
            }
            #expect(directives["ExecStart"]?.hasSuffix("--cgroup auto") == true, "\(name)")
            // The delegated subtree must stay writable.
            #expect(directives["ProtectControlGroups"] == nil, "\(name)")
            #expect(directives["MemoryMax"] != nil && directives["TasksMax"] != nil, "\(name)")
            // Longer than the host's default grace (5 s) plus its records.
            let stop = try #require(directives["TimeoutStopSec"].flatMap { Int($0.dropLast()) })
            #expect(stop > 5, "\(name)")
            // Every directive has its reason in a comment just above it.
            let lines = try String(contentsOf: url, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
            var previous = ""
            for line in lines {
                if line.contains("="), !line.hasPrefix("#"), !line.hasPrefix("["), !previous.hasPrefix("#") {
                    let key = line.split(separator: "=").first.map(String.init) ?? ""
                    // Directives of one idea may share their comment (e.g. ProtectHome under ProtectSystem).
                    if !Self.sharesAComment.contains(key) { Issue.record("\(name): no comment above \(line)") }
                }
                if !line.isEmpty { previous = String(line) }
            }
        }
        let system = try Self.directives(Self.systemUnit)
        #expect(system["ExecStart"] == "/usr/local/bin/bgtask host --plugins /var/lib/bgtask/plugins --state /var/lib/bgtask --cgroup auto")
        #expect(system["StateDirectory"] == "bgtask")
        #expect(system["ReadOnlyPaths"] == "-/var/lib/bgtask/plugins")
        let user = try Self.directives(Self.userUnit)
        #expect(user["ReadWritePaths"] == "%h/.local/state/bgtask")
        #expect(user["PrivateUsers"] == "yes", "the namespace options need it in a user manager")
    }

    static let sharesAComment: Set<String> = ["SystemCallErrorNumber", "ProtectHome", "ReadWritePaths", "RestrictSUIDSGID",
                                              "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectClock",
                                              "ProtectHostname", "LockPersonality", "RestrictRealtime", "StateDirectoryMode",
                                              "RestartSec", "Documentation"]

    /// `systemd-analyze verify` accepts both units as install.sh installs them: no unknown key,
    /// no bad value. (The staged binary stands in for PREFIX/bin/bgtask: verify checks that
    /// ExecStart's binary exists.)
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-analyze"),
                   "skipped: systemd-analyze is not installed (apt-get install systemd)"))
    func systemdAnalyzeVerifiesBothInstalledUnits() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let stage = scratch.url.appendingPathComponent("stage").path
        let home = "/home/tester"
        for user in [false, true] {
            let installed = try runCommand(["/bin/bash", Self.installScript, "--destdir", stage, "--prefix", "/opt/bgtask",
                                            "--no-build", "--build-dir", Products.directory.path] + (user ? ["--user"] : []),
                                           environment: ["HOME": home, "XDG_CONFIG_HOME": ""])
            try #require(installed.status == 0, "\(installed.stderr)")
            let unit = stage + (user ? "\(home)/.config/systemd/user" : "/etc/systemd/system") + "/bgtask.service"
            let text = try String(contentsOfFile: unit, encoding: .utf8)
            #expect(text.contains("\nExecStart=/opt/bgtask/bin/bgtask host "), "\(unit)")
            let checked = scratch.url.appendingPathComponent(user ? "user-bgtask.service" : "bgtask.service")
            try text.replacingOccurrences(of: "ExecStart=/opt/bgtask/bin/bgtask ", with: "ExecStart=\(stage)/opt/bgtask/bin/bgtask ")
                .write(to: checked, atomically: true, encoding: .utf8)
            let runtime = scratch.url.appendingPathComponent("runtime")
            try FileManager.default.createDirectory(at: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            let verify = try runCommand(["/usr/bin/systemd-analyze"] + (user ? ["--user"] : []) + ["verify", "--man=no", checked.path],
                                        environment: ["XDG_RUNTIME_DIR": runtime.path])
            #expect(verify.status == 0, "\(checked.lastPathComponent): \(verify.stderr)")
            #expect(verify.stderr.isEmpty, "\(checked.lastPathComponent): \(verify.stderr)")
        }
    }

    // MARK: Packaging/install.sh

    static let installScript = Products.packageRoot.appendingPathComponent("Packaging/install.sh").path

    /// `--print` runs nothing: with an empty PATH any command the script tried to run would fail,
    /// so it is the printout alone, and the staging root stays empty.
    @Test func installPrintsWhatItWouldDoAndDoesNothing() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let emptyPath = scratch.url.appendingPathComponent("no-commands")
        try FileManager.default.createDirectory(at: emptyPath, withIntermediateDirectories: true)
        let stage = scratch.url.appendingPathComponent("stage").path
        let repo = Products.packageRoot.path

        let system = try runCommand(["/bin/bash", Self.installScript, "--print", "--destdir", stage, "--prefix", "/opt/bgtask"],
                                    environment: ["PATH": emptyPath.path])
        #expect(system.status == 0, "\(system.stderr)")
        #expect(system.stderr.isEmpty, "\(system.stderr)")
        let lines = system.stdout.split(separator: "\n").map(String.init)
        for expected in [
            "swift build -c release --package-path \(repo) --product bgtask",
            "swift build -c release --package-path \(repo) --product bgtask-runner",
            "install -d -m 0755 \(stage)/opt/bgtask/bin",
            "install -s -m 0755 \(repo)/.build/release/bgtask \(stage)/opt/bgtask/bin/bgtask",
            "install -s -m 0755 \(repo)/.build/release/bgtask-runner \(stage)/opt/bgtask/bin/bgtask-runner",
            "install -m 0644 \(repo)/README.md \(stage)/opt/bgtask/share/doc/bgtask/README.md",
            "sed -e 's|^ExecStart=/usr/local/bin/bgtask |ExecStart=/opt/bgtask/bin/bgtask |' -e 's|^Documentation=file:///usr/local/share/doc/bgtask/|Documentation=file:///opt/bgtask/share/doc/bgtask/|' \(repo)/Packaging/systemd/bgtask.service > \(stage)/etc/systemd/system/bgtask.service",
            "install -d -m 0711 \(stage)/var/lib/bgtask",
            "install -d -m 0755 \(stage)/var/lib/bgtask/plugins",
            "# then: systemctl enable --now bgtask; logs: journalctl -u bgtask",
        ] {
            #expect(lines.contains(expected), "missing: \(expected)\n\(system.stdout)")
        }
        #expect(!system.stdout.contains("daemon-reload"), "a staged install leaves systemd alone")
        #expect(!FileManager.default.fileExists(atPath: stage), "a dry run writes nothing")

        // Without a staging root it would reload systemd; printed only, under the same empty PATH.
        let live = try runCommand(["/bin/bash", Self.installScript, "--print", "--no-build"], environment: ["PATH": emptyPath.path])
        #expect(live.status == 0, "\(live.stderr)")
        #expect(live.stdout.contains("install -s -m 0755 \(repo)/.build/release/bgtask /usr/local/bin/bgtask\n"))
        #expect(live.stdout.contains("> /etc/systemd/system/bgtask.service\n"))
        #expect(live.stdout.contains("\nsystemctl daemon-reload\n"))
        #expect(!live.stdout.contains("swift build"), "--no-build")

        let user = try runCommand(["/bin/bash", Self.installScript, "--print", "--user", "--destdir", stage],
                                  environment: ["PATH": emptyPath.path, "HOME": "/home/tester", "XDG_CONFIG_HOME": ""])
        #expect(user.status == 0, "\(user.stderr)")
        for expected in [
            "install -s -m 0755 \(repo)/.build/release/bgtask \(stage)/home/tester/.local/bin/bgtask",
            "sed -e 's|^ExecStart=%h/.local/bin/bgtask |ExecStart=/home/tester/.local/bin/bgtask |' -e 's|^Documentation=file:///usr/local/share/doc/bgtask/|Documentation=file:///home/tester/.local/share/doc/bgtask/|' \(repo)/Packaging/systemd/user/bgtask.service > \(stage)/home/tester/.config/systemd/user/bgtask.service",
            "install -d -m 0700 \(stage)/home/tester/.local/state/bgtask",
            "# then: systemctl --user enable --now bgtask; logs: journalctl --user -u bgtask",
        ] {
            #expect(user.stdout.contains(expected + "\n"), "missing: \(expected)\n\(user.stdout)")
        }
        #expect(!FileManager.default.fileExists(atPath: stage))

        // --no-strip installs the binaries as built.
        let whole = try runCommand(["/bin/bash", Self.installScript, "--print", "--no-build", "--no-strip"], environment: ["PATH": emptyPath.path])
        #expect(whole.status == 0, "\(whole.stderr)")
        #expect(whole.stdout.contains("install -m 0755 \(repo)/.build/release/bgtask /usr/local/bin/bgtask\n"), "\(whole.stdout)")
    }

    /// A real install, into a staging root, of the binaries this test run built.
    @Test func installStagesTheBinariesTheUnitAndTheDirectories() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let stage = scratch.url.appendingPathComponent("stage").path
        let result = try runCommand(["/bin/bash", Self.installScript, "--destdir", stage, "--prefix", "/opt/bgtask",
                                     "--no-build", "--build-dir", Products.directory.path])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr.contains("start it: systemctl enable --now bgtask; logs: journalctl -u bgtask"), "\(result.stderr)")
        let files = FileManager.default
        for binary in ["bgtask", "bgtask-runner"] {
            let installed = "\(stage)/opt/bgtask/bin/\(binary)", built = Products.directory.appendingPathComponent(binary).path
            #expect(files.isExecutableFile(atPath: installed), "\(binary)")
            // Stripped, and smaller for it; the build directory keeps the unstripped one.
            #expect(try Self.hasSymbolTable(installed) == false, "\(binary) is installed stripped")
            #expect(try Self.hasSymbolTable(built), "\(binary) stays unstripped in the build directory")
            let sizes = try [installed, built].map { try files.attributesOfItem(atPath: $0)[.size] as? Int ?? 0 }
            #expect(sizes[0] > 0 && sizes[0] < sizes[1], "\(binary): \(sizes[0]) bytes installed, \(sizes[1]) built")
        }
        // The stripped CLI runs.
        let version = try runCommand(["\(stage)/opt/bgtask/bin/bgtask", "--version"])
        #expect(version.status == 0 && !version.stdout.isEmpty, "\(version.stderr)")
        #expect(files.fileExists(atPath: "\(stage)/opt/bgtask/share/doc/bgtask/README.md"))
        let unit = try String(contentsOfFile: "\(stage)/etc/systemd/system/bgtask.service", encoding: .utf8)
        let original = try String(contentsOf: Self.systemUnit, encoding: .utf8)
        // Only the two paths changed.
        #expect(unit == original
            .replacingOccurrences(of: "\nExecStart=/usr/local/bin/", with: "\nExecStart=/opt/bgtask/bin/")
            .replacingOccurrences(of: "\nDocumentation=file:///usr/local/", with: "\nDocumentation=file:///opt/bgtask/"))
        #expect(unit.contains("\nExecStart=/opt/bgtask/bin/bgtask host --plugins /var/lib/bgtask/plugins"))
        #expect(Self.mode("\(stage)/var/lib/bgtask") == 0o711)
        #expect(Self.mode("\(stage)/var/lib/bgtask/plugins") == 0o755)
        #expect(Self.mode("\(stage)/etc/systemd/system/bgtask.service") == 0o644)
    }

    @Test func installRefusesBadArguments() throws {
        for (arguments, message) in [(["--bogus"], "unknown argument '--bogus'"), (["--prefix", "relative"], "must be an absolute path"),
                                     (["--prefix", "/a b"], "whitespace")] {
            let result = try runCommand(["/bin/bash", Self.installScript, "--print"] + arguments)
            #expect(result.status == 64, "\(arguments)")
            #expect(result.stderr.contains(message), "\(arguments): \(result.stderr)")
        }
        let missing = try runCommand(["/bin/bash", Self.installScript, "--destdir", "/nonexistent-stage", "--no-build", "--build-dir", "/nonexistent"])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("/nonexistent/bgtask is not built"), "\(missing.stderr)")
    }

    // MARK: Helpers

    /// `Key=value` lines of a unit file (the last one wins, as in systemd for these keys).
    static func directives(_ url: URL) throws -> [String: String] {
        var result: [String: String] = [:]
        for line in try String(contentsOf: url, encoding: .utf8).split(separator: "\n") where !line.hasPrefix("#") && !line.hasPrefix("[") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            result[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return result
    }

    static func mode(_ path: String) -> mode_t? {
        var info = stat()
        return stat(path, &info) == 0 ? info.st_mode & 0o7777 : nil
    }

    /// Whether the ELF64 file at `path` has a symbol table (a section of type SHT_SYMTAB), which
    /// `strip` removes (`file` then says "stripped"), read from its section headers.
    static func hasSymbolTable(_ path: String) throws -> Bool {
        let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        func read<T: FixedWidthInteger>(_ data: Data, at offset: Int, as _: T.Type) -> T {
            data.withUnsafeBytes { T(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: T.self)) }
        }
        let header = try handle.read(upToCount: 64) ?? Data()
        try #require(header.count == 64 && header.prefix(4) == Data([0x7F, 0x45, 0x4C, 0x46]) && header[4] == 2, "\(path) is not an ELF64 file")
        let sectionsOffset = read(header, at: 0x28, as: UInt64.self)
        let entrySize = Int(read(header, at: 0x3A, as: UInt16.self)), count = Int(read(header, at: 0x3C, as: UInt16.self))
        try handle.seek(toOffset: sectionsOffset)
        let sections = try handle.read(upToCount: entrySize * count) ?? Data()
        try #require(sections.count == entrySize * count, "\(path): section headers cut short")
        return (0..<count).contains { read(sections, at: $0 * entrySize + 4, as: UInt32.self) == 2 }
    }
}

/// A cgroup directory made of plain files: what the kernel would show.
struct FakeCgroup {
    let url: URL

    init(_ url: URL, files: [String] = [], contents: [String: String] = [:]) throws {
        self.url = url
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        for file in files { try set(file, "") }
        for (file, text) in contents { try set(file, text) }
    }

    func set(_ file: String, _ text: String) throws {
        try text.write(to: url.appendingPathComponent(file), atomically: false, encoding: .utf8)
    }

    subscript(file: String) -> String? {
        try? String(contentsOf: url.appendingPathComponent(file), encoding: .utf8)
    }
}

/// A machine as `--cgroup auto` reads it: /proc/self/cgroup, /proc/self/mountinfo and a cgroup2
/// mount with the host's service cgroup in it, delegated but for its mark, holding only the
/// (fake) host process 4242.
struct FakeMachine {
    let root: URL
    let service: FakeCgroup
    var delegation: CgroupV2.Delegation

    init(_ root: URL) throws {
        self.root = root
        let mount = root.appendingPathComponent("sys/fs/cgroup")
        service = try FakeCgroup(mount.appendingPathComponent("system.slice/bgtask.service"), contents: [
            "cgroup.controllers": "cpu io memory pids\n", "cgroup.subtree_control": "", "cgroup.procs": "4242\n"])
        delegation = CgroupV2.Delegation(selfCgroupFile: root.appendingPathComponent("self-cgroup").path,
                                         mountInfoFile: root.appendingPathComponent("self-mountinfo").path,
                                         pid: 4242, euid: 0)
        try write(cgroup: "0::/system.slice/bgtask.service\n")
        try write(mountInfo: """
            22 1 0:21 / /proc rw,nosuid - proc proc rw
            31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
            35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
            41 31 0:38 / \(mount.path) rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate

            """)
    }

    func write(cgroup: String) throws {
        try cgroup.write(toFile: delegation.selfCgroupFile, atomically: false, encoding: .utf8)
    }

    func write(mountInfo: String) throws {
        try mountInfo.write(toFile: delegation.mountInfoFile, atomically: false, encoding: .utf8)
    }

    /// Sets `user.delegate=1` on the service cgroup, as systemd does for `Delegate=yes`. False
    /// where the file system has no user extended attributes.
    func markDelegated() -> Bool {
        typealias SetXattr = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeRawPointer?, Int, Int32) -> Int32
        guard let symbol = dlsym(nil, "setxattr") else { return false }
        let setxattr = unsafeBitCast(symbol, to: SetXattr.self)
        return setxattr(service.url.path, "user.delegate", "1", 1, 0) == 0
    }
}

/// Log lines (`level message`) a test can read.
final class CapturedLog: @unchecked Sendable {
    private let lock = NSLock()
    private var captured: [String] = []

    var lines: [String] { lock.withLock { captured } }

    var logger: Logger {
        Logger(label: "test") { _ in Handler(log: self) }
    }

    struct Handler: LogHandler {
        let log: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String,
                 file: String, function: String, line: UInt) {
            log.lock.withLock { log.captured.append("\(level) \(message)") }
        }
    }
}

extension CgroupV2.Delegation.Finding {
    var delegatedPath: String? {
        if case .delegated(let url) = self { return url.path }
        return nil
    }
}

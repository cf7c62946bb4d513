@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing
import _BGTaskSystemShims

/// Issue 28: confinement fails closed. A layer this machine offers that cannot be applied fails
/// the launch with the reason, unless the operator asked for less (`--sandbox best-effort`); a
/// root host refuses a state directory its apps' uids cannot reach; a bundle may live in a
/// private directory (its library is opened before the launch drops root and loaded through
/// that descriptor). Root only: the layers at stake are a root host's.
@Suite(.serialized) struct FailClosedTests {
    static let id = "com.example.iosapp"
    static let stack = Products.packageRoot.appendingPathComponent("Tests/Fixtures/Confinement/landlock_stack.py").path

    /// A host whose every launch meets a full Landlock stack (the kernel refuses a 17th domain:
    /// E2BIG), so its Landlock layer cannot be applied for a real reason.
    func launchUnderFullLandlockStack(_ scratch: Scratch, mode: String?) throws -> RunRecord {
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual"] + (mode.map { ["--sandbox", $0] } ?? []))
        host.launcher = ["/usr/bin/python3", Self.stack]
        let staged = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Info.plist", name: "staged-IOSApp.app")
        try FileManager.default.moveItem(at: staged, to: host.plugins.appendingPathComponent("IOSApp.app"))
        try host.start()
        defer { host.stop() }
        let result = try host.cli(["simulate-launch", "\(Self.id).mainqueue", "--force", "--type", "refresh", "--json"])
        return try #require(try? RunRecord.decode(Data(result.stdout.utf8)), "no record: \(result.stdout) \(result.stderr)")
    }

    @Test(.enabled(if: geteuid() == 0 && Landlock.available))
    func aLayerTheMachineOffersThatCannotBeAppliedFailsTheLaunch() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let record = try launchUnderFullLandlockStack(scratch, mode: nil)
        #expect(record.termination == .launchFailed)
        let error = record.error ?? ""
        #expect(error.contains("confinement failed closed"), "\(error)")
        #expect(error.contains("landlock") && error.contains("Argument list too long"), "\(error)")
        #expect(error.contains("--sandbox best-effort"), "\(error)")
        #expect(record.task("\(Self.id).mainqueue")?.outcome == .notRegistered, "no app code ran")
        // The record still says what the launch had and what it lacked.
        #expect(record.sandbox?["landlock"]?.applied == false)
        #expect(record.sandbox?["uid"]?.applied == true)
    }

    @Test(.enabled(if: geteuid() == 0 && Landlock.available))
    func bestEffortRunsWithoutTheLayerAndSaysWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let record = try launchUnderFullLandlockStack(scratch, mode: "best-effort")
        #expect(record.termination == .suspended, "\(record.error ?? "")")
        #expect(record.task("\(Self.id).mainqueue")?.outcome == .succeeded)
        let landlock = try #require(record.sandbox?["landlock"])
        #expect(!landlock.applied)
        #expect(landlock.detail.contains("Argument list too long"), "\(landlock.detail)")
        #expect(record.sandbox?["seccomp"]?.applied == true)
    }

    /// A spawned runner (`bgtask run`) under a full Landlock stack cannot make its PID
    /// namespace's mounts (a Landlock domain may not change mounts): the launch fails before it
    /// loads the plugin, and the record says why in the runner's words, not only a status.
    @Test(.enabled(if: geteuid() == 0 && Landlock.available))
    func aSpawnedRunnerThatCannotMakeItsNamespaceFailsWithItsReason() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Info.plist")
        let result = try runCommand(["/usr/bin/python3", Self.stack, Products.cli, "run", app.path, "--json",
                                     "--task", "\(Self.id).mainqueue:refresh", "--state", scratch.state.path])
        let record = try #require(try? RunRecord.decode(Data(result.stdout.utf8)), "no record: \(result.stdout) \(result.stderr)")
        #expect(record.termination == .launchFailed)
        #expect(record.error?.contains("before loading the plugin (it said: bgtask-runner:") == true, "\(record.error ?? "")")
        #expect(record.error?.contains("mounts") == true, "\(record.error ?? "")")
    }

    @Test(.enabled(if: geteuid() == 0))
    func aRootHostRefusesAStateDirectoryItsAppsCannotReach() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let home = scratch.url.appendingPathComponent("home")
        try FileManager.default.createDirectory(at: home, withIntermediateDirectories: true)
        chmod(home.path, 0o700)
        let state = home.appendingPathComponent("state").path
        let plugins = scratch.url.appendingPathComponent("plugins").path
        try FileManager.default.createDirectory(atPath: plugins, withIntermediateDirectories: true)
        let result = try runCLI(["host", "--plugins", plugins, "--state", state], timeout: .seconds(30))
        #expect(result.status == 1)
        #expect(result.stderr.contains("cannot reach their containers"), "\(result.stderr)")
        #expect(result.stderr.contains("\(home.path) is mode 700"), "\(result.stderr)")
        #expect(result.stderr.contains("/var/lib/bgtask"), "\(result.stderr)")
        // `bgtask run` refuses the same way, before any launch.
        let app = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Info.plist")
        let run = try runCLI(["run", app.path, "--task", "\(Self.id).mainqueue:refresh", "--state", state])
        #expect(run.status != 0)
        #expect(run.stderr.contains("cannot reach their containers"), "\(run.stderr)")
        // Unconfined, the operator asked for less: no uid of its own, nothing to reach.
        let unconfined = try runCLI(["run", app.path, "--task", "\(Self.id).mainqueue:refresh", "--state", state, "--no-sandbox"])
        #expect(unconfined.status == 0, "\(unconfined.stderr)")
    }

    @Test(.enabled(if: geteuid() == 0))
    func aBundleInAPrivateDirectoryLaunchesConfinedAsItsOwnUid() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let vault = scratch.url.appendingPathComponent("vault")
        try FileManager.default.createDirectory(at: vault, withIntermediateDirectories: true)
        let staged = try scratch.bundle("IOSApp", info: "Tests/Fixtures/IOSApp/Info.plist")
        let app = vault.appendingPathComponent("IOSApp.app")
        try FileManager.default.moveItem(at: staged, to: app)
        chmod(vault.path, 0o700)
        let (record, result) = try scratch.run(app, ["--task", "\(Self.id).mainqueue:refresh"])
        #expect(record.termination == .exited, "\(record.error ?? "") \(result.stderr)")
        #expect(record.task("\(Self.id).mainqueue")?.outcome == .succeeded)
        #expect(record.sandbox?["uid"]?.applied == true)
        if Landlock.available { #expect(record.sandbox?["landlock"]?.applied == true, "\(record.sandbox ?? [:])") }
    }

    @Test(.enabled(if: geteuid() == 0))
    func rootsDefaultStateDirectoryIsTheSystems() throws {
        let result = try runCommand([Products.cli, "host", "--help"])
        #expect(result.stdout.contains("/var/lib/bgtask as root"), "\(result.stdout)")
        // Without --state or BGTASK_STATE, a verb as root looks in /var/lib/bgtask.
        let pending = try runCommand(["/usr/bin/env", "-u", "BGTASK_STATE", "-u", "XDG_STATE_HOME", Products.cli, "pending"])
        #expect((pending.stdout + pending.stderr).contains("/var/lib/bgtask"), "\(pending.stdout) \(pending.stderr)")
    }
}

/// Whether this kernel has Landlock (the layer some of these tests take away).
enum Landlock {
    static let available = bgtask_landlock_abi() > 0
}

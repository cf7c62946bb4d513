@testable import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import BGTaskSystem
import BGTaskModel
import Foundation
import Logging
import Testing

/// The supervisor used in-process, as the host daemon will use it: the test process is the
/// parent, so it can check what a launch leaves behind in it.
@Suite(.serialized) struct SupervisorTests {
    /// How the control socket tells a launch's process from a client: the child of this
    /// process (here, the test plays the host) that a process descends from. The walk stops at
    /// the first process older than this one; a process started later is followed up to it.
    @Test func aProcessIsTracedToTheHostsChildAndOlderOnesAreNot() throws {
        let null = open("/dev/null", O_RDWR | O_CLOEXEC)
        defer { close(null) }
        let child = try Subprocess.spawn(["/bin/sh", "-c", "sleep 30 & wait"], environment: ProcessInfo.processInfo.environment,
                                         stdin: null, stdout: null, stderr: null)
        defer {
            _ = ProcessTree.killTree(child)
            _ = Subprocess.wait(child)
        }
        var grandchild: pid_t?
        for _ in 0..<500 where grandchild == nil {
            grandchild = ProcessTree.children(of: child).first
            if grandchild == nil { usleep(2_000) }
        }
        let sleeper = try #require(grandchild)
        #expect(LaunchSupervisor.launchRunner(containing: sleeper) == child)
        #expect(LaunchSupervisor.launchRunner(containing: child) == child)
        // Older than this process: the test's own parent, and init.
        #expect(LaunchSupervisor.launchRunner(containing: getppid()) == nil)
        #expect(LaunchSupervisor.launchRunner(containing: 1) == nil)
        #expect(LaunchSupervisor.launchRunner(containing: getpid()) == nil)
        let (parent, start) = try #require(ProcessTree.parentAndStart(of: sleeper))
        #expect(parent == child)
        #expect(start >= (ProcessTree.parentAndStart(of: getpid())?.start ?? .max))
    }

    func plan(_ bundle: PluginBundle, _ identifier: String, kind: TaskKind, scratch: Scratch,
              limits: LaunchLimits? = nil) -> LaunchPlan {
        let id = LaunchPlan.newLaunchID()
        return LaunchPlan(
            bundle: bundle, tasks: [TaskAssignment(task: 1, identifier: identifier, kind: kind)],
            reason: "simulated", limits: limits ?? .defaults(for: [kind]), launchID: id,
            dataDirectory: scratch.state.appendingPathComponent("containers/\(bundle.identifier)"),
            logFile: scratch.state.appendingPathComponent("logs/\(id).log"))
    }

    /// This process's descriptors of the kinds a supervisor opens (sockets, pidfds, /dev/null,
    /// files under `directory`), as "fd -> target". Other suites run in parallel in this
    /// process and open pipes and files of their own; those are not counted.
    func supervisorDescriptors(under directory: URL) -> Set<String> {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return Set(fds.compactMap { fd in
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)") else { return nil }
            let ours = target.hasPrefix("socket:") || target.contains("pidfd") || target == "/dev/null" || target.hasPrefix(directory.path)
            return ours ? "\(fd) -> \(target)" : nil
        })
    }

    @Test func aLaunchLeaksNoDescriptorAndNoChildAndInheritsNothing() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        let supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))

        // A descriptor the parent leaves inheritable by mistake must not reach the plugin.
        let marker = scratch.url.appendingPathComponent("parent-secret")
        FileManager.default.createFile(atPath: marker.path, contents: Data("x".utf8))
        let inheritable = open(marker.path, O_RDONLY)
        defer { close(inheritable) }

        let before = supervisorDescriptors(under: scratch.url)
        let record = try supervisor.run(plan(bundle, "com.example.misbehaving.fds", kind: .refresh, scratch: scratch), broker: InMemoryRequestBroker())
        #expect(record.termination == .exited)
        let log = try record.logText()
        #expect(!log.contains(marker.path), "the child inherited the parent's descriptor: \(log)")
        #expect(log.contains("fd 3 -> socket:"), "the channel is fd 3: \(log)")
        #expect(log.contains("fd 1 -> pipe:") && log.contains("fd 2 -> pipe:"), "stdout and stderr go to the pipe into the launch log: \(log)")

        for crash in ["segfault", "spin", "garbage"] {
            var limits = LaunchLimits.defaults(for: [.processing])
            limits.budget = .milliseconds(200)
            limits.grace = .milliseconds(100)
            _ = try supervisor.run(plan(bundle, "com.example.misbehaving.\(crash)", kind: .processing, scratch: scratch, limits: limits),
                                   broker: InMemoryRequestBroker())
        }
        // Other suites open short-lived sockets in this process too (control clients): a leak is
        // a descriptor that stays.
        var leaked = supervisorDescriptors(under: scratch.url).subtracting(before)
        for _ in 0..<100 where !leaked.isEmpty {
            usleep(20_000)
            leaked = leaked.intersection(supervisorDescriptors(under: scratch.url))
        }
        #expect(leaked.isEmpty, "descriptors leaked by the supervisor: \(leaked)")
        let leftovers = ProcessTree.children(of: getpid()).filter(ProcessTree.isLaunchProcess)
        #expect(leftovers.isEmpty, "launch processes left as children of the supervisor: \(leftovers)")
    }

    /// The log gets the launch's output whole and in order, past a pipe's buffer, with the
    /// plugin's log calls after what it printed before them; a launch that writes nothing
    /// leaves no file.
    @Test func theLogHoldsEverythingTheLaunchWroteAndASilentLaunchHasNone() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        let supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))

        let chatty = try supervisor.run(plan(bundle, "com.example.misbehaving.chatty", kind: .refresh, scratch: scratch), broker: InMemoryRequestBroker())
        #expect(chatty.succeeded, "\(chatty)")
        let log = try chatty.logText()
        let lines = log.split(separator: "\n")
        let numbered = lines.filter { $0.hasPrefix("line ") }.map { $0.split(separator: " ")[1] }
        #expect(numbered == (1...1_024).map { Substring("\($0)") }, "every printed line, once, in order")
        for after in stride(from: 256, through: 1_024, by: 256) {
            let printed = try #require(lines.firstIndex { $0.hasPrefix("line \(after) ") })
            let logged = try #require(lines.firstIndex(of: "[bgtask info] log call after line \(after)"), "log call \(after) in the log")
            #expect(printed < logged, "the log call comes after what was printed before it")
            #expect(lines.contains("stderr after line \(after)"))
        }

        let silent = try supervisor.run(plan(bundle, "com.example.misbehaving.silent", kind: .refresh, scratch: scratch), broker: InMemoryRequestBroker())
        #expect(silent.succeeded, "\(silent)")
        #expect(silent.log == nil)
        #expect(!FileManager.default.fileExists(atPath: scratch.state.appendingPathComponent("logs/\(silent.launchID).log").path))
        #expect(silent.description.contains("log: none (the launch wrote nothing)"))
    }

    /// The container as the supervisor last left it is not made again before each launch (two
    /// stat calls instead of a score of opens and mkdirs), but one whose directories the app
    /// removed, or whose Library it replaced, is: in the same process, launch after launch.
    @Test func aContainerIsMadeAgainOnlyWhenItChanged() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app"))
        let supervisor = LaunchSupervisor(runnerPath: LaunchSupervisor.defaultRunnerPath(), logger: Logger(label: "test"))
        func launch() throws {
            let record = try supervisor.run(plan(bundle, "com.example.misbehaving.ok", kind: .refresh, scratch: scratch), broker: InMemoryRequestBroker())
            #expect(record.succeeded, "\(record)")
        }
        let container = scratch.state.appendingPathComponent("containers/\(bundle.identifier)").path
        let manager = FileManager.default
        func complete() -> Bool { AppContainer.directories.allSatisfy { manager.fileExists(atPath: container + "/" + $0) } }
        try launch()
        #expect(complete())
        let prepared = try #require(LaunchSupervisor.preparedContainers.withLock { $0[container] })
        try launch()
        #expect(LaunchSupervisor.preparedContainers.withLock { $0[container] } == prepared, "unchanged: not made again")
        try manager.removeItem(atPath: container + "/Library/Caches")
        try manager.removeItem(atPath: container + "/tmp")
        try launch()
        #expect(complete(), "removed directories are made again")
        try manager.removeItem(atPath: container + "/Library")
        try launch()
        #expect(complete(), "a removed Library is made again, with what lives in it")
    }

    @Test func aMissingRunnerIsAClearError() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try BundleReader.read(try scratch.bundle("Feed", info: "Plugins/Feed/Info.plist", name: "Feed.app"))
        let supervisor = LaunchSupervisor(runnerPath: "/nonexistent/bgtask-runner", logger: Logger(label: "test"))
        #expect {
            try supervisor.run(plan(bundle, "com.example.feed.refresh", kind: .refresh, scratch: scratch), broker: InMemoryRequestBroker())
        } throws: { error in
            (error as? BGTaskError)?.description.contains("/nonexistent/bgtask-runner") == true
        }
    }
}

import BGTaskSystem
import Foundation
import Testing
import _BGTaskSystemShims

/// The system layer the host, runner, bench and tests share: real directories, real processes.
struct SystemLayerTests {
    func scratch() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-system-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        return path
    }

    @Test func directoriesAreMadeWithTheirParentsAndAFileInTheWayIsNamed() throws {
        let root = try scratch()
        defer { try? FileManager.default.removeItem(atPath: root) }
        try Directories.make(root + "/a/b/c", mode: 0o700, syncingParents: true)
        var info = stat()
        #expect(stat(root + "/a/b/c", &info) == 0 && info.st_mode & S_IFMT == S_IFDIR)
        #expect(info.st_mode & 0o777 == 0o700 & ~umaskValue())
        try Directories.make(root + "/a/b/c") // exists: fine
        FileManager.default.createFile(atPath: root + "/file", contents: Data("x".utf8))
        do {
            try Directories.make(root + "/file/d")
            Issue.record("made a directory below a file")
        } catch {
            #expect(error.errno == ENOTDIR, "\(error)")
            #expect(error.description.contains(root + "/file"), "\(error)")
        }
        do {
            try Directories.make(root + "/file")
            Issue.record("took a file for a directory")
        } catch {
            #expect(error.errno == ENOTDIR)
        }
    }

    func umaskValue() -> mode_t {
        let current = umask(0)
        umask(current)
        return current
    }

    @Test func aFailedCallNamesItselfAndItsErrno() {
        do {
            try valueOrErrno("open /nonexistent", path: "/nonexistent") { open("/nonexistent/x", O_RDONLY) }
            Issue.record("opened a missing file")
        } catch {
            #expect(error.errno == ENOENT)
            #expect(error.description == "/nonexistent: open /nonexistent: No such file or directory")
        }
    }

    @Test func aSpawnedProcessGetsItsDescriptorsAndItsExitCodeOrSignalIsReported() throws {
        var pipe: [Int32] = [0, 0]
        #expect(bgtask_pipe_cloexec(&pipe) == 0)
        let pid = try Subprocess.spawn(["/bin/sh", "-c", "echo out; echo three >&3; exit 7"],
                                       environment: ["PATH": "/usr/bin:/bin"], stdout: pipe[1], descriptor3: pipe[1])
        close(pipe[1])
        let output = FileHandle(fileDescriptor: pipe[0], closeOnDealloc: true).readDataToEndOfFile()
        let status = try #require(Subprocess.wait(pid))
        #expect(Subprocess.exitCode(status) == 7)
        #expect(String(decoding: output, as: UTF8.self) == "out\nthree\n")
        #expect(Subprocess.wait(pid) == nil, "reaped once")

        // Its own process group, so a group kill reaches only it; a signal's death is 128 + N.
        let sleeper = try Subprocess.spawn(["/bin/sleep", "30"], environment: [:])
        #expect(getpgid(sleeper) == sleeper)
        kill(-sleeper, SIGTERM)
        #expect(Subprocess.wait(sleeper).map(Subprocess.exitCode) == 128 + SIGTERM)
        #expect(SignalName.of(SIGTERM) == "SIGTERM" && SignalName.of(63) == "SIG63")
    }

    /// Another process's CPU time through its process CPU clock: a busy child's grows with
    /// the CPU it spends and agrees with /proc's ticks; a sleeping one's does not grow; a
    /// reaped one has none.
    @Test func aProcessCPUClockCountsWhatItSpends() throws {
        let busy = try Subprocess.spawn(["/bin/sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; sleep 30"], environment: [:])
        let sleeper = try Subprocess.spawn(["/bin/sleep", "30"], environment: [:])
        var running = [busy, sleeper]
        defer {
            for pid in running { kill(-pid, SIGKILL); _ = Subprocess.wait(pid) }
        }
        var spent: UInt64 = 0
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            spent = ProcessTree.cpuClockNanoseconds(of: busy) ?? 0
            if spent > 200_000_000 { break }
            usleep(50_000)
        }
        #expect(spent > 200_000_000, "\(spent)")
        let ticks = try #require(ProcessTree.cpuNanoseconds(of: busy))
        #expect(ticks <= spent + 20_000_000 && spent <= ticks + 200_000_000, "clock \(spent), /proc \(ticks)")
        let asleep = try #require(ProcessTree.cpuClockNanoseconds(of: sleeper))
        usleep(200_000)
        #expect(try #require(ProcessTree.cpuClockNanoseconds(of: sleeper)) - asleep < 5_000_000)
        kill(-sleeper, SIGKILL)
        _ = Subprocess.wait(sleeper)
        running = [busy]
        #expect(ProcessTree.cpuClockNanoseconds(of: sleeper) == nil)
    }

    /// An orphan comes to a child subreaper's main thread, whichever thread started its parent:
    /// what `ProcessTree.adoptedChildren` relies on to find a killed launch's leftovers with one
    /// read instead of one per host thread.
    @Test func anOrphanIsAdoptedByTheSubreapersMainThread() throws {
        #expect(bgtask_set_child_subreaper() == 0)
        var pipe: [Int32] = [0, 0]
        #expect(bgtask_pipe_cloexec(&pipe) == 0)
        // Started from a thread of its own (not the main thread): the shell leaves a sleep
        // behind and exits.
        let started = LockedBox<Result<pid_t, SystemError>?>(nil)
        let writeEnd = pipe[1]
        let thread = Thread {
            started.value = Result { () throws(SystemError) -> pid_t in
                try Subprocess.spawn(["/bin/sh", "-c", "/bin/sleep 30 >/dev/null & echo $!"], environment: ["PATH": "/usr/bin:/bin"], stdout: writeEnd)
            }
        }
        thread.start()
        while started.value == nil { usleep(1_000) }
        close(pipe[1])
        let shell = try #require(try started.value?.get())
        let output = FileHandle(fileDescriptor: pipe[0], closeOnDealloc: true).readDataToEndOfFile()
        _ = Subprocess.wait(shell)
        let orphan = try #require(pid_t(String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))
        defer {
            kill(orphan, SIGKILL)
            _ = Subprocess.wait(orphan)
        }
        var adopted: [pid_t] = []
        for _ in 0..<200 where !adopted.contains(orphan) {
            adopted = ProcessTree.adoptedChildren(of: getpid())
            if !adopted.contains(orphan) { usleep(5_000) }
        }
        #expect(adopted.contains(orphan), "\(orphan) not among the main thread's children \(adopted)")
        #expect(ProcessTree.children(of: getpid()).contains(orphan))
    }

    @Test func aMissingExecutableIsAnErrorNotAChild() {
        do {
            _ = try Subprocess.spawn(["/nonexistent/binary"], environment: [:])
            Issue.record("spawned a missing executable")
        } catch {
            #expect(error.errno == ENOENT)
            #expect(error.path == "/nonexistent/binary")
        }
    }
}

/// A value one thread sets and another polls.
final class LockedBox<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}

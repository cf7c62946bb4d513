import BGTaskControl
@testable import BGTaskHost
import BGTaskLaunch
import BGTaskTransfers
import BGTaskModel
import BGTaskSystem
import Foundation
import Glibc
import Testing

/// Issue 28, transfers: what the host carries for an app is the app's, and bounded — running
/// attempts, queued transfers, staging bytes, the host's disk reserve, the host's descriptors —
/// and the IDs it makes never depend on a descriptor. Each test plays the hostile app.
/// Serialized: a flood and a filled filesystem must not share two cores with each other.
@Suite(.serialized) struct TransferBoundsTests {
    static let app = TransferTests.app

    // MARK: IDs without descriptors

    /// A child process with RLIMIT_NOFILE under what it has open (every open fails, EMFILE):
    /// `RandomIdentifier` still gives random version-4 UUIDs, where Foundation's `UUID()`
    /// gave `00000000-0000-4000-8000-000000000000` (issue 28: status 101, a UNIQUE clash).
    @Test func identifiersAreRandomWhenTheProcessHasNoDescriptorLeft() throws {
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        let child = fork()
        if child == 0 {
            var limit = rlimit(rlim_cur: 3, rlim_max: 3)
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            let probe = open("/dev/urandom", O_RDONLY)
            let line = "\(probe < 0 ? errno : 0) \(RandomIdentifier.uuidString()) \(RandomIdentifier.uuidString())\n"
            _ = line.utf8CString.withUnsafeBufferPointer { write(fds[1], $0.baseAddress, $0.count - 1) }
            // What Foundation gives in the same state, last (it may take locks another
            // thread held at the fork: the parent reads the first line regardless).
            let foundation = "\(UUID().uuidString)\n"
            _ = foundation.utf8CString.withUnsafeBufferPointer { write(fds[1], $0.baseAddress, $0.count - 1) }
            _exit(0)
        }
        try #require(child > 0)
        close(fds[1])
        defer {
            close(fds[0])
            kill(child, SIGKILL)
            var status: Int32 = 0
            while waitpid(child, &status, 0) == -1 && errno == EINTR {}
        }
        var output = Data()
        let deadline = Date().addingTimeInterval(10)
        var buffer = [UInt8](repeating: 0, count: 512)
        while Date() < deadline, output.split(separator: UInt8(ascii: "\n")).count < 2 {
            var poller = pollfd(fd: fds[0], events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 200) >= 0 else { continue }
            guard poller.revents != 0 else { continue }
            let n = read(fds[0], &buffer, buffer.count)
            if n <= 0 { break }
            output.append(contentsOf: buffer[0..<n])
        }
        let lines = String(decoding: output, as: UTF8.self).split(separator: "\n").map(String.init)
        let words = try #require(lines.first?.split(separator: " ").map(String.init))
        try #require(words.count == 3, "\(lines)")
        #expect(words[0] == "\(EMFILE)", "the child was out of descriptors: open gave errno \(words[0])")
        let zero = "00000000-0000-4000-8000-000000000000"
        for id in words[1...] {
            #expect(id != zero && UUID(uuidString: id) != nil && id.count == 36, "\(id)")
            let characters = Array(id)
            #expect(characters[14] == "4" && "89AB".contains(characters[19]), "version 4, RFC 4122 variant: \(id)")
        }
        #expect(words[1] != words[2])
        if lines.count > 1 {
            // Not asserted (Foundation may mend it), only said: what the host used to do.
            print("Foundation's UUID() without descriptors: \(lines[1])")
        }
    }

    // MARK: Per-app bounds (the part, a real store, the suite's HTTP server)

    /// 20 downloads of one app: never more than 6 run at once; the rest wait with the reason
    /// (`why` shows it), none is refused, all complete. Past the queued cap a create is
    /// refused with the named error.
    @Test func anAppsTransfersRunSixAtATimeAndTheRestWaitQueued() throws {
        var bounds = TransferBounds()
        bounds.queuedPerApp = 20
        let h = try TransferTests.Harness(bounds: bounds)
        defer { h.finish() }
        h.server.throttle = 400_000
        var ids: [String] = []
        for index in 0..<20 {
            var request = h.download(60_000 + index)
            request.taskIdentifier = index + 1
            ids.append(try h.create(request).id)
        }
        let over = h.call(.create(h.download(10)))
        #expect(over.status == TransferCallAnswer.unavailable, "\(over.message ?? "")")
        #expect(over.message?.hasPrefix(TransferBounds.tooManyQueuedName) == true && over.message?.contains("20 transfers not yet delivered") == true,
                "\(over.message ?? "")")
        var mostRunning = 0
        var sawQueued = false
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            let reports = ids.compactMap { h.part.report(id: $0) }
            mostRunning = max(mostRunning, reports.filter { $0.state == .running }.count)
            if let queued = reports.first(where: { $0.heldBy?.hasPrefix("queued: \(Self.app) has 6 transfers running") == true }) {
                sawQueued = true
                #expect(queued.state == .waiting)
                #expect(queued.explanation.contains("the most the host runs at once for one app"), "\(queued.explanation)")
            }
            if reports.allSatisfy({ $0.state.isFinished }) { break }
            usleep(10_000)
        }
        // Counted where it matters, by the server (the reports are read one by one: an attempt
        // ending between two reads can show 7).
        #expect(h.server.mostStreaming == 6, "at most 6 at once on the network, and 6 did run: \(h.server.mostStreaming) (reports showed \(mostRunning))")
        #expect(sawQueued)
        for id in ids {
            let done = try h.stored(id)
            #expect(done.info.state == .completed, "\(TransferReport(done).text)")
        }
        #expect(h.part.stagingUsage(app: Self.app).inodes == 0, "delivered downloads left the staging")
    }

    /// A download longer than the app's staging cap fails with the named error before a byte
    /// is staged; the app's launch is told (its delegate gets the error); the app's next
    /// download under the cap runs.
    @Test func aDownloadOverTheAppsStagingCapFailsWithTheNamedError() throws {
        var bounds = TransferBounds()
        bounds.stagingBytesPerApp = 1 << 20
        let h = try TransferTests.Harness(bounds: bounds)
        defer { h.finish() }
        let big = try h.create(h.download(3 << 20))
        let failed = try h.wait(big.id) { $0.info.state.isFinished }
        #expect(failed.info.state == .failed && failed.info.error?.code == TransferError.cannotWriteToFileCode)
        #expect(failed.info.error?.message.hasPrefix(TransferBounds.stagingCapName) == true, "\(failed.info.error?.message ?? "")")
        #expect(failed.info.error?.message.contains("over its cap of 1.0 MiB") == true, "\(failed.info.error?.message ?? "")")
        #expect(failed.info.attempts == 1, "not retried")
        // The launch is told (after the state is written: waited for).
        let told = Date().addingTimeInterval(10)
        func toldOfIt() -> Bool {
            h.events.withLock { $0 }.contains { $0.event == "finished" && $0.transfer.error?.message.hasPrefix(TransferBounds.stagingCapName) == true }
        }
        while !toldOfIt(), Date() < told { usleep(10_000) }
        #expect(toldOfIt())
        #expect(access(h.part.spoolDirectory + "/\(big.id).part", F_OK) != 0)
        let small = try h.create(h.download(500_000))
        #expect(try h.wait(small.id) { $0.info.state.isFinished }.info.state == .completed)
        #expect(h.part.stagingUsage(app: Self.app) == (0, 0))
    }

    // MARK: The disk (a tmpfs of a few MiB; root only)

    /// The state directory on a 16 MiB tmpfs, the host's reserve 8 MiB. A download that does
    /// not fit above the reserve fails at its head; one that fits until something else fills
    /// the disk mid-way fails at the write that would have gone into the reserve. Both with the
    /// named reason, and the filesystem keeps its reserve.
    @Test func downloadsStopAtTheHostsDiskReserveWithTheNamedReason() throws {
        guard SmallFilesystem.available else {
            withKnownIssue("mounting a small filesystem needs root") { throw HostTestError("not root") }
            return
        }
        var bounds = TransferBounds()
        bounds.diskReserveBytes = 8 << 20
        let h = try TransferTests.Harness(bounds: bounds, tmpfsMiB: 16)
        defer { h.finish() }
        let state = h.scratch.state.path
        // Over the free space above the reserve: refused before a byte.
        let whole = try h.create(h.download(12 << 20))
        let refused = try h.wait(whole.id) { $0.info.state.isFinished }
        #expect(refused.info.state == .failed && refused.info.error?.code == TransferError.cannotWriteToFileCode)
        #expect(refused.info.error?.message.hasPrefix(TransferBounds.diskReserveName) == true, "\(refused.info.error?.message ?? "")")
        #expect(refused.info.error?.message.contains("--disk-reserve") == true)
        #expect(refused.info.bytesReceived == 0)

        // Fits when it starts; another writer fills the disk while it runs.
        h.server.throttle = 1 << 20
        let running = try h.create(h.download(6 << 20))
        try h.wait(running.id) { $0.info.bytesReceived >= 512 << 10 }
        let filler = h.scratch.state.appendingPathComponent("filler")
        try Data(count: 6 << 20).write(to: filler)
        let stopped = try h.wait(running.id) { $0.info.state.isFinished }
        #expect(stopped.info.state == .failed, "\(TransferReport(stopped).text)")
        #expect(stopped.info.error?.message.hasPrefix(TransferBounds.diskReserveName) == true, "\(stopped.info.error?.message ?? "")")
        #expect(stopped.info.attempts == 1, "not retried into the reserve")
        let free = DiskReserveWatch.availableBytes(state)
        #expect(free >= 8 << 20, "the reserve was kept: \(free) bytes free")
        #expect(access(h.part.spoolDirectory + "/\(running.id).part", F_OK) != 0, "the partial download is gone")
        #expect(h.part.stagingUsage(app: Self.app) == (0, 0))
    }

    /// A 1 GiB sparse file (64 KiB of data) named as an upload body, on a 16 MiB tmpfs: its
    /// staging is its data, not a gigabyte of zeros; the disk keeps its free space. A dense
    /// body over the app's staging cap is refused at create, by name, before any copy.
    @Test func aSparseUploadBodyIsStagedSparseAndABodyOverTheCapIsRefused() throws {
        guard SmallFilesystem.available else {
            withKnownIssue("mounting a small filesystem needs root") { throw HostTestError("not root") }
            return
        }
        var bounds = TransferBounds()
        bounds.diskReserveBytes = 4 << 20
        bounds.stagingBytesPerApp = 3 << 20
        let h = try TransferTests.Harness(bounds: bounds, tmpfsMiB: 16)
        defer { h.finish() }
        // Held (on battery, discretionary): only the staging is looked at, nothing is sent.
        h.conditions.withLock { $0.externalPower = false }
        let sparse = h.container.appendingPathComponent("tmp/sparse.bin").path
        let fd = open(sparse, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        try #require(fd >= 0)
        let data = TransferTestServer.bytes(64 << 10)
        _ = data.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 512 << 20) }
        #expect(ftruncate(fd, 1 << 30) == 0)
        close(fd)
        let before = DiskReserveWatch.availableBytes(h.scratch.state.path)
        var request = TransferRequest(session: "s", taskIdentifier: 1, kind: .upload, url: h.server.url("/upload"), method: "PUT", bodyFile: sparse)
        request.discretionary = true
        let created = try h.create(request)
        #expect(created.bytesExpectedToSend == 1 << 30)
        let held = try h.wait(created.id) { $0.info.heldBy?.hasPrefix("discretionary") == true }
        let spool = try #require(held.spool)
        var info = stat()
        #expect(stat(spool, &info) == 0 && info.st_size == 1 << 30, "the spool has the body's length")
        #expect(info.st_blocks * 512 <= 1 << 20, "and only its data: \(info.st_blocks * 512) bytes allocated")
        let after = DiskReserveWatch.availableBytes(h.scratch.state.path)
        #expect(before - min(before, after) <= 2 << 20, "the disk did not fill: \(before) then \(after) free")
        #expect(h.part.stagingUsage(app: Self.app).bytes == 64 << 10)
        // The staged copy holds the body's bytes where they were.
        let copied = open(spool, O_RDONLY)
        var back = [UInt8](repeating: 0, count: data.count)
        _ = pread(copied, &back, back.count, 512 << 20)
        close(copied)
        #expect(Data(back) == data)

        // Dense and over the cap: refused at create, nothing staged.
        let dense = h.container.appendingPathComponent("tmp/dense.bin")
        try Data(count: 4 << 20).write(to: dense)
        let refused = h.call(.create(TransferRequest(session: "s", taskIdentifier: 2, kind: .upload, url: h.server.url("/upload"), method: "PUT", bodyFile: dense.path)))
        #expect(refused.status == TransferCallAnswer.unavailable, "\(refused.message ?? "")")
        #expect(refused.message?.contains(TransferBounds.stagingCapName) == true && refused.message?.contains(dense.path) == true, "\(refused.message ?? "")")
        #expect(h.part.stagingUsage(app: Self.app).bytes == 64 << 10)
        #expect(h.call(.cancel(id: created.id)).status == 0)
        #expect(h.part.stagingUsage(app: Self.app) == (0, 0))
    }
}

/// A tmpfs of a few MiB mounted on a test's directory (root only), private so that nothing
/// propagates, unmounted (lazily: a store may still hold it open) by the test's cleanup.
enum SmallFilesystem {
    static var available: Bool {
        geteuid() == 0 && FileManager.default.isExecutableFile(atPath: "/bin/mount") && FileManager.default.isExecutableFile(atPath: "/bin/umount")
    }

    static func mount(_ directory: URL, mebibytes: Int) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let mounted = try runCommand(["/bin/mount", "-t", "tmpfs", "-o", "size=\(mebibytes)m,mode=0755", "bgtask-test", directory.path])
        guard mounted.status == 0 else { throw HostTestError("cannot mount a tmpfs on \(directory.path): \(mounted.stderr)") }
        _ = try runCommand(["/bin/mount", "--make-private", directory.path])
    }

    static func unmount(_ directory: URL) {
        _ = try? runCommand(["/bin/umount", "-l", directory.path])
    }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskSystem
import BGTaskModel
import Foundation
import Testing
import _BGTaskSystemShims

/// Issue 13, item 4: every resource a launch or a client can push into the host is bounded,
/// refused with an error that names the limit, and costs no one else anything. Each test plays
/// the attacker (a client on the control socket, a bundle in the plugin directory, a plugin in
/// a launch) and asserts the exact outcome. Serialized: the flood and watchdog timings must not
/// share this machine's two cores with another suite's launches of this one.
@Suite(.serialized) struct ResourceBoundsTests {
    static let misbehaving = "com.example.misbehaving"

    // MARK: Control connections

    /// One app filling the disk is killed at the host's reserve, and another app still launches
    /// and logs after it. The state directory is a 96 MiB tmpfs, mounted in a mount namespace
    /// of the CLI's own (`unshare -m`, private propagation): nothing reaches this machine's.
    @Test func anAppThatFillsTheDiskIsKilledAtTheReserveAndOthersStillRun() throws {
        guard geteuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare") else {
            withKnownIssue("mounting a small filesystem needs root and unshare(1)") { throw HostTestError("not root") }
            return
        }
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let state = scratch.state.path
        let script = """
            set -e
            mkdir -p "$STATE"
            mount -t tmpfs -o size=96m,mode=0700 bgtask-test "$STATE"
            "$CLI" run "$APP" --json --state "$STATE" --task com.example.misbehaving.fill-disk:processing --disk-reserve 32MB --budget 60s || true
            echo '--- next'
            "$CLI" run "$APP" --json --state "$STATE" --task com.example.misbehaving.ok:processing --disk-reserve 32MB
            echo '--- log'
            cat "$STATE"/logs/*.log
            """
        let result = try runCommand(["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script],
                                    environment: ["STATE": state, "CLI": Products.cli, "APP": app.path])
        let parts = result.stdout.components(separatedBy: "--- next\n")
        try #require(parts.count == 2, "\(result.stdout) \(result.stderr)")
        let filled = try RunRecord.decode(Data(parts[0].utf8))
        #expect(filled.termination == .disk, "\(filled.termination) \(filled.error ?? "")")
        #expect(filled.signal == "SIGKILL")
        #expect(filled.error?.contains("under the host's reserve of 32.0 MiB") == true, "\(filled.error ?? "")")
        #expect(filled.task("com.example.misbehaving.fill-disk")?.outcome == .unfinished)
        let rest = parts[1].components(separatedBy: "--- log\n")
        try #require(rest.count == 2, "\(parts[1])")
        let next = try RunRecord.decode(Data(rest[0].utf8))
        #expect(next.termination == .exited)
        #expect(next.task("com.example.misbehaving.ok")?.outcome == .succeeded)
        // The filler never got to see the disk full: it was killed first.
        #expect(!rest[1].contains("fill-disk stopped"), "\(rest[1])")
    }

    /// What a client sends is not echoed back whole, and an event too large for a launch's
    /// start is refused before a launch is made for it.
    @Test func aMegabyteVerbAndAnOversizedEventGetShortClearErrors() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual"], installing: [.misbehaving])
        defer { host.stop() }
        let verb = try host.send(wire: ControlRequest(verb: String(repeating: "v", count: 900_000)))
        #expect(verb.ok == false)
        #expect(verb.failure?.code == .unknownVerb, "\(String(describing: verb.error))")
        #expect(verb.error?.message.contains("(900000 bytes)") == true)
        #expect((verb.error?.message.count ?? .max) < 1000)
        let event = "{\"pad\": \"" + String(repeating: "e", count: 70_000) + "\"}"
        let opened = try host.send(.open(app: Self.misbehaving, event: event))
        #expect(opened.failure?.code == .tooLarge, "\(String(describing: opened.error))")
        #expect(opened.error?.message.contains("over the limit of 65536") == true)
        // No launch was made for it.
        #expect(try host.send(.history(limit: 10)).records?.isEmpty == true)
    }

    @Test func controlConnectionsAreCappedAndTheOneOverTheCapIsToldWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--max-connections", "4"])
        defer { host.stop() }
        // The whole host: it serves its control socket only once every part has started with
        // its threads (TaskHost.start; counted before that, SwiftNIO's four, the signal thread
        // and a dispatch worker came after this, and a loaded machine failed the bound below).
        let baseline = try threads(of: host.pid)
        let baselineNames = threadNames(of: host.pid)

        // Four connections, each served (it answered), then idle: the cap is reached.
        var held: [Int32] = []
        defer { held.forEach { close($0) } }
        // The readiness probe's connection (HostProcess.start) may not have been let go by the
        // host yet on a loaded machine: a connection refused for that is retried, for a while.
        let servedBy = Date().addingTimeInterval(10)
        while held.count < 4 {
            let fd = try connectControl(scratch.state)
            // Refused over the cap, the host may close before the request is even written
            // (EPIPE): that is a refusal too.
            if (try? sendFrame(#"{"verb":"status"}"#, to: fd)) != nil, (try? readAnswer(fd))??.ok == true {
                held.append(fd)
                continue
            }
            close(fd)
            try #require(Date() < servedBy, "only \(held.count) of 4 connections were served")
            usleep(50_000)
        }
        // The fifth is answered with the named error and closed.
        // (Every socket here is closed as soon as it is done with: SupervisorTests, running
        // beside this suite, counts this process's sockets that outlive two seconds.)
        let over = try connectControl(scratch.state)
        let refusal = try #require(try readAnswer(over), "the connection over the cap got no answer")
        #expect(refusal.ok == false && refusal.failure?.code == .tooManyConnections, "\(String(describing: refusal.error))")
        #expect(refusal.error?.message.contains("at most 4 control connections") == true, "\(String(describing: refusal.error))")
        #expect(try readAnswer(over) == nil, "the connection over the cap is closed after its answer")
        close(over)

        // 200 more, all refused: no thread each (1,000 idle connections once made 1,005 threads).
        for index in 0..<200 {
            let fd = try connectControl(scratch.state)
            let failure = try readAnswer(fd, timeout: 3)?.failure
            close(fd)
            // One failure says it all; 200 would wait out 200 timeouts.
            guard failure?.code == .tooManyConnections else {
                Issue.record("connection \(index) over the cap: \(failure.map { "\($0)" } ?? "no answer")")
                break
            }
        }
        let during = try threads(of: host.pid)
        #expect(during <= baseline + 4 + 4, "the host has \(during) threads with 4 connections served (\(baseline) before): \(threadNames(of: host.pid)), before: \(baselineNames)")

        // Once the held connections close, the host serves again.
        held.forEach { close($0) }
        held = []
        let deadline = Date().addingTimeInterval(5)
        var answered = false
        while !answered && Date() < deadline {
            answered = (try? host.send(.status))?.ok == true
            if !answered { usleep(20_000) }
        }
        #expect(answered, "the host did not serve again after the held connections closed")
    }

    @Test func aRequestSentByteByByteIsCutOffAtItsDeadlineAndAnIdleConnectionIsClosed() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--request-timeout", "1s", "--idle-timeout", "1s"])
        defer { host.stop() }

        // One byte every 150 ms: the 25-byte request would take 3.75 s; its deadline is 1 s.
        let trickle = try connectControl(scratch.state)
        let frame = [UInt8](try ControlFrame.encode(Data(#"{"verb":"status"}"#.utf8)))
        let started = Date()
        for byte in frame {
            var pfd = pollfd(fd: trickle, events: Int16(POLLIN), revents: 0)
            if poll(&pfd, 1, 0) > 0 { break } // the host has answered
            _ = withUnsafePointer(to: byte) { send(trickle, $0, 1, Int32(MSG_NOSIGNAL)) }
            usleep(150_000)
        }
        let answer = try #require(try readAnswer(trickle), "no answer to a request that missed its deadline")
        let elapsed = Date().timeIntervalSince(started)
        #expect(answer.ok == false && answer.failure?.code == .requestTimeout, "\(String(describing: answer.error))")
        #expect(answer.error?.message.contains("1 s after its first byte") == true, "\(String(describing: answer.error))")
        #expect(elapsed > 0.9 && elapsed < 2.5, "cut off after \(elapsed) s, the deadline being 1 s")
        #expect(try readAnswer(trickle) == nil, "the connection is closed after the timeout's answer")
        close(trickle)

        // Idle between requests: answered once, then closed after 1 s of silence, with no frame.
        let idle = try connectControl(scratch.state)
        try sendFrame(#"{"verb":"status"}"#, to: idle)
        #expect(try readAnswer(idle)?.ok == true)
        let idleStart = Date()
        #expect(try readAnswer(idle, timeout: 10) == nil, "an idle connection is closed without an answer")
        let idleFor = Date().timeIntervalSince(idleStart)
        close(idle)
        #expect(idleFor > 0.9 && idleFor < 3, "closed after \(idleFor) s idle, the timeout being 1 s")
        #expect(try host.send(.status).ok)
    }

    // MARK: Answer sizes

    @Test func aRecordOfAHundredThousandRefusalsListsAHundredAndEveryAnswerStillFits() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--log-limit", "64KiB"],
                                           installing: [.misbehaving, .feed])
        defer { host.stop() }
        // Another app's request, which nothing here may cost it.
        let submitted = try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--earliest", "+1h"])
        #expect(submitted.status == 0, "\(submitted.stderr)")

        let response = try host.send(.simulateLaunch(identifier: "\(Self.misbehaving).refuse-many", app: Self.misbehaving, force: true, kind: .refresh, wait: true))
        let record = try #require(response.record, "\(String(describing: response.error))")
        #expect(record.termination == .suspended && record.succeeded, "\(record)")
        #expect(record.refusedRegistrations.count == InputLimits.recordListEntries)
        #expect(record.refusedRegistrationsOmitted == 100_000 - InputLimits.recordListEntries)
        #expect(record.refusedRegistrations.first?.hasSuffix(".0") == true)
        // 100,000 lines of refusals, against a 64 KiB log: the host's --log-limit.
        #expect(record.logTruncated == true && (record.logBytesDropped ?? 0) > 1_000_000, "\(record)")

        // Every answer still fits: all apps' history, this app's, apps; Feed's request is there.
        let all = try host.send(.history())
        #expect(all.ok && all.records?.count == 1, "\(String(describing: all.error))")
        let mine = try host.cli(["history", Self.misbehaving, "--json"])
        #expect(mine.status == 0, "\(mine.stderr)")
        #expect(mine.stdout.contains("\"refused_registrations_omitted\":99900"))
        #expect(try host.cli(["apps"]).status == 0)
        let pending = try host.send(.pending(app: "com.example.feed")).pending ?? []
        #expect(pending.map(\.request.identifier) == ["com.example.feed.refresh"])
    }

    @Test func submissionsPastTheRecordsListAreCounted() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, result) = try scratch.run(bundle, ["--task", "\(Self.misbehaving).resubmit-many:refresh"])
        #expect(record.succeeded, "\(result.stderr)")
        #expect(try record.logText().contains("500 submissions accepted"))
        #expect(record.submitted.count == InputLimits.recordListEntries)
        #expect(record.submittedOmitted == 500 - InputLimits.recordListEntries)
        #expect(result.stdout.contains("\"submitted_omitted\":400"))
    }

    /// A history answer keeps the newest records that fit the frame, says how many it left
    /// out, and leaves out a record too large by itself rather than fail for every app.
    @Test func aHistoryAnswerFitsTheFrameAndSaysWhatItLeftOut() throws {
        func record(_ index: Int, errorBytes: Int) -> RunRecord {
            RunRecord(app: "com.example.app\(index % 3)", launchID: "launch-\(index)", reason: "scheduled", tasks: [],
                      termination: .crashed, signal: nil, exitStatus: 1, error: String(repeating: "e", count: errorBytes),
                      wallMs: 1, cpuMs: 1, peakRSSBytes: 0, memoryLimitBytes: 0, memoryMechanism: "sampler",
                      budgetMs: 0, graceMs: 0, expiredAtMs: nil, pid: 1, startedAt: Date(timeIntervalSince1970: 1_800_000_000),
                      bundlePath: "/p", log: nil, registered: [], refusedRegistrations: [], submitted: [])
        }
        let records = [record(0, errorBytes: 10), record(1, errorBytes: ControlFrame.maximumPayload)] + (2..<40).map { record($0, errorBytes: 50_000) }
        let (kept, omitted) = ControlVerbs.fitting(records)
        #expect(kept.first?.launchID == "launch-0")
        #expect(!kept.contains { $0.launchID == "launch-1" }, "a record over the frame by itself is left out")
        #expect(kept.map(\.launchID) == ["launch-0"] + (2..<(kept.count + 1)).map { "launch-\($0)" }, "the newest that fit, in order")
        #expect(omitted == records.count - kept.count && omitted > 1)
        var response = ControlResponse()
        response.records = kept
        (response.truncated, response.omitted) = (true, omitted)
        let bytes = try JSONEncoder.control.encode(response).count
        #expect(bytes <= ControlFrame.maximumPayload, "the answer is \(bytes) bytes")
    }

    @Test func absurdBundlesAreInvalidByNameAndTheOthersStillAnswer() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        defer { host.stop() }
        // 200,000 permitted identifiers (an 8 MB Info.plist), 1,001 of them, one of 300 bytes.
        try installApp("Huge", identifiers: (0..<200_000).map { "com.example.huge.t\($0)" }, in: host.plugins, scratch: scratch)
        try installApp("Many", identifiers: (0...1000).map { "com.example.many.t\($0)" }, in: host.plugins, scratch: scratch)
        try installApp("Long", identifiers: ["com.example.long." + String(repeating: "l", count: 300)], in: host.plugins, scratch: scratch)

        let invalid = try waitForInvalid(host, count: 3)
        func error(_ name: String) -> String { invalid.first { $0.path.hasSuffix("/\(name).app") }?.error ?? "(not listed)" }
        #expect(error("Huge").contains("Info.plist: is ") && error("Huge").contains("over the limit of 1 MiB"), "\(error("Huge"))")
        #expect(error("Many").contains("key BGTaskSchedulerPermittedIdentifiers: has 1001 entries, over the limit of 1000"), "\(error("Many"))")
        #expect(error("Long").contains("key BGTaskSchedulerPermittedIdentifiers[0]: is 317 bytes, over the limit of 255 bytes"), "\(error("Long"))")
        let apps = try host.cli(["apps", "--json"])
        #expect(apps.status == 0, "\(apps.stderr)")
        #expect(try host.send(.apps()).apps?.map(\.identifier) == ["com.example.feed"])
    }

    // MARK: Clock and dates

    @Test func clockAdvancesAndDatesAreFiniteAndBoundedAndNeverPersistedOtherwise() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.feed])
        let before = try #require(try host.send(.clock()).clock?.now)

        for (advance, code) in [(1e308, ControlErrorCode.outOfRange), (101 * 365.25 * 86_400, .outOfRange), (-1, .badRequest)] {
            let refused = try host.send(.clock(advance: advance))
            #expect(refused.failure?.code == code, "advance \(advance): \(String(describing: refused.error))")
            if code == .outOfRange {
                #expect(refused.error?.message.contains("100 years") == true, "\(String(describing: refused.error))")
            }
        }
        let cli = try host.cli(["clock", "advance", "1e308"])
        #expect(cli.status != 0, "bgtask clock advance 1e308 was accepted: \(cli.stdout)")
        #expect(try host.send(.clock()).clock?.now == before, "a refused advance moved the clock")

        // A date a launch or a client may ask for: finite, and within 100 years of the clock.
        let absurd = try host.send(.submit(app: "com.example.feed", request: TaskRequest(kind: .refresh, identifier: "com.example.feed.refresh", earliestBeginDate: 1e308)))
        #expect(absurd.failure?.code == .notPermitted && absurd.error?.message.contains("100 years") == true, "\(String(describing: absurd.error))")
        let far = try host.send(.submit(app: "com.example.feed", request: TaskRequest(kind: .refresh, identifier: "com.example.feed.refresh"), delay: 1e308))
        #expect(far.failure?.code == .outOfRange, "\(String(describing: far.error))")
        let usable = try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--earliest", "+15m"])
        #expect(usable.status == 0, "\(usable.stderr)")
        let pending = try #require(try host.send(.pending(app: "com.example.feed")).pending?.first)
        #expect(pending.earliest == before.addingTimeInterval(15 * 60))
        host.stop()

        // A clock saved by a host without these bounds is reset, with a warning, at start.
        for saved in ["1e308", "inf"] {
            try PendingRequestStore(directory: scratch.state).setSetting(HostClock.settingKey, saved)
            try host.start()
            let now = try #require(try host.send(.clock()).clock?.now)
            #expect(abs(now.timeIntervalSinceNow) < 60, "the saved clock \(saved) was kept: \(now)")
            let log = try String(contentsOfFile: host.logPath, encoding: .utf8)
            #expect(log.contains("virtual clock reset: the saved virtual clock (\(saved))"), "\(log)")
            #expect(try host.cli(["submit", "com.example.feed", "com.example.feed.refresh", "--earliest", "+15m"]).status == 0)
            host.stop()
        }
    }

    // MARK: Host-function input sizes

    @Test func hostFunctionsRefuseOversizedInputsAtOnceAndSayWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, result) = try scratch.run(bundle, ["--task", "\(Self.misbehaving).huge-inputs:refresh"])
        #expect(record.succeeded, "\(result.stdout) \(result.stderr)")
        // Before: register dropped, submit and cancel each waited 30 s for an answer never sent.
        #expect(record.wallMs < 5_000, "the launch took \(record.wallMs) ms")
        let log = try record.logText()
        for call in ["register returned false", "submit refused", "cancel returned", "log returned"] {
            let line = log.split(separator: "\n").first { $0.contains("huge-inputs: \(call)") } ?? "(missing)"
            let ms = line.components(separatedBy: " after ").dropFirst().first?.split(separator: " ").first.flatMap { Int($0) }
            #expect(ms.map { $0 < 1_000 } == true, "\(call): \(line)")
        }
        #expect(log.contains("submit refused") && log.contains("the request's identifier is 1048600 bytes, over the limit of 255 bytes"), "\(log.prefix(4000))")
        #expect(log.contains("returned false: the identifier is 1048600 bytes, over the limit of 255 bytes"), "\(log.prefix(4000))")
        #expect(log.contains("nothing cancelled"))
        #expect(log.contains("log message cut: 1048576 bytes, over the limit of 64 KiB"))
        let refused = try #require(record.refusedRegistrations.first)
        #expect(record.refusedRegistrations.count == 1 && refused.hasPrefix("\(Self.misbehaving).xxx") && refused.hasSuffix("…") && refused.utf8.count < 64)
    }

    // MARK: Special files in the plugin directory

    @Test func aFIFOOrDeviceOrSocketOrEscapingLinkInABundleIsInvalidAndNothingBlocks() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let staging = scratch.url.appendingPathComponent("staging")
        try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
        let outside = scratch.url.appendingPathComponent("outside.plist")
        try Self.plist(identifier: "com.example.escape", executable: "libEscape.so").write(to: outside, atomically: true, encoding: .utf8)

        // CFBundleExecutable a FIFO; Info.plist a FIFO; Info.plist a link out of the bundle;
        // the executable a socket; and a bundle whose executable is a link inside it (valid).
        let fifo = try makeApp("Fifo", in: staging, executable: .fifo)
        let plistFIFO = try makeApp("PlistFifo", in: staging, executable: .library, plist: .fifo)
        let escape = try makeApp("Escape", in: staging, executable: .library, plist: .link(outside.path))
        let socket = try makeApp("Socket", in: staging, executable: .socket)
        let inner = try makeApp("Inner", in: staging, executable: .innerLink)
        var device: URL?
        if getuid() == 0 { device = try makeApp("Device", in: staging, executable: .device) }

        // `bgtask validate` never blocks on them (a FIFO once hung it in open()).
        let expectations: [(URL, String)] = [
            (fifo, "CFBundleExecutable: 'libFifo.so' is a FIFO, not a regular file"),
            (plistFIFO, "Info.plist: Info.plist is a FIFO, not a regular file"),
            (escape, "Info.plist: Info.plist is a symbolic link to \(outside.resolvingSymlinksInPath().path), outside the bundle"),
            (socket, "CFBundleExecutable: 'libSocket.so' is a socket, not a regular file"),
        ] + (device.map { [($0, "CFBundleExecutable: 'libDevice.so' is a character device, not a regular file")] } ?? [])
        for (bundle, message) in expectations {
            let validated = try runCLI(["validate", bundle.path], timeout: .seconds(20))
            #expect(validated.status == 65 && validated.stderr.contains(message), "\(bundle.lastPathComponent): \(validated.status) \(validated.stderr)")
        }
        #expect(try runCLI(["validate", inner.path], timeout: .seconds(20)).status == 0, "a link inside the bundle is fine")

        // Moved into a running host's plugin directory: its scan neither blocks nor loads them.
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        var stopped = false
        defer { if !stopped { host.crash() } }
        for bundle in [fifo, plistFIFO, escape, socket, inner] + (device.map { [$0] } ?? []) {
            try FileManager.default.moveItem(at: bundle, to: host.plugins.appendingPathComponent(bundle.lastPathComponent))
        }
        let invalid = try waitForInvalid(host, count: expectations.count)
        for (bundle, message) in expectations {
            let entry = invalid.first { $0.path.hasSuffix("/\(bundle.lastPathComponent)") }
            #expect(entry?.error.contains(message) == true, "\(bundle.lastPathComponent): \(entry?.error ?? "(not listed)")")
        }
        let apps = try runCLI(["apps", "--state", scratch.state.path], timeout: .seconds(20))
        #expect(apps.status == 0 && apps.stdout.contains("com.example.inner") && apps.stdout.contains(Self.misbehaving), "\(apps.stdout) \(apps.stderr)")
        let launch = try host.send(.simulateLaunch(identifier: "\(Self.misbehaving).ok", app: Self.misbehaving, force: true, kind: .refresh, wait: true))
        #expect(launch.record?.succeeded == true, "\(String(describing: launch.error))")
        // And SIGTERM still stops it.
        let status = host.stop()
        stopped = true
        #expect(status & 0x7f == 0 && (status >> 8) & 0xff == 0, "the host's exit status \(status)")
    }

    // MARK: Launch logs

    @Test func aLogFloodIsCutAtItsLimitAndTheWatchdogStaysOnTime() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        let (record, result) = try scratch.run(bundle, ["--task", "\(Self.misbehaving).flood:refresh", "--budget", "600ms", "--grace", "300ms",
                                                        "--log-limit", "1MiB"])
        #expect(record.termination == .watchdog, "\(result.stderr)")
        // Before: no limit (1.4-2 GiB in 3 s) and a watchdog 440 ms late while the pipe drained.
        #expect(record.wallMs < 900 + 350, "the watchdog fired \(record.wallMs - 900) ms late")
        #expect(record.expiredAtMs.map { $0 < 600 + 100 } == true, "expired at \(record.expiredAtMs ?? -1) ms")
        #expect(record.logTruncated == true && (record.logBytesDropped ?? 0) > 0, "\(result.stdout)")
        let path = try #require(record.log)
        var info = stat()
        #expect(lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG)
        #expect(info.st_size >= 1 << 20 && info.st_size < (1 << 20) + 512, "the log is \(info.st_size) bytes")
        #expect(info.st_mode & 0o777 == 0o600, "the log's mode is \(String(info.st_mode & 0o777, radix: 8))")
        #expect(try String(contentsOfFile: path, encoding: .utf8).hasSuffix("log truncated at its limit of 1048576 bytes: later output is discarded (the run record's log_bytes_dropped counts it)\n"))
        #expect(result.stdout.contains("\"log_truncated\":true"))
    }

    @Test func aLinkALaunchPlantsAtItsLogPathIsNeverFollowed() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist", name: "M.app")
        // Without the launch's sandbox, which would refuse the link: this is the host's own
        // defence, for whatever the sandbox cannot stop.
        let unconfined = try runCLI(["run", "--help"]).stdout.contains("--no-sandbox") ? ["--no-sandbox"] : []
        let (record, result) = try scratch.run(bundle, ["--task", "\(Self.misbehaving).plant-log:refresh"] + unconfined)
        #expect(record.succeeded, "\(result.stderr)")
        let target = scratch.state.appendingPathComponent("containers/\(Self.misbehaving)/planted-target").path
        let text = try record.logText()
        #expect(text.contains("plant-log: symlink to \(target) planted"), "\(text)")
        #expect((try? Data(contentsOf: URL(fileURLWithPath: target)))?.isEmpty ?? true, "the host wrote through the launch's link")
        let path = try #require(record.log)
        var info = stat()
        #expect(lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG, "the log is not a regular file of its own")
    }

    // MARK: Host hygiene

    /// Found by Tests/Hostile/control_fuzz.py: `device --app NAME` stored a row for any name
    /// (twenty 1 MB names grew the database by 46 MB), and `open` started one more process per
    /// request without bound.
    @Test func appSwitchesNameInstalledAppsAndOpenedLaunchesAreCapped() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch, arguments: ["--clock", "virtual", "--max-launches", "1", "--foreground-stay", "60s"])
        try host.install(TestBundle.feed.library, info: TestBundle.feed.info, as: TestBundle.feed.name)
        try host.start()
        defer { host.stop() }
        let database = scratch.state.appendingPathComponent("bgtask.sqlite").path
        let before = (try? FileManager.default.attributesOfItem(atPath: database)[.size] as? Int) ?? 0
        let huge = "app0." + String(repeating: "x", count: 900_000)
        for index in 0..<5 {
            let changes = DeviceChanges(app: .init(app: "\(index)\(huge)", refresh: false))
            let answer = try host.send(.device(changes))
            #expect(answer.failure?.code == .notFound, "\(String(describing: answer.error))")
        }
        let after = (try? FileManager.default.attributesOfItem(atPath: database)[.size] as? Int) ?? 0
        #expect(after - before < 512 << 10, "the database grew \(after - before) bytes")
        #expect(try host.cli(["device", "--app", "com.example.feed", "--refresh", "off"]).status == 0)

        // With --max-launches 1, eight opened launches at most; each stays open for a minute.
        let open = ControlCommand.open(app: "com.example.feed", wait: false)
        var started: [String] = []
        for _ in 0..<8 {
            let answer = try host.send(open)
            #expect(answer.error == nil, "\(String(describing: answer.error))")
            if let id = answer.launchID { started.append(id) }
        }
        #expect(Set(started).count == 8)
        let refused = try host.send(open)
        #expect(refused.failure?.code == .tooManyLaunches, "\(String(describing: refused.error))")
    }

    @Test func theStateIsOwnerOnlyAndSIGPIPEIsIgnored() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [.misbehaving])
        defer { host.stop() }
        let launch = try host.send(.simulateLaunch(identifier: "\(Self.misbehaving).ok", app: Self.misbehaving, force: true, kind: .refresh, wait: true))
        let log = try #require(launch.record?.log, "the launch printed a line")

        func mode(_ path: String) -> mode_t? {
            var info = stat()
            return lstat(path, &info) == 0 ? info.st_mode & 0o777 : nil
        }
        let state = scratch.state.path
        // 0711 as root: launches run as their apps' uids and pass through it to their containers.
        #expect(mode(state) == (getuid() == 0 ? 0o711 : 0o700))
        #expect(mode(state + "/logs") == 0o700)
        #expect(mode(log) == 0o600)
        #expect(mode(state + "/bgtask.sqlite") == 0o600)
        for file in ["bgtask.sqlite-wal", "bgtask.sqlite-shm"] {
            if let found = mode(state + "/" + file) { #expect(found == 0o600, "\(file) is \(String(found, radix: 8))") }
        }
        let status = try String(contentsOfFile: "/proc/\(host.pid)/status", encoding: .utf8)
        let ignored = status.split(separator: "\n").first { $0.hasPrefix("SigIgn:") }.flatMap { UInt64($0.split(separator: "\t").last ?? "", radix: 16) }
        #expect(ignored.map { $0 & (1 << (UInt64(SIGPIPE) - 1)) != 0 } == true, "SIGPIPE is not ignored by the host: \(String(describing: ignored))")
    }

    /// A launch killed (watchdog, jetsam) with 40 children in its group: they die as zombies,
    /// come to the host (a subreaper) with no environment left to recognise, and must be reaped.
    @Test(arguments: [("8GiB", RunRecord.Termination.watchdog), ("128MiB", .jetsam)])
    func aKilledLaunchLeavesNoZombieUnderTheHost(_ memoryLimit: String, _ expected: RunRecord.Termination) throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "1s", "--grace", "300ms", "--memory-limit", memoryLimit],
                                           installing: [.misbehaving])
        defer { host.stop() }
        for round in 1...2 {
            let response = try host.send(.simulateLaunch(identifier: "\(Self.misbehaving).fork-many", app: Self.misbehaving, force: true, kind: .refresh, wait: true))
            let record = try #require(response.record, "\(String(describing: response.error))")
            // Jetsam when the children's resident memory is counted over the limit; a sampler
            // that counts shared pages once may let the watchdog get there first.
            #expect(record.termination == expected || (expected == .jetsam && record.termination == .watchdog), "\(record)")
            // The watchdog comes after the 1 s budget, when all 40 have started; jetsam may
            // strike while they are still being started (and before their line is written).
            if record.termination == .watchdog { #expect(try record.logText().contains("40 children started")) }
            var left = zombies(of: host.pid)
            let deadline = Date().addingTimeInterval(3)
            while !left.isEmpty && Date() < deadline {
                usleep(50_000)
                left = zombies(of: host.pid)
            }
            #expect(left.isEmpty, "round \(round) (\(record.termination.rawValue)): \(left.count) zombies under the host")
        }
        #expect(try host.send(.status).ok)
    }
}

// MARK: Helpers

extension ResourceBoundsTests {
    /// A blocking connection to the host's control socket.
    func connectControl(_ state: URL) throws -> Int32 {
        var address = try unixAddress(state.appendingPathComponent("control.sock").path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HostTestError("socket: \(errno)") }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            close(fd)
            throw HostTestError("connect: \(errno)")
        }
        return fd
    }

    func sendFrame(_ json: String, to fd: Int32) throws {
        try ControlFrame.write(Data(json.utf8), to: fd)
    }

    /// The next answer on `fd`, or nil when the host closed the connection (or sent nothing
    /// within `timeout` seconds).
    func readAnswer(_ fd: Int32, timeout: Int = 10) throws -> ControlResponse? {
        var reader = ControlFrameReader(fd: fd, idleTimeout: .seconds(timeout), requestTimeout: .seconds(timeout))
        guard let payload = try? reader.next() else { return nil }
        if payload == ControlFrame.bareOK { return ControlResponse() }
        return try JSONDecoder.control.decode(ControlResponse.self, from: payload)
    }

    func threads(of pid: pid_t) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = status.split(separator: "\n").first { $0.hasPrefix("Threads:") } ?? ""
        return Int(line.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? 0
    }

    /// The names of `pid`'s threads (their `comm`, by thread id), for a failure's message.
    func threadNames(of pid: pid_t) -> String {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.compactMap { Int($0) }.sorted().map { tid in
            let name = (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8)) ?? "?"
            return "\(tid) \(name.trimmingCharacters(in: .whitespacesAndNewlines))"
        }.joined(separator: ", ")
    }

    /// Zombie children of `pid`.
    func zombies(of pid: pid_t) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { pid_t($0) }.filter { candidate in
            guard let stat = try? String(contentsOfFile: "/proc/\(candidate)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { return false }
            let fields = stat[stat.index(close, offsetBy: 2)...].split(separator: " ")
            return fields.count > 1 && fields[0] == "Z" && pid_t(fields[1]) == pid
        }
    }

    /// The host's invalid bundles once there are at least `count` (the watcher rescans a moment
    /// after a change), answered within 20 s each time (a scan that blocks fails here).
    func waitForInvalid(_ host: HostProcess, count: Int) throws -> [InvalidBundle] {
        let deadline = Date().addingTimeInterval(20)
        while true {
            let result = try runCLI(["apps", "--json", "--state", host.scratch.state.path], timeout: .seconds(20))
            guard result.status == 0 else { throw HostTestError("apps failed (\(result.status)): \(result.stderr)") }
            struct Body: Decodable { var invalid: [InvalidBundle] }
            let invalid = try JSONDecoder().decode(Body.self, from: Data(result.stdout.utf8)).invalid
            if invalid.count >= count || Date() > deadline { return invalid }
            usleep(100_000)
        }
    }

    static func plist(identifier: String, executable: String, permitted: [String] = []) -> String {
        var text = """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
            <key>CFBundleIdentifier</key><string>\(identifier)</string>
            <key>CFBundleExecutable</key><string>\(executable)</string>
            <key>UIBackgroundModes</key><array><string>fetch</string></array>
            <key>BGTaskSchedulerPermittedIdentifiers</key><array>
            """
        for entry in permitted { text += "<string>\(entry)</string>\n" }
        return text + "</array></dict></plist>\n"
    }

    /// An app named `name` with these permitted identifiers, moved into `plugins` whole.
    func installApp(_ name: String, identifiers: [String], in plugins: URL, scratch: Scratch) throws {
        let staged = scratch.url.appendingPathComponent("staged-\(name).app")
        try FileManager.default.createDirectory(at: staged, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: Products.library("Counter"), toPath: staged.appendingPathComponent("lib\(name).so").path)
        try Self.plist(identifier: "com.example.\(name.lowercased())", executable: "lib\(name).so", permitted: identifiers)
            .write(to: staged.appendingPathComponent("Info.plist"), atomically: true, encoding: .utf8)
        try FileManager.default.moveItem(at: staged, to: plugins.appendingPathComponent("\(name).app"))
    }

    enum Entry { case library, fifo, socket, device, innerLink, link(String) }

    /// `NAME.app` in `directory` whose executable (`libNAME.so`) and Info.plist are what the
    /// test needs.
    func makeApp(_ name: String, in directory: URL, executable: Entry, plist: Entry? = nil) throws -> URL {
        let bundle = directory.appendingPathComponent("\(name).app")
        try FileManager.default.createDirectory(at: bundle, withIntermediateDirectories: true)
        let library = bundle.appendingPathComponent("lib\(name).so").path
        let info = bundle.appendingPathComponent("Info.plist").path
        let text = Self.plist(identifier: "com.example.\(name.lowercased())", executable: "lib\(name).so")
        switch plist {
        case .fifo: guard mkfifo(info, 0o644) == 0 else { throw HostTestError("mkfifo: \(errno)") }
        case .link(let target): guard symlink(target, info) == 0 else { throw HostTestError("symlink: \(errno)") }
        default: try text.write(toFile: info, atomically: true, encoding: .utf8)
        }
        switch executable {
        case .library: try FileManager.default.copyItem(atPath: Products.library("Counter"), toPath: library)
        case .fifo: guard mkfifo(library, 0o644) == 0 else { throw HostTestError("mkfifo: \(errno)") }
        case .device: guard mknod(library, S_IFCHR | 0o644, dev_t((1 << 8) | 5)) /* 1:5, /dev/zero */ == 0 else { throw HostTestError("mknod: \(errno)") }
        case .innerLink:
            try FileManager.default.copyItem(atPath: Products.library("Counter"), toPath: library + ".1")
            guard symlink("lib\(name).so.1", library) == 0 else { throw HostTestError("symlink: \(errno)") }
        case .link(let target): guard symlink(target, library) == 0 else { throw HostTestError("symlink: \(errno)") }
        case .socket:
            var address = try unixAddress(library)
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            guard bound == 0 else { throw HostTestError("bind: \(errno)") }
        }
        return bundle
    }
}

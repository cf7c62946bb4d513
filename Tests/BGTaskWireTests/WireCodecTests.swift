import BGTaskModel
import BGTaskWire
import Foundation
import Testing

/// The launch channel's binary encoding, through a real socketpair: every message survives the
/// trip unchanged, and a frame that is not one (garbage, JSON, a truncated or padded message)
/// is refused with an error naming what is wrong, never trapped on.
struct WireCodecTests {
    static let request = TaskRequest(
        kind: .processing, identifier: "com.example.feed.db-cleaning", earliestBeginDate: 1_800_000_000.25,
        requiresNetworkConnectivity: true, requiresExternalPower: true, protectionType: 2,
        title: "Cleaning", subtitle: "ünïcödé ✓", strategyFail: true, requiredResources: 1)

    static let childMessages: [ChildMessage] = [
        .loading(path: "/p/Feed.app/libFeed.so", at: 1), .registered(identifier: "a.b", at: .max),
        .registerRefused(identifier: "a.c", reason: "not permitted"), .launched(at: 7), .launchFailed(error: ""),
        .taskBegan(task: 1, at: 2), .taskNotRegistered(task: 3), .expirationDelivered(task: 4, at: 5, toApp: true),
        .taskCompleted(task: 6, success: false, at: 8), .fatal(error: "registered twice"), .log(level: -1, message: "line\nline"),
        .submit(seq: 9, request: request), .submit(seq: 10, request: TaskRequest(kind: .refresh, identifier: "r")),
        .cancel(seq: 11, identifier: nil), .cancel(seq: 12, identifier: "x"), .pending(seq: 13),
        .progress(task: 1, completed: -5, total: .max), .title(task: 1, title: "T", subtitle: nil),
        .title(task: 1, title: "T", subtitle: "S"), .finished(at: 99, descendants: true, peakResidentBytes: 1 << 20), .finished(at: 100, descendants: false, peakResidentBytes: .max),
        .children(true), .children(false),
        .idle(at: 1, peakResidentBytes: 2, cpuNanoseconds: .max, hearsResumes: true, wakeups: 7), .idle(at: .max, peakResidentBytes: 0, cpuNanoseconds: 0, hearsResumes: false),
        .backgroundTimeBegan(id: 1, name: "upload", at: 3), .backgroundTimeBegan(id: .max, name: nil, at: 0),
        .backgroundTimeEnded(id: 1, at: 4), .backgroundTimeExpired(id: 2, at: 5, toApp: false),
        .deviceToken(seq: 14), .remoteNotificationCompleted(result: 2, at: 6),
        .notificationAuthorization(seq: 14, options: 7, request: true), .notificationAuthorization(seq: 15, options: 0, request: false),
        .notificationAdd(seq: 16, request: notification), .notificationAdd(seq: 17, request: calendarNotification),
        .notificationAdd(seq: 18, request: NotificationRequest(identifier: "bare", content: NotificationContent())),
        .notificationList(seq: 19, delivered: true), .notificationList(seq: 20, delivered: false),
        .notificationRemove(seq: 21, delivered: false, identifiers: nil), .notificationRemove(seq: 22, delivered: true, identifiers: ["a", "ü"]),
        .transferCall(seq: 23, json: #"{"op":"attach","session":"com.example.bg"}"#), .transferCall(seq: 24, json: ""),
    ]

    static let notification = NotificationRequest(
        identifier: "new-episodes",
        content: NotificationContent(
            title: "New episodes", subtitle: "Swift by the Sea", body: "3 new\nepisodes ✓", badge: -3, sound: "default",
            userInfo: ["show": .int(42), "ratio": .double(0.5), "explicit": .bool(false), "none": .null,
                       "episodes": .array([.string("e1"), .object(["deep": .array([.int(.min)])])])],
            threadIdentifier: "show.42", categoryIdentifier: "NEW_EPISODES"),
        trigger: .timeInterval(60.5, repeats: false))

    static let calendarNotification: NotificationRequest = {
        var match = DateMatch()
        match.hour = 8
        match.minute = 30
        match.weekday = 2
        match.timeZone = "Europe/Paris"
        match.calendar = "gregorian"
        return NotificationRequest(identifier: "digest", content: NotificationContent(title: "Digest"), trigger: .calendar(match, repeats: true))
    }()

    static let assignment = LaunchAssignment(
        launchID: "20261123T000000-abcdef01", role: .extension, bundleIdentifier: "com.example.feed.share",
        bundlePath: "/plugins/Feed.app/PlugIns/Share.appex", executablePath: "/plugins/Feed.app/PlugIns/Share.appex/libShare.so",
        dataDirectory: "/state/containers/com.example.feed", permittedIdentifiers: ["com.example.feed.refresh", "com.example.feed.export.*"],
        tasks: [TaskAssignment(task: 1, identifier: "com.example.feed.refresh", kind: .refresh),
                TaskAssignment(task: 2, identifier: "com.example.feed.export.1", kind: .continuedProcessing)],
        mappedHandlers: [MappedHandler(identifier: "com.example.counter.report", symbol: "report",
                                       arguments: [.identifier, .taskID, .complete, .dataDirectory], result: .int)],
        eventJSON: "{\"k\":1}", supportedResources: 3, memoryBackstopBytes: 1 << 33)

    static let timedAssignment: LaunchAssignment = {
        var timed = assignment
        timed.expiresAtNs = 123_456_789_000
        timed.backgroundRefreshStatus = 1
        timed.reason = "remote-notification"
        timed.suspendable = true
        return timed
    }()

    static let parentMessages: [ParentMessage] = [
        .start(assignment), .start(timedAssignment), .resume(timedAssignment), .resume(assignment),
        .start(LaunchAssignment(launchID: "l", role: .background, bundleIdentifier: "b", bundlePath: "/b", executablePath: "/b/l.so",
                                dataDirectory: "/d", permittedIdentifiers: [], tasks: [], mappedHandlers: [])),
        .expire(task: nil, reason: "budget"), .expire(task: 2, reason: "simulated"),
        .reply(seq: 1, status: 0, message: nil, requests: nil), .reply(seq: 2, status: 3, message: "too many", requests: []),
        .reply(seq: 3, status: 0, message: nil, requests: [request, TaskRequest(kind: .healthResearch, identifier: "h")]),
        .startTask(TaskAssignment(task: 5, identifier: "c.p.1", kind: .continuedProcessing)), .close, .probeChildren,
        .deadline(expiresAtNs: 42), .deadline(expiresAtNs: .max),
        .notificationReply(seq: 1, status: 0, message: nil, authorization: 2, notifications: []),
        .notificationReply(seq: 2, status: 110, message: "not allowed", authorization: 1, notifications: []),
        .notificationReply(seq: 3, status: 0, message: nil, authorization: 2,
                           notifications: [NotificationEntry(request: notification, date: 1_800_000_000.5),
                                           NotificationEntry(request: calendarNotification, date: nil)]),
        .transferReply(seq: 4, status: 0, message: nil, json: #"{"transfers":[]}"#),
        .transferReply(seq: 5, status: 100, message: "create: url: 'ftp://x' is not an absolute http or https URL", json: nil),
        .transferEvent(json: #"{"event":"progress"}"#),
    ]

    @Test func everyMessageCrossesTheChannelUnchanged() throws {
        let pair = try LaunchChannel.makePair()
        defer { pair.parent.close(); pair.child.close() }
        for message in Self.childMessages {
            try pair.child.send(message)
            #expect(try pair.parent.receive(ChildMessage.self) == message)
        }
        for message in Self.parentMessages {
            try pair.parent.send(message)
            #expect(try pair.child.receive(ParentMessage.self) == message)
        }
    }

    /// Every frame a misbehaving plugin could write instead of a message is refused with
    /// `.malformed` and a description of the frame.
    @Test func framesThatAreNotMessagesAreRefusedByName() throws {
        var good = WireWriter()
        ChildMessage.taskCompleted(task: 6, success: true, at: 8).write(to: &good)
        var badBool = good.bytes
        badBool[1 + 1 + 8] = 7
        var hugeArray = WireWriter()
        hugeArray.u8(0) // ParentMessage.start: launchID, role, four paths, then the identifiers' count
        hugeArray.string("l")
        hugeArray.u8(0)
        for _ in 0..<4 { hugeArray.string("/p") }
        hugeArray.u32(.max)
        let cases: [(bytes: [UInt8], says: String)] = [
            (Array("{\"hello\":{\"pid\":1}}".utf8), "format byte 0x7b"),
            (Array("garbage".utf8), "format byte"),
            ([0xB1], "frame ends inside message"),
            ([0xB1, 200], "no child message has tag 200"),
            (Array(good.bytes.dropLast()), "frame ends inside at"),
            (good.bytes + [0], "bytes left after the message"),
            (badBool, "success: 7 is not a boolean"),
        ]
        for (bytes, says) in cases {
            do {
                _ = try LaunchChannel.decode(ChildMessage.self, from: bytes)
                Issue.record("decoded \(bytes) as a ChildMessage")
            } catch {
                #expect(error.code == .malformed)
                #expect(error.detail.contains(says), "\(error.detail)")
                #expect(error.detail.contains("not a ChildMessage"))
            }
        }
        // A notification whose user info nests deeper than any request may is refused, not
        // recursed into until the reader's stack runs out.
        var deep = WireWriter()
        deep.u8(31) // notificationAdd
        deep.u64(1)
        deep.string("id")
        for _ in 0..<3 { deep.string("") }
        deep.bool(false)
        deep.bool(false)
        for _ in 0..<100_000 { deep.u8(5); deep.u32(1) }
        #expect { try LaunchChannel.decode(ChildMessage.self, from: deep.bytes) } throws: { error in
            (error as? ChannelError)?.detail.contains("user_info: nested deeper than 64 levels") == true
        }
        // A count no frame could hold is refused before anything is reserved for it.
        #expect { try LaunchChannel.decode(ParentMessage.self, from: hugeArray.bytes) } throws: { error in
            (error as? ChannelError)?.detail.contains("permittedIdentifiers: 4294967295 elements in 0 bytes") == true
        }
    }
}

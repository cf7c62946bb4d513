@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// Local notifications (`import UserNotifications`) in real launches of a podcast app
/// (Tests/Fixtures/Podcasts) under a real host on a virtual clock: authorization is the
/// operator's decision (denied by default), requests are kept by the host and delivered when due
/// while the app is not running, listed and removed by the app and shown by `bgtask
/// notifications`, and what an app or a client hands the host is bounded.
@Suite struct NotificationTests {
    static let app = "com.example.podcasts"
    static let podcasts = TestBundle(library: "Podcasts", info: "Tests/Fixtures/Podcasts/Info.plist", name: "Podcasts.app")

    /// A host on a virtual clock with the podcast app installed (no desktop: the tests' own
    /// session bus, if any, is not theirs to post to).
    private func started(_ scratch: Scratch, environment: [String: String?] = ["DBUS_SESSION_BUS_ADDRESS": nil],
                         arguments: [String] = ["--clock", "virtual"]) throws -> HostProcess {
        let host = try HostProcess(scratch: scratch, arguments: arguments)
        host.environment = environment
        try host.install(Self.podcasts.library, info: Self.podcasts.info, as: Self.podcasts.name)
        try host.start()
        return host
    }

    /// Runs one of the app's tasks in a launch the host starts, and returns its record and the
    /// app's lines.
    private func launch(_ host: HostProcess, _ task: String) throws -> (RunRecord, [String]) {
        let response = try host.send(.simulateLaunch(identifier: "com.example.podcasts.\(task)", app: Self.app, force: true, wait: true))
        let record = try #require(response.record, "no record: \(response.error?.message ?? "")")
        let lines = ((try? record.logText()) ?? "").split(separator: "\n").map(String.init).filter { $0.hasPrefix("podcasts: ") }
        return (record, lines.map { String($0.dropFirst("podcasts: ".count)) })
    }

    private func notifications(_ host: HostProcess, pending: Bool = false) throws -> [StoredNotification] {
        try host.send(pending ? .pendingNotifications(app: Self.app) : .notifications(app: Self.app)).notifications ?? []
    }

    /// The user opens a delivered notification (`bgtask respond`): the app comes to the
    /// foreground and its delegate's `didReceive` gets the notification and the action; the
    /// launch lasts until the delegate calls its completion handler.
    @Test func openingADeliveredNotificationCallsTheDelegatesDidReceive() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch, arguments: ["--clock", "virtual", "--foreground-stay", "3s"])
        defer { host.stop() }
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "on"]).status == 0)
        _ = try launch(host, "refresh")
        #expect(try host.cli(["clock", "advance", "1m"]).status == 0)
        let delivered = try #require(try notifications(host).first { $0.request.identifier == "new-episodes" })

        let answer = try host.call(.respond(notification: delivered.id, wait: true))
        let record = try #require(answer.record)
        #expect(record.reason == "notification-response" && record.succeeded, "\(record)")
        let lines = try record.logText().split(separator: "\n").filter { $0.hasPrefix("podcasts: ") }
        #expect(lines.contains { $0.contains("opened notification new-episodes (\(delivered.request.content.title)) action com.apple.UNNotificationDefaultActionIdentifier state 0") },
                "\(lines)")
        #expect(lines.contains("podcasts: handled the response"), "the launch lasted until the completion handler: \(lines)")

        // In the foreground when one is delivered: the delegate's willPresent decides, and the
        // record says how it was shown.
        _ = try launch(host, "refresh")
        let opened = try host.call(.open(app: Self.app))
        usleep(1_000_000)  // its entry returns: it is in the foreground (for 3 s)
        #expect(try host.cli(["clock", "advance", "1m"]).status == 0)
        let foreground = try #require(try host.waitForHistory(count: 4).first { $0.launchID == opened.launchID })
        #expect(foreground.notificationsPresented == ["new-episodes": "banner, sound"], "\(foreground)")
        #expect(try foreground.logText().contains("podcasts: will present new-episodes in state 0"))

        // Another action, through the CLI; an id no notification has is refused by name.
        // (The same identifier delivered again replaced the first, as on iOS: a new id.)
        let again = try #require(try notifications(host).first { $0.request.identifier == "new-episodes" })
        let dismissed = try host.cli(["respond", String(again.id), "--action", "com.apple.UNNotificationDismissActionIdentifier", "--wait", "--json"])
        #expect(dismissed.status == 0 && dismissed.stdout.contains("notification-response"), "\(dismissed.stderr)")
        #expect(dismissed.stdout.contains("\"reason\":\"notification-response\""))
        let unknown = try host.cli(["respond", "999999"])
        #expect(unknown.status != 0 && unknown.stderr.contains("no delivered notification has id 999999"), "\(unknown.stderr)")
    }

    @Test func authorizationIsDeniedByDefaultAndGrantedWithTheSwitch() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }

        // Before the app asks: not determined.
        var report = try #require(try host.send(.notifications(app: Self.app)).notificationApps?.first)
        #expect(report.authorization == "not-determined" && report.allowed == nil && report.askedAt == nil)

        let (denied, deniedLines) = try launch(host, "refresh")
        #expect(denied.succeeded, "\(denied)")
        #expect(deniedLines.contains("status before asking: 0"), "\(deniedLines)")
        #expect(deniedLines.contains("granted false, status 1, alert 1"), "\(deniedLines)")
        #expect(deniedLines.contains("not allowed: UNError 1 UNErrorDomain"), "\(deniedLines)")
        #expect(deniedLines.contains("pending after refresh: []"))
        #expect(denied.notificationsAdded == nil)
        // The host recorded that it asked: denied now, as after a user's "Don't Allow".
        report = try #require(try host.send(.notifications(app: Self.app)).notificationApps?.first)
        #expect(report.authorization == "denied" && report.askedAt != nil && report.askedOptions == 7, "\(report)")

        let on = try host.cli(["device", "--app", Self.app, "--notifications", "on"])
        #expect(on.status == 0, "\(on.stderr)")
        #expect(on.stdout.contains("notifications        authorized  (com.example.podcasts)"), "\(on.stdout)")
        let (granted, grantedLines) = try launch(host, "refresh")
        #expect(grantedLines.contains("status before asking: 2"), "\(grantedLines)")
        #expect(grantedLines.contains("granted true, status 2, alert 2"), "\(grantedLines)")
        #expect(grantedLines.contains("pending after refresh: [\"new-episodes\", \"listen-later\"]"), "\(grantedLines)")
        #expect(granted.notificationsAdded == ["new-episodes", "listen-later"])
        #expect(granted.description.contains("notifications added: new-episodes, listen-later"))

        // Off again: adding is refused, what was pending stays (as iOS keeps it).
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "off"]).status == 0)
        let (_, offLines) = try launch(host, "refresh")
        #expect(offLines.contains("granted false, status 1, alert 1"), "\(offLines)")
        #expect(try notifications(host, pending: true).map(\.request.identifier) == ["new-episodes", "listen-later"])
    }

    @Test func theHostFlagAllowsEveryApp() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch, arguments: ["--clock", "virtual", "--allow-notifications"])
        defer { host.stop() }
        let (_, lines) = try launch(host, "refresh")
        #expect(lines.contains("status before asking: 2"), "\(lines)")
        // The app's own switch still wins.
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "off"]).status == 0)
        let (_, off) = try launch(host, "refresh")
        #expect(off.contains("granted false, status 1, alert 1"), "\(off)")
    }

    @Test func aTimeIntervalTriggerIsDeliveredWhileTheAppIsNotRunning() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "on"]).status == 0)
        let (record, _) = try launch(host, "refresh")
        #expect(record.succeeded)
        let clock = try #require(try host.send(.clock()).clock?.now)

        // Pending, soonest first, with their delivery dates on the host's clock.
        let pending = try notifications(host, pending: true)
        #expect(pending.map(\.request.identifier) == ["new-episodes", "listen-later"])
        let due = try #require(pending.first?.fireDate)
        #expect(abs(due.timeIntervalSince(clock) - 60) < 2, "due \(due), clock \(clock)")
        #expect(pending.first?.launchID == record.launchID)
        #expect(try notifications(host).isEmpty)

        // The launch is over; a minute later the host delivers it.
        #expect(try host.cli(["clock", "advance", "1m"]).status == 0)
        let delivered = try notifications(host)
        #expect(delivered.map(\.request.identifier) == ["new-episodes"])
        let content = try #require(delivered.first?.request.content)
        #expect(content.title == "New episodes" && content.subtitle == "Swift by the Sea" && content.body == "3 new episodes downloaded")
        #expect(content.badge == 3 && content.sound == "default" && content.threadIdentifier == "com.example.podcasts.show.42")
        #expect(content.userInfo["show"] == .int(42) && content.userInfo["explicit"] == .bool(false))
        #expect(try notifications(host, pending: true).map(\.request.identifier) == ["listen-later"])
        #expect(try String(contentsOfFile: host.logPath, encoding: .utf8).contains("notification delivered"))

        // Two hours on, the repeating one is delivered once (not once per missed hour) and
        // stays pending, an hour after the last due date.
        #expect(try host.cli(["clock", "advance", "2h"]).status == 0)
        #expect(try notifications(host).map(\.request.identifier) == ["new-episodes", "listen-later"])
        let again = try #require(try notifications(host, pending: true).first)
        let now = try #require(try host.send(.clock()).clock?.now)
        #expect(again.request.identifier == "listen-later" && (again.fireDate ?? .distantPast) > now)

        // The CLI's words and JSON.
        let text = try host.cli(["notifications", Self.app])
        #expect(text.status == 0, "\(text.stderr)")
        #expect(text.stdout.hasPrefix("com.example.podcasts: notifications authorized (switch on, asked "), "\(text.stdout)")
        #expect(text.stdout.contains("com.example.podcasts  new-episodes  delivered "), "\(text.stdout)")
        #expect(text.stdout.contains("  New episodes — Swift by the Sea\n  3 new episodes downloaded"), "\(text.stdout)")
        let pendingText = try host.cli(["notifications", "--pending"])
        #expect(pendingText.stdout.contains("com.example.podcasts  listen-later  due ") && pendingText.stdout.contains("every 1h"), "\(pendingText.stdout)")
        let json = try host.cli(["notifications", Self.app, "--json"])
        let parsed = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        let body = try #require(parsed, "\(json.stdout)")
        let listed = try #require(body["notifications"] as? [[String: Any]])
        let identifiers = listed.compactMap { ($0["request"] as? [String: Any])?["identifier"] as? String }
        #expect(identifiers == ["new-episodes", "listen-later"])
        let state = listed.first?["state"] as? String
        let deliveredAt = listed.first?["delivered_at"] as? String
        #expect(state == "delivered" && deliveredAt != nil)
        let authorization = (body["apps"] as? [[String: Any]])?.first?["authorization"] as? String
        #expect(authorization == "authorized")

        // The app reads them back (newest first), then removes them.
        let (_, lines) = try launch(host, "list")
        #expect(lines.contains("pending: [\"listen-later\"]"), "\(lines)")
        #expect(lines.contains("delivered: [\"listen-later\", \"new-episodes\"]"), "\(lines)")
        #expect(lines.contains("delivered content: New episodes / Swift by the Sea / 3 new episodes downloaded / badge 3 / sound true / thread com.example.podcasts.show.42 / show 42 / episodes 3 / delivered 2h ago"), "\(lines)")
        let (_, removed) = try launch(host, "remove")
        #expect(removed == ["pending: []", "delivered: [\"listen-later\"]", "pending: []", "delivered: []"], "\(removed)")
        #expect(try notifications(host).isEmpty && notifications(host, pending: true).isEmpty)
    }

    @Test func followPrintsNotificationsAsTheyAreDelivered() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "on"]).status == 0)
        _ = try launch(host, "refresh")
        // `--follow` runs until killed: runCLI kills its group at the timeout and returns what
        // it printed.
        nonisolated(unsafe) var followed: CLIResult?
        let done = DispatchSemaphore(value: 0)
        let state = scratch.state.path
        DispatchQueue.global().async {
            followed = try? runCLI(["notifications", "--follow", "--json", "--state", state], timeout: .seconds(5))
            done.signal()
        }
        usleep(1_000_000)
        #expect(try host.cli(["clock", "advance", "1m"]).status == 0)
        #expect(done.wait(timeout: .now() + 30) == .success)
        let output = try #require(followed).stdout
        let lines = output.split(separator: "\n")
        #expect(lines.count == 1, "\(output)")
        let object = try JSONSerialization.jsonObject(with: Data((lines.first ?? "{}").utf8)) as? [String: Any]
        let identifier = (object?["request"] as? [String: Any])?["identifier"] as? String
        #expect(identifier == "new-episodes", "\(output)")
    }

    @Test func calendarTriggersAreKeptWithTheirNextDate() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "on"]).status == 0)
        let (_, lines) = try launch(host, "calendar")
        #expect(lines.contains("calendar add: ok"), "\(lines)")
        #expect(lines.contains("calendar pending: [\"digest\"], hour 8, repeats true, next true"), "\(lines)")
        let pending = try #require(try notifications(host, pending: true).first)
        let fire = try #require(pending.fireDate)
        let parts = Calendar(identifier: .gregorian).dateComponents([.hour, .minute], from: fire)
        #expect(parts.hour == 8 && parts.minute == 30, "\(fire)")
        #expect(try host.cli(["clock", "advance", "1d"]).status == 0)
        #expect(try notifications(host).map(\.request.identifier) == ["digest"])
        #expect((try notifications(host, pending: true).first?.fireDate ?? .distantPast) > fire)
    }

    @Test func hostileInputsAreRefusedByName() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "on"]).status == 0)
        let (record, lines) = try launch(host, "hostile")
        #expect(record.succeeded, "\(record)")
        #expect(lines.contains("big: NSCocoaErrorDomain 4866 invalid notification request: content.body is 5000 bytes, over the limit of 4 KiB"), "\(lines)")
        #expect(lines.contains { $0.hasPrefix("dated: 3852 content.user_info.when: a Date is not a value") }, "\(lines)")
        #expect(lines.contains("never: UNError 1400"), "\(lines)")
        // 70 added: as iOS, the 64 that fire soonest are kept.
        #expect(lines.contains("pending count 64, first reminder-0, last reminder-63"), "\(lines)")
        let pending = try notifications(host, pending: true)
        #expect(pending.count == 64 && pending.last?.request.identifier == "reminder-63")
        #expect(try String(contentsOfFile: host.logPath, encoding: .utf8).contains("more than 64 pending notifications"))
        #expect(record.notificationsAdded?.count == 70)

        // Garbage over the control socket: each refused with a word that names it.
        // (Requests as they are on the wire: no client of this package can send most of them.)
        let refusals: [(ControlRequest, ControlErrorCode, String)] = [
            (ControlRequest(verb: ControlVerb.notifications.rawValue, after: "x'; DROP TABLE notification"), .badRequest, "after must be a notification id"),
            (ControlRequest(verb: ControlVerb.notifications.rawValue, after: "-1"), .badRequest, "after must be a notification id"),
            (ControlCommand.notifications(limit: 0).wire, .badRequest, "limit must be at least 1"),
            (ControlCommand.pendingNotifications(app: String(repeating: "a", count: 300)).wire, .badRequest, "over the limit of 255"),
            (ControlRequest(verb: ControlVerb.device.rawValue, device: ["app": Self.app, "notifications": "maybe"]), .badRequest, "notifications are on, off or auto"),
            (ControlRequest(verb: ControlVerb.device.rawValue, device: ["notifications": "on"]), .badRequest, "a change of them names the app"),
            (ControlCommand.device(DeviceChanges(app: .init(app: "com.example.absent", notifications: .on))).wire, .notFound, "com.example.absent"),
        ]
        for (request, code, says) in refusals {
            let response = try host.send(wire: request)
            #expect(response.failure?.code == code && response.error?.message.contains(says) == true, "\(request): \(String(describing: response.error))")
        }
        // A huge cursor is no error, only nothing after it; the host still answers.
        #expect(try host.send(.notifications(after: 9223372036854775807)).notifications == [])
        #expect(try host.cli(["notifications", "--pending", "--follow"]).status == 64)
        #expect(try notifications(host, pending: true).count == 64)
    }

    @Test func bgtaskRunAuthorizesOnlyWithItsSwitch() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Podcasts", info: Self.podcasts.info)
        let (denied, _) = try scratch.run(bundle, ["--task", "com.example.podcasts.refresh"])
        #expect(try denied.logText().contains("granted false, status 1"))
        let (granted, _) = try scratch.run(bundle, ["--task", "com.example.podcasts.refresh", "--notifications", "on"])
        #expect(try granted.logText().contains("pending after refresh: [\"new-episodes\", \"listen-later\"]"))
        #expect(granted.notificationsAdded == ["new-episodes", "listen-later"])
    }

    // MARK: The desktop

    @Test func withoutASessionBusNothingIsPostedAndTheHostSaysWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try started(scratch)
        defer { host.stop() }
        #expect(try String(contentsOfFile: host.logPath, encoding: .utf8).contains("desktop notifications: off, no session bus"))
        #expect(DesktopNotifier.detect(environment: [:], logger: .init(label: "t")).0 == nil)
        #expect(DesktopNotifier.detect(environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/x", "PATH": "/nonexistent"], logger: .init(label: "t")).why
            == "a session bus, but neither gdbus nor notify-send on PATH")
    }

    /// A fake `gdbus` on PATH records its arguments and fails: the notification is delivered
    /// and kept all the same, and the failure is logged.
    @Test func aDeliveredNotificationIsPostedThroughTheSessionBus() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bin = scratch.url.appendingPathComponent("bin")
        try FileManager.default.createDirectory(at: bin, withIntermediateDirectories: true)
        let record = scratch.url.appendingPathComponent("gdbus-args")
        let fake = bin.appendingPathComponent("gdbus")
        // It answers GetCapabilities as a server with body markup does.
        try "#!/bin/sh\ncase \"$*\" in *GetCapabilities*) echo \"(['body', 'body-markup'],)\"; exit 0;; esac\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > \(record.path).tmp\nmv \(record.path).tmp \(record.path)\nexit 3\n"
            .write(to: fake, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: fake.path)
        let path = "\(bin.path):" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        let host = try started(scratch, environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/bus", "PATH": path])
        defer { host.stop() }
        #expect(try host.cli(["device", "--app", Self.app, "--notifications", "on"]).status == 0)
        _ = try launch(host, "refresh")
        #expect(try host.cli(["clock", "advance", "1m"]).status == 0)
        #expect(try notifications(host).map(\.request.identifier) == ["new-episodes"])
        let deadline = Date().addingTimeInterval(15)
        while !FileManager.default.fileExists(atPath: record.path) && Date() < deadline { usleep(20_000) }
        let arguments = try String(contentsOf: record, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(arguments.prefix(9) == ["call", "--session", "--dest", "org.freedesktop.Notifications", "--object-path",
                                        "/org/freedesktop/Notifications", "--method", "org.freedesktop.Notifications.Notify", "--timeout"], "\(arguments)")
        #expect(arguments.suffix(8) == ["'com.example.podcasts'", "uint32 0", "''", "'New episodes'", "'Swift by the Sea\\n3 new episodes downloaded'",
                                        "@as []", "@a{sv} {}", "int32 5000"], "\(arguments)")
        var log = ""
        while Date() < deadline {
            log = try String(contentsOfFile: host.logPath, encoding: .utf8)
            if log.contains("desktop notification failed") { break }
            usleep(20_000)
        }
        #expect(log.contains("desktop notifications: posting delivered notifications through gdbus"), "\(log)")
        #expect(log.contains("desktop notification failed: \(fake.path) exited with status 3"), "\(log)")
    }

    @Test func gvariantStringsAreQuotedAndEscaped() {
        #expect(DesktopNotifier.gvariantString("it's a \\ test\n\u{1}") == "'it\\'s a \\\\ test\\n\\u0001'")
        let command = DesktopNotifier.command(.notifySend("/usr/bin/notify-send"), app: "a.b", content: NotificationContent(body: "only a body"))
        #expect(command == ["/usr/bin/notify-send", "--app-name=a.b", "--expire-time=5000", "--", "a.b", "only a body"])
    }

    /// Markup (hostile class): an app's `<a href>`, `<img src="file:///etc/shadow">` and `<b>`
    /// reach a server that renders body markup as text (entities), never as a link, an image
    /// of a local file or bold; the summary is plain text by the spec and sent as it is, on
    /// one line. A server without body markup gets the text as written (it shows it as is).
    @Test func markupInANotificationReachesTheDesktopAsText() {
        let hostile = NotificationContent(title: "<b>Bank</b> <a href=\"https://evil.example\">login</a>",
                                          subtitle: "<img src=\"file:///etc/shadow\">",
                                          body: "<a href='https://evil.example/x?a=1&b=2'>update</a> & <b>now</b>")
        let escapedBody = "&lt;img src=&quot;file:///etc/shadow&quot;&gt;\n"
            + "&lt;a href=&apos;https://evil.example/x?a=1&amp;b=2&apos;&gt;update&lt;/a&gt; &amp; &lt;b&gt;now&lt;/b&gt;"
        let gdbus = DesktopNotifier.command(.gdbus("/usr/bin/gdbus"), app: "a.b", content: hostile)
        #expect(gdbus[gdbus.count - 4] == DesktopNotifier.gvariantString(escapedBody), "\(gdbus)")
        #expect(gdbus[gdbus.count - 5] == DesktopNotifier.gvariantString(hostile.title))
        let notifySend = DesktopNotifier.command(.notifySend("/usr/bin/notify-send"), app: "a.b", content: hostile)
        #expect(notifySend.last == escapedBody)
        for argument in gdbus + notifySend where argument != gdbus[gdbus.count - 5] && argument != notifySend[notifySend.count - 2] {
            #expect(!argument.contains("<"), "\(argument)")
        }
        let plain = DesktopNotifier.command(.notifySend("/usr/bin/notify-send"), app: "a.b", content: hostile, bodyMarkup: false)
        #expect(plain.last == "<img src=\"file:///etc/shadow\">\n" + hostile.body)
        let twoLines = DesktopNotifier.command(.notifySend("/n"), app: "a.b", content: NotificationContent(title: "one\ntwo"))
        #expect(twoLines[twoLines.count - 2] == "one two")
    }

    @Test func aCommandThatHangsIsKilledAtItsDeadline() {
        let started = Date()
        let failure = DesktopNotifier.run(["/bin/sleep", "30"], environment: [:], timeout: 0.3)
        #expect(failure == "/bin/sleep did not finish within 300ms; killed")
        #expect(Date().timeIntervalSince(started) < 5)
    }
}

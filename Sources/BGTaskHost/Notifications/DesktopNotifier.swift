import BGTaskControl
import BGTaskModel
import BGTaskSystem
import Dispatch
import Foundation
import Glibc
import Logging

/// Posts delivered notifications to the desktop's notification service
/// (`org.freedesktop.Notifications` on the session bus), so that a developer on a Linux desktop
/// sees the banner their app's refresh posts. Used only where a session bus is present
/// (`DBUS_SESSION_BUS_ADDRESS` set) and a client exists (`gdbus`, else `notify-send`).
///
/// Each post is a spawned process, started and waited for off the host's queues, killed after
/// `timeout`, at most `maximumInFlight` at once (past that a post is dropped and logged); every
/// failure is logged and nothing else depends on it.
final class DesktopNotifier: @unchecked Sendable {
    enum Tool: Equatable {
        case gdbus(String)
        case notifySend(String)

        var name: String {
            switch self {
            case let .gdbus(path): "gdbus (\(path))"
            case let .notifySend(path): "notify-send (\(path))"
            }
        }
    }

    let tool: Tool
    private let environment: [String: String]
    private let logger: Logger
    private let inFlight = LockedValue(0)
    /// The server's `body-markup` capability, once asked (`serverRendersBodyMarkup`).
    private let bodyMarkup = LockedValue<Bool?>(nil)

    static let maximumInFlight = 4
    static let timeout: TimeInterval = 5
    /// How long a banner stays (ms), as the notification service's `expire_timeout`.
    static let expireTimeoutMs = 5000

    init(tool: Tool, environment: [String: String], logger: Logger) {
        self.tool = tool
        self.environment = environment
        self.logger = logger
    }

    /// A notifier for this environment, or nil (and why) when there is no session bus or no
    /// client on `PATH`.
    static func detect(environment: [String: String], logger: Logger) -> (DesktopNotifier?, why: String) {
        guard let bus = environment["DBUS_SESSION_BUS_ADDRESS"], !bus.isEmpty else {
            return (nil, "no session bus (DBUS_SESSION_BUS_ADDRESS is not set)")
        }
        let path = (environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":").map(String.init)
        func find(_ name: String) -> String? {
            path.lazy.map { "\($0)/\(name)" }.first { access($0, X_OK) == 0 }
        }
        if let gdbus = find("gdbus") { return (DesktopNotifier(tool: .gdbus(gdbus), environment: environment, logger: logger), "") }
        if let notifySend = find("notify-send") {
            return (DesktopNotifier(tool: .notifySend(notifySend), environment: environment, logger: logger), "")
        }
        return (nil, "a session bus, but neither gdbus nor notify-send on PATH")
    }

    /// The command that posts `content` for `app`.
    ///
    /// The text is the app's, and the desktop renders it: the Desktop Notifications spec lets
    /// the body carry markup (`<a href>`, `<img src>`, `<b>`, `<i>`, `<u>`) on a server that has
    /// the `body-markup` capability, so there (`bodyMarkup`) the body is escaped
    /// (`markupEscaped`) and shows as the app wrote it, never as a link or an image of a
    /// local file. The summary is plain text by the spec (GNOME Shell, Plasma and dunst show
    /// it escaped): sent as it is, on one line. `app_name` is the host's (a bundle id).
    static func command(_ tool: Tool, app: String, content: NotificationContent, bodyMarkup: Bool = true) -> [String] {
        let summary = (content.title.isEmpty ? app : content.title).replacingOccurrences(of: "\n", with: " ")
        let text = [content.subtitle, content.body].filter { !$0.isEmpty }.joined(separator: "\n")
        let body = bodyMarkup ? markupEscaped(text) : text
        switch tool {
        case let .gdbus(path):
            // Notify(app_name, replaces_id, app_icon, summary, body, actions, hints, expire_timeout),
            // each argument in GVariant's text format.
            return [path, "call", "--session", "--dest", "org.freedesktop.Notifications",
                    "--object-path", "/org/freedesktop/Notifications", "--method", "org.freedesktop.Notifications.Notify",
                    "--timeout", "\(Int(timeout))",
                    gvariantString(app), "uint32 0", gvariantString(""), gvariantString(summary), gvariantString(body),
                    "@as []", "@a{sv} {}", "int32 \(expireTimeoutMs)"]
        case let .notifySend(path):
            return [path, "--app-name=\(app)", "--expire-time=\(expireTimeoutMs)", "--", summary, body]
        }
    }

    /// `text` for the spec's body markup (XML): `&`, `<`, `>` and both quotes as entities, so
    /// that no tag, attribute or entity of the app's reaches the server's markup parser.
    static func markupEscaped(_ text: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(text.utf8.count)
        for character in text {
            switch character {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&apos;"
            default: escaped.append(character)
            }
        }
        return escaped
    }

    /// The command that asks the notification server for its capabilities (gdbus only:
    /// notify-send cannot ask).
    static func capabilitiesCommand(_ path: String) -> [String] {
        [path, "call", "--session", "--dest", "org.freedesktop.Notifications",
         "--object-path", "/org/freedesktop/Notifications", "--method", "org.freedesktop.Notifications.GetCapabilities",
         "--timeout", "\(Int(timeout))"]
    }

    /// Whether the server renders body markup, asked once (the first post): true unless it
    /// answered without `body-markup`. Not knowing (notify-send, no answer) is taken as markup:
    /// the worst an escaped body does on a server without it is show `&lt;` as text, while a
    /// raw body on a server with it renders the app's tags.
    private func serverRendersBodyMarkup() -> Bool {
        if let known = bodyMarkup.withLock({ $0 }) { return known }
        var answer = true
        if case let .gdbus(path) = tool, let output = Self.output(Self.capabilitiesCommand(path), environment: environment, timeout: Self.timeout) {
            answer = output.contains("'body-markup'")
            logger.info("desktop notifications: the server \(answer ? "renders" : "does not render") body markup",
                        metadata: ["capabilities": "\(output.trimmingCharacters(in: .whitespacesAndNewlines))"])
        }
        bodyMarkup.withLock { $0 = answer }
        return answer
    }

    /// `text` as a GVariant string literal: single-quoted, with backslash escapes for quotes,
    /// backslashes and control characters.
    static func gvariantString(_ text: String) -> String {
        var quoted = "'"
        for scalar in text.unicodeScalars {
            switch scalar {
            case "'": quoted += "\\'"
            case "\\": quoted += "\\\\"
            case "\n": quoted += "\\n"
            case "\t": quoted += "\\t"
            case "\r": quoted += "\\r"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    quoted += String(format: "\\u%04x", scalar.value)
                } else {
                    quoted.unicodeScalars.append(scalar)
                }
            }
        }
        return quoted + "'"
    }

    /// Posts in the background; returns at once.
    func post(app: String, content: NotificationContent) {
        let admitted = inFlight.withLock { count -> Bool in
            guard count < Self.maximumInFlight else { return false }
            count += 1
            return true
        }
        guard admitted else {
            logger.warning("desktop notification dropped: \(Self.maximumInFlight) posts are still running", metadata: ["bundle.id": "\(app)"])
            return
        }
        DispatchQueue.global(qos: .utility).async { [self] in
            defer { inFlight.withLock { $0 -= 1 } }
            let command = Self.command(tool, app: app, content: content, bodyMarkup: serverRendersBodyMarkup())
            if let failure = Self.run(command, environment: environment, timeout: Self.timeout) {
                logger.warning("desktop notification failed: \(failure)", metadata: ["bundle.id": "\(app)", "command": "\(command[0])"])
            }
        }
    }

    /// What `command` printed, when it exited 0 within `timeout` (at most 64 KiB of it); nil
    /// otherwise. Its output goes to a file that is unlinked as soon as it is made.
    static func output(_ command: [String], environment: [String: String], timeout: TimeInterval) -> String? {
        var template = Array("/tmp/bgtask-notify-XXXXXX".utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard fd >= 0 else { return nil }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        unlink(String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        defer { close(fd) }
        guard run(command, environment: environment, timeout: timeout, stdout: fd) == nil else { return nil }
        var bytes = [UInt8](repeating: 0, count: 64 * 1024)
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        return count > 0 ? String(decoding: bytes[..<count], as: UTF8.self) : ""
    }

    /// Runs `command` and waits at most `timeout`: nil when it exited 0, else what went wrong.
    /// Its output goes to `stdout`, or nowhere; a command still running at the deadline is killed with its
    /// process group.
    static func run(_ command: [String], environment: [String: String], timeout: TimeInterval, stdout: Int32? = nil) -> String? {
        let pid: pid_t
        do {
            pid = try Subprocess.spawn(command, environment: environment, stdout: stdout)
        } catch {
            return "cannot start \(command[0]): \(error)"
        }
        let deadline = Date().addingTimeInterval(timeout)
        var status: Int32 = 0
        while true {
            let rc = waitpid(pid, &status, WNOHANG)
            if rc == pid { break }
            if rc == -1 && errno == EINTR { continue }
            if rc == -1 {
                // Reaped by the host's orphan reaper (it reaps every zombie child): ended,
                // outcome unknown.
                return nil
            }
            if Date() >= deadline {
                kill(-pid, SIGKILL)
                kill(pid, SIGKILL)
                while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
                return "\(command[0]) did not finish within \(DurationText.format(seconds: timeout)); killed"
            }
            usleep(10_000)
        }
        let code = Subprocess.exitCode(status)
        return code == 0 ? nil : "\(command[0]) exited with status \(code)"
    }
}

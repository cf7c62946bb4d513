import ArgumentParser
import BGTaskHost
import BGTaskControl
import Foundation

extension BGTaskCommand {
    struct Push: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send a push to an app, as `xcrun simctl push` does for the simulator.",
            discussion: """
                The payload is a JSON file (or - for standard input) with an "aps" dictionary, the shape simctl takes; \
                with "content-available": 1 it is a background push, which launches the app (reason remote-notification) \
                and calls its delegate's application(_:didReceiveRemoteNotification:fetchCompletionHandler:). The app may \
                be left out when the payload names it under "Simulator Target Bundle". The answer says what became of the \
                push: delivered in a launch, waiting and why, or dropped and why (see also bgtask pushes, bgtask why ID).
                """)
        @Argument(help: ArgumentHelp("[APP] PAYLOAD: the app's bundle identifier (optional with \"Simulator Target Bundle\"), then the payload file or -.", valueName: "app-and-payload"))
        var arguments: [String]
        @Option(name: .customLong("type"), help: ArgumentHelp("apns-push-type: background or alert (another is passed on, and refused as APNs refuses it). Default: from the payload.", valueName: "type"), completion: .list(["background", "alert"]))
        var pushType: String?
        @Option(name: .long, help: ArgumentHelp("apns-priority: 10, 5 or 1. Default: 5 for a background push, 10 otherwise.", valueName: "n"))
        var priority: Int?
        @Option(name: .long, help: ArgumentHelp("apns-expiration: seconds since 1970 by which the push must be delivered, or 0 for now or never.", valueName: "seconds"))
        var expiration: Double?
        @Option(name: .customLong("collapse-id"), help: ArgumentHelp("apns-collapse-id.", valueName: "id"))
        var collapseID: String?
        @Option(name: .long, help: ArgumentHelp("apns-id (a UUID). Default: one is made.", valueName: "uuid"))
        var id: String?
        @OptionGroup var host: HostOptions

        func validate() throws {
            guard (1...2).contains(arguments.count) else { throw ValidationError("push takes [APP] PAYLOAD (a file, or - for standard input)") }
        }

        func run() throws {
            let path = arguments.last!
            let payload: Data
            if path == "-" {
                payload = FileHandle.standardInput.readDataToEndOfFile()
            } else {
                guard let data = FileManager.default.contents(atPath: path) else {
                    throw ValidationError("cannot read the payload file \(path)")
                }
                payload = data
            }
            var app = arguments.count == 2 ? arguments[0] : nil
            if app == nil, let object = try? JSONSerialization.jsonObject(with: payload) as? [String: Any] {
                app = object["Simulator Target Bundle"] as? String
            }
            guard let app else {
                throw ValidationError("name the app: bgtask push APP \(path) (or put \"Simulator Target Bundle\" in the payload)")
            }
            let body = PushBody(payload: String(decoding: payload, as: UTF8.self), pushType: pushType, priority: priority,
                                expiration: expiration, collapseID: collapseID, id: id)
            let report = try host.call(.push(app: app, body))
            if host.json { return try host.printJSON(report) }
            print(report.text)
        }
    }

    struct Pushes: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List recent pushes and what became of each: delivered, waiting (and why), dropped (and why).")
        @Argument(help: "Only this app's pushes.") var app: String?
        @Option(name: .long, help: ArgumentHelp("At most this many, newest first.", valueName: "n")) var limit: Int = 50
        @OptionGroup var host: HostOptions

        func run() throws {
            let reports = try host.call(.pushes(app: app, limit: limit))
            if host.json { return try host.printJSON(reports) }
            if reports.isEmpty { print("no pushes\(app.map { " for \($0)" } ?? "")") }
            for report in reports { print(report.text) }
        }
    }

    struct DeviceToken: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "device-token",
            abstract: "Print an app's device token (what its registerForRemoteNotifications() gets), for a provider to push to.")
        @Argument(help: "The app's bundle identifier.") var app: String
        @OptionGroup var host: HostOptions

        func run() throws {
            let token = try host.call(.deviceToken(app: app))
            if host.json { return try host.printJSON(["app": app, "device_token": token]) }
            print(token)
        }
    }
}

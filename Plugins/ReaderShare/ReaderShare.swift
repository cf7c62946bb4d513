// ReaderShare: the Reader app's share extension. The user shares an article; the extension adds
// it to the reading list in the app group's container, which the app also sees, and asks the
// system to refresh the app soon so that the article is saved for offline reading. Like an iOS
// extension, it may submit requests for its app but not register handlers.
import BackgroundTasks

@_cdecl("bgtask_plugin_entry")
public func bgtaskPluginEntry() -> UnsafeRawPointer {
    BGTaskPlugin.entry(name: "ReaderShare") { launch in
        // What was shared (on iOS, from the extension context's item providers): {"url": "..."}.
        struct SharedItem: Decodable { var url: String }
        guard let item = try? JSONDecoder().decode(SharedItem.self, from: Data((launch.eventJSON ?? "").utf8)) else {
            throw ShareError("expected an event like {\"url\": \"https://...\"}")
        }
        try ReadingList.add(item.url)
        print("share: added \(item.url) to the reading list")

        let request = BGAppRefreshTaskRequest(identifier: "com.example.reader.refresh")
        BGTaskScheduler.shared.submitTaskRequest(request) { error in
            if let error { print("share: could not ask for a refresh: \(error)") }
        }
    }
}

enum ReadingList {
    /// The same app group as the app's: both Info.plists name it.
    static let group = "group.com.example.reader"

    static func add(_ address: String) throws {
        guard let container = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: group) else {
            throw ShareError("no container for \(group)")
        }
        let listURL = container.appendingPathComponent("readingList.json")
        var list = (try? JSONDecoder().decode([String].self, from: Data(contentsOf: listURL))) ?? []
        if !list.contains(address) { list.append(address) }
        try JSONEncoder().encode(list).write(to: listURL, options: .atomic)
    }
}

struct ShareError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

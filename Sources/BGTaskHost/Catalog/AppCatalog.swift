import BGTaskControl
import BGTaskModel
import Foundation
import Logging

/// The host's view of the plugin directory: the valid bundles, rescanned when the directory
/// changes. An app whose bundle is removed loses its pending requests. Confined to the host
/// queue; `onChange` runs there after each rescan.
@HostActor
final class AppCatalog: HostPart {
    private let core: HostCore
    private(set) var current = PluginCatalog()
    private var watcher: PluginDirectoryWatcher?
    var onChange: @HostActor () -> Void = {}

    nonisolated init(core: HostCore) { self.core = core }

    var partName: String { "plugin catalog" }
    var apps: [String: PluginBundle] { current.apps }
    var invalid: [String: BGTaskError] { current.invalid }
    func app(permitting identifier: String) -> PluginBundle? { current.app(permitting: identifier) }
    func app(containingBundle identifier: String) -> PluginBundle? { current.app(containingBundle: identifier) }

    /// Scans the directory and watches it. Called before anything else runs on the queue.
    func start() throws(BGTaskError) {
        let directory = core.configuration.pluginsDirectory
        current = PluginCatalog.scan(directory)
        for (identifier, bundle) in current.apps.sorted(by: { $0.key < $1.key }) {
            core.logger.info("bundle loaded", metadata: ["bundle.id": "\(identifier)", "path": "\(bundle.url.path)"])
        }
        for (path, error) in current.invalid.sorted(by: { $0.key < $1.key }) {
            core.logger.error("invalid bundle skipped", metadata: ["path": "\(path)", "error": "\(error)"])
        }
        guard FileManager.default.fileExists(atPath: directory.path) else {
            core.logger.warning("the plugin directory does not exist; not watching it", metadata: ["path": "\(directory.path)"])
            return
        }
        watcher = try PluginDirectoryWatcher(directory: directory) { [weak self] in
            guard let self else { return }
            self.core.async { self.rescan() }
        }
    }

    func stop() { watcher?.stop() }

    private func rescan() {
        let old = current
        current = PluginCatalog.scan(core.configuration.pluginsDirectory)
        for (identifier, _) in old.apps where current.apps[identifier] == nil {
            let dropped = (try? core.store.removeApp(identifier)) ?? 0
            core.logger.info("bundle removed; its pending requests are dropped", metadata: ["bundle.id": "\(identifier)", "dropped": "\(dropped)"])
        }
        for (identifier, bundle) in current.apps where old.apps[identifier] != bundle {
            core.logger.info("bundle loaded", metadata: ["bundle.id": "\(identifier)", "path": "\(bundle.url.path)"])
        }
        for (path, error) in current.invalid where old.invalid[path] != error {
            core.logger.error("invalid bundle skipped", metadata: ["path": "\(path)", "error": "\(error)"])
        }
        onChange()
    }
}

import BGTaskABI
import CBGTaskPluginABI
import Foundation
internal import os

/// What the plugin's launch closure learns about its launch.
public struct BGTaskLaunch: Sendable {
    public enum Role: String, Sendable {
        /// The system launched the app to run background tasks.
        case background
        /// The user opened the app (`bgtask open`).
        case foreground
        /// An app extension, which may submit requests for its app but not register.
        case `extension`
    }

    public var role: Role
    public var bundleIdentifier: String
    public var bundleURL: URL
    /// The app's container: persists across launches (also the process's HOME).
    public var dataDirectory: URL
    public var launchID: String
    /// An extension's event, as JSON text; a `remote-notification` launch's push payload.
    public var eventJSON: String?
    /// Why the system launched the app: `scheduled`, `simulated`, `foreground`, `extension`,
    /// `remote-notification`, ... (empty with a runner too old to say).
    public var reason: String = ""
}

/// The bridge between the plugin ABI and Swift. A Swift plugin's whole boilerplate is:
///
/// ```swift
/// @_cdecl("bgtask_plugin_entry")
/// public func bgtaskPluginEntry() -> UnsafeRawPointer {
///     BGTaskPlugin.entry(name: "Feed") { launch in FeedApp.shared.didFinishLaunching(launch) }
/// }
/// ```
///
/// The closure runs once per process, on the main thread and the main actor, as
/// `application(_:didFinishLaunchingWithOptions:)` does: register launch handlers there. When it
/// returns, the main thread runs the main run loop (the main dispatch queue, `@MainActor` work,
/// timers) for the rest of the launch. Throwing fails the launch, and the run record quotes the
/// error.
///
/// With the host's default lifecycle the process outlives its launch: it is suspended when the
/// launch's work is over, and the app's next launch resumes it. The launch closure is not run
/// again then (the handlers it registered stay registered, and everything in memory is as the
/// app left it); `didResume`, when given, runs instead, on the main actor, before the new
/// launch's tasks start.
public enum BGTaskPlugin {
    private final class State: @unchecked Sendable {
        let lock = NSLock()
        var didFinishLaunching: (@MainActor (BGTaskLaunch) throws -> Void)?
        var didResume: (@MainActor (BGTaskLaunch) -> Void)?
        var descriptor: UnsafeMutablePointer<bgtask_plugin>?
    }
    private static let state = State()

    /// Returns the plugin descriptor for the entry symbol to return; `didResume` runs each time
    /// a suspended process is resumed for a new launch.
    public static func entry(
        name: String,
        didFinishLaunching: @escaping @MainActor (BGTaskLaunch) throws -> Void,
        didResume: @escaping @MainActor (BGTaskLaunch) -> Void
    ) -> UnsafeRawPointer {
        state.lock.withLock { state.didResume = didResume }
        return entry(name: name, didFinishLaunching: didFinishLaunching)
    }

    /// Returns the plugin descriptor for the entry symbol to return.
    public static func entry(
        name: String,
        didFinishLaunching: @escaping @MainActor (BGTaskLaunch) throws -> Void
    ) -> UnsafeRawPointer {
        state.lock.withLock {
            state.didFinishLaunching = didFinishLaunching
            if let descriptor = state.descriptor { return UnsafeRawPointer(descriptor) }
            let descriptor = UnsafeMutablePointer<bgtask_plugin>.allocate(capacity: 1)
            descriptor.initialize(to: bgtask_plugin(
                magic: BGTASK_PLUGIN_MAGIC,
                abi_version: BGTASK_ABI_VERSION,
                size: UInt32(MemoryLayout<bgtask_plugin>.size),
                name: UnsafePointer(strdup(name)),
                launch: launchTrampoline))
            state.descriptor = descriptor
            return UnsafeRawPointer(descriptor)
        }
    }

    private static let launchTrampoline: bgtask_launch_fn = { api, host, info, errorBuffer, errorSize in
        func fail(_ description: String) -> Int32 {
            if let errorBuffer, errorSize > 0 {
                let text = Array(description.utf8CString.prefix(errorSize - 1)) + [0]
                text.withUnsafeBufferPointer { errorBuffer.update(from: $0.baseAddress!, count: text.count) }
            }
            return 1
        }
        guard let api, let info else { return fail("the host passed no function table or no launch info") }
        // What the runner hands over is checked as the runner checks the descriptor: its version,
        // then only as much of each struct as both sides know (bgtask/plugin.h, growth rules).
        guard api.pointee.abi_version == BGTASK_ABI_VERSION else {
            return fail("ABI version mismatch: the host provides bgtask ABI \(api.pointee.abi_version), this plugin was built for ABI \(BGTASK_ABI_VERSION)")
        }
        let table: bgtask_host_api, launchInfo: bgtask_launch_info
        do {
            table = try bgtask_host_api.read(from: api)
            launchInfo = try bgtask_launch_info.read(from: info)
        } catch {
            return fail("\(error)")
        }
        HostConnection.current.attach(api: table, host: host, role: launchInfo.role)
        if table.has(\.set_resume_handler) { table.set_resume_handler(host, resumeTrampoline, nil) }
        // `Logger` and `os_log` (the `os` module) write into the launch's log from now on.
        UnifiedLogSink.install { level, line in BGTaskPlugin.log(level: level, line: line) }
        let launch = BGTaskLaunch(launchInfo)
        let body = state.lock.withLock { state.didFinishLaunching }
        do {
            // The runner calls the launch function on its main thread (see bgtask/plugin.h).
            try MainActor.assumeIsolated { try body?(launch) }
            return 0
        } catch {
            // A scheduler error as its code and message (its description is NSError's, which
            // repeats the message in its user info).
            return fail((error as? BGTaskScheduler.Error).map { "\($0.code): \($0.localizedDescription)" } ?? "\(error)")
        }
    }

    /// A suspended process resumed for a new launch (`set_resume_handler`, on the main thread):
    /// the new launch's role for the SDK, then the app's `didResume`.
    private static let resumeTrampoline: bgtask_resume_handler = { _, info in
        guard let info, let launchInfo = try? bgtask_launch_info.read(from: info),
              let (api, host) = HostConnection.current.connection else { return }
        HostConnection.current.attach(api: api, host: host, role: launchInfo.role)
        HostConnection.current.resumed()
        let launch = BGTaskLaunch(launchInfo)
        let body = state.lock.withLock { state.didResume }
        MainActor.assumeIsolated { body?(launch) }
    }
}

extension BGTaskLaunch {
    init(_ launchInfo: bgtask_launch_info) {
        let role: BGTaskLaunch.Role = switch launchInfo.role {
        case BGTASK_ROLE_FOREGROUND.rawValue: .foreground
        case BGTASK_ROLE_EXTENSION.rawValue: .extension
        default: .background
        }
        self.init(
            role: role,
            bundleIdentifier: String(optionalCString: launchInfo.bundle_identifier) ?? "",
            bundleURL: URL(fileURLWithPath: String(optionalCString: launchInfo.bundle_path) ?? ""),
            dataDirectory: URL(fileURLWithPath: String(optionalCString: launchInfo.data_directory) ?? ""),
            launchID: String(optionalCString: launchInfo.launch_id) ?? "",
            eventJSON: String(optionalCString: launchInfo.event_json),
            reason: String(optionalCString: launchInfo.reason) ?? "")
    }
}

extension BGTaskPlugin {
    /// Writes a line to the launch's log (stderr is captured too).
    public static func log(_ message: String) {
        guard let (api, host) = HostConnection.current.connection else { return }
        message.withCString { api.log(host, BGTASK_LOG_INFO, $0) }
    }
}

extension BGTaskPlugin {
    /// The `os` module's way into the launch's log (`UnifiedLogSink`, installed when the launch
    /// attaches): writes `line` at an ABI level (BGTASK_LOG_DEBUG, _INFO, _ERROR). False
    /// outside a launch (nothing written).
    package static func log(level: Int32, line: String) -> Bool {
        guard let (api, host) = HostConnection.current.connection else { return false }
        line.withCString { api.log(host, level, $0) }
        return true
    }
}

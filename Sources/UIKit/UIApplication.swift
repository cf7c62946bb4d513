import BGTaskABI
import BackgroundTasks
import CBGTaskPluginABI
import Foundation

// UIKit on Linux, as far as background execution goes: the application object, its delegate's
// entry points, and background time. Apple's module name and signatures, so that app code that
// imports UIKit for these compiles unchanged; nothing of UIKit's interface (views, windows,
// scenes) is here.

/// The base class of `UIApplication` and of app delegates (`class AppDelegate: UIResponder,
/// UIApplicationDelegate`). It carries no responder chain: there are no events to respond to.
/// Main-actor isolated, its initializer too, as Apple's: an app delegate's `override init()` may
/// touch its main-actor state, and a delegate in a module whose default isolation is the main
/// actor conforms as it does on Xcode.
@MainActor
open class UIResponder: NSObject {
    override public init() { super.init() }

    /// For `UIApplication.shared`, which is made from whichever thread asks for it first.
    nonisolated init(anyThread: Void) { super.init() }
}

/// A background-time assertion's token (`beginBackgroundTask`); `.invalid` when none was given.
public struct UIBackgroundTaskIdentifier: RawRepresentable, Hashable, Sendable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
    public static let invalid = UIBackgroundTaskIdentifier(rawValue: 0)
}

/// Whether the app may be launched in the background (Settings › General › Background App
/// Refresh): the host's `bgtask device --refresh` and `--app A --refresh` switches.
public enum UIBackgroundRefreshStatus: Int, Sendable {
    case restricted = 0
    case denied = 1
    case available = 2
}

/// What a background fetch or a background push's handler found.
public enum UIBackgroundFetchResult: UInt, Sendable {
    case newData = 0
    case noData = 1
    case failed = 2
}

/// The app's application object: one per process, `UIApplication.shared`.
@MainActor
open class UIApplication: UIResponder {
    /// The app's state, as `applicationState` reports it.
    public enum State: Int, Sendable {
        case active = 0
        case inactive = 1
        case background = 2
    }

    /// Keys of the launch options `application(_:didFinishLaunchingWithOptions:)` receives.
    public struct LaunchOptionsKey: RawRepresentable, Hashable, Sendable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// The app was launched for a remote notification (the payload).
        public static let remoteNotification = LaunchOptionsKey(rawValue: "UIApplicationLaunchOptionsRemoteNotificationKey")
        /// The app was launched to handle events of a background URL session (its identifier).
        public static let url = LaunchOptionsKey(rawValue: "UIApplicationLaunchOptionsURLKey")
    }

    /// The application object.
    public nonisolated static let shared = UIApplication()

    /// Set by `UIApplication.entry` to the delegate it makes (strongly held, as UIApplicationMain holds it).
    open var delegate: (any UIApplicationDelegate)?

    /// `registerForRemoteNotifications()` succeeded in this launch.
    var registeredForRemoteNotifications = false

    /// The application object is made once, by `shared`; nothing else creates one.
    override private nonisolated init() { super.init(anyThread: ()) }

    /// `active` while a foreground launch (`bgtask open`) is in the foreground; `background`
    /// otherwise (a background launch, an extension, or an opened app that has left).
    public nonisolated var applicationState: State {
        guard let (api, host) = HostConnection.current.connection, api.has(\.application_state) else { return .background }
        return State(rawValue: Int(api.application_state(host))) ?? .background
    }

    /// From the host's switches when the launch started: `.denied` when Background App Refresh
    /// is off for the device or for this app; `.available` otherwise (and outside a launch).
    public nonisolated var backgroundRefreshStatus: UIBackgroundRefreshStatus {
        guard let (api, host) = HostConnection.current.connection, api.has(\.background_refresh_status) else { return .available }
        return UIBackgroundRefreshStatus(rawValue: Int(api.background_refresh_status(host))) ?? .available
    }

    /// Seconds until the launch's time runs out (then expiration handlers run, and after the
    /// grace the launch is killed); `.greatestFiniteMagnitude` in the foreground and outside a
    /// launch, as iOS answers in the foreground.
    public nonisolated var backgroundTimeRemaining: TimeInterval {
        guard let (api, host) = HostConnection.current.connection, api.has(\.background_time_remaining) else { return .greatestFiniteMagnitude }
        return api.background_time_remaining(host)
    }

    /// Asks for background time: while the assertion is held, the launch goes on after its last
    /// task has ended. `handler` runs on the main queue when the launch's time is about to run
    /// out: end the assertion there (`endBackgroundTask`), or the launch is killed at the end of
    /// its grace, as iOS kills the app. Returns `.invalid` once the time has run out, and
    /// outside a launch. Any thread.
    public nonisolated func beginBackgroundTask(withName taskName: String?, expirationHandler handler: (@MainActor @Sendable () -> Void)? = nil) -> UIBackgroundTaskIdentifier {
        guard let (api, host) = HostConnection.current.connection, api.has(\.begin_background_time) else { return .invalid }
        let box = handler.map { ExpirationBox($0) }
        let context = box.map { Unmanaged.passRetained($0).toOpaque() }
        let id: UInt64
        if let taskName {
            id = taskName.withCString { api.begin_background_time(host, $0, box == nil ? nil : expirationTrampoline, context) }
        } else {
            id = api.begin_background_time(host, nil, box == nil ? nil : expirationTrampoline, context)
        }
        guard id != 0 else {
            if let context { Unmanaged<ExpirationBox>.fromOpaque(context).release() }
            return .invalid
        }
        return UIBackgroundTaskIdentifier(rawValue: Int(truncatingIfNeeded: id))
    }

    /// `beginBackgroundTask(withName: nil, expirationHandler:)`.
    public nonisolated func beginBackgroundTask(expirationHandler handler: (@MainActor @Sendable () -> Void)? = nil) -> UIBackgroundTaskIdentifier {
        beginBackgroundTask(withName: nil, expirationHandler: handler)
    }

    /// Ends an assertion; `.invalid`, and one already ended, are ignored. Any thread.
    public nonisolated func endBackgroundTask(_ identifier: UIBackgroundTaskIdentifier) {
        guard identifier != .invalid, HostConnection.current.connection?.api.has(\.end_background_time) == true else { return }
        HostConnection.current.handOver {
            guard let (api, host) = HostConnection.current.connection else { return }
            api.end_background_time(host, UInt64(truncatingIfNeeded: identifier.rawValue))
        }
    }
}

/// An expiration handler kept alive for the C callback (one per assertion; the runner calls it
/// at most once). Leaked after that call: an assertion's handler lives as long as the launch.
private final class ExpirationBox: @unchecked Sendable {
    let handler: @MainActor @Sendable () -> Void
    init(_ handler: @escaping @MainActor @Sendable () -> Void) { self.handler = handler }
}

/// Runs the assertion's handler on the main queue, as iOS calls it on the main thread; the
/// runner's expiration thread does not wait for it.
private let expirationTrampoline: bgtask_expiration_handler = { context, _ in
    guard let context else { return false }
    let box = Unmanaged<ExpirationBox>.fromOpaque(context).takeUnretainedValue()
    DispatchQueue.main.async { MainActor.assumeIsolated { box.handler() } }
    return true
}

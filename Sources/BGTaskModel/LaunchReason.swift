/// Why a launch was started, as its record says (`reason`). The host's own reasons are defined
/// here once; `bgtask run --reason` may record any other word. It crosses
/// the plugin ABI as its raw value (`BGTaskPlugin.Launch.reason`).
public struct LaunchReason: RawRepresentable, Hashable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { rawValue = value }
    public var description: String { rawValue }

    /// The scheduler found the app's requests due.
    public static let scheduled: LaunchReason = "scheduled"
    /// `simulate-launch`, or `bgtask run` (the debugger's `_simulateLaunchForTaskWithIdentifier`).
    public static let simulated: LaunchReason = "simulated"
    /// `open`: the user opened the app.
    public static let foreground: LaunchReason = "foreground"
    /// `extension-run`: an app extension ran.
    public static let appExtension: LaunchReason = "extension"
    /// bgtask-bench's own launches.
    public static let benchmark: LaunchReason = "benchmark"
    /// A background push (`bgtask push`, or the APNs endpoint).
    public static let remoteNotification: LaunchReason = "remote-notification"
    /// Background URL sessions' transfers ended while the app was not running.
    public static let backgroundTransfer: LaunchReason = "background-transfer"
    /// The user opened a delivered notification (`bgtask respond`): the app comes to the
    /// foreground and its notification center's delegate hears `didReceive`.
    public static let notificationResponse: LaunchReason = "notification-response"
}


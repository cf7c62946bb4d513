import BGTaskABI
import BackgroundTasks
import CBGTaskPluginABI
import BGTaskModel
import Foundation

/// What the app asks to be allowed (`requestAuthorization(options:)`).
public struct UNAuthorizationOptions: OptionSet, Sendable {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    public static let badge = UNAuthorizationOptions(rawValue: 1 << 0)
    public static let sound = UNAuthorizationOptions(rawValue: 1 << 1)
    public static let alert = UNAuthorizationOptions(rawValue: 1 << 2)
    public static let carPlay = UNAuthorizationOptions(rawValue: 1 << 3)
    public static let criticalAlert = UNAuthorizationOptions(rawValue: 1 << 4)
    public static let providesAppNotificationSettings = UNAuthorizationOptions(rawValue: 1 << 5)
    public static let provisional = UNAuthorizationOptions(rawValue: 1 << 6)
    public static let announcement = UNAuthorizationOptions(rawValue: 1 << 7)
    public static let timeSensitive = UNAuthorizationOptions(rawValue: 1 << 8)
}

/// The app's authorization: the operator's decision (`bgtask device --app A --notifications`).
public enum UNAuthorizationStatus: Int, Sendable {
    case notDetermined = 0
    case denied = 1
    case authorized = 2
    case provisional = 3
    case ephemeral = 4
}

public enum UNNotificationSetting: Int, Sendable {
    case notSupported = 0
    case disabled = 1
    case enabled = 2
}

public enum UNAlertStyle: Int, Sendable {
    case none = 0
    case banner = 1
    case alert = 2
}

public enum UNShowPreviewsSetting: Int, Sendable {
    case always = 0
    case whenAuthenticated = 1
    case never = 2
}

/// The app's notification settings: its authorization, and each kind of alert enabled while it
/// is authorized (the host shows banners, keeps a list, and passes sounds and badges on).
open class UNNotificationSettings: NSObject, @unchecked Sendable {
    open private(set) var authorizationStatus: UNAuthorizationStatus
    open var soundSetting: UNNotificationSetting { enabled }
    open var badgeSetting: UNNotificationSetting { enabled }
    open var alertSetting: UNNotificationSetting { enabled }
    open var notificationCenterSetting: UNNotificationSetting { enabled }
    open var lockScreenSetting: UNNotificationSetting { enabled }
    open var carPlaySetting: UNNotificationSetting { .notSupported }
    open var criticalAlertSetting: UNNotificationSetting { .notSupported }
    open var announcementSetting: UNNotificationSetting { .notSupported }
    open var timeSensitiveSetting: UNNotificationSetting { .notSupported }
    open var scheduledDeliverySetting: UNNotificationSetting { .disabled }
    open var directMessagesSetting: UNNotificationSetting { .notSupported }
    open var alertStyle: UNAlertStyle { authorizationStatus == .authorized ? .banner : .none }
    open var showPreviewsSetting: UNShowPreviewsSetting { .always }
    open var providesAppNotificationSettings: Bool { false }

    private var enabled: UNNotificationSetting {
        switch authorizationStatus {
        case .authorized, .provisional, .ephemeral: .enabled
        case .denied: .disabled
        case .notDetermined: .notSupported
        }
    }

    init(authorizationStatus: UNAuthorizationStatus) {
        self.authorizationStatus = authorizationStatus
        super.init()
    }
}

/// How a notification is presented while the app is in the foreground (the delegate's answer).
public struct UNNotificationPresentationOptions: OptionSet, Sendable {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    public static let badge = UNNotificationPresentationOptions(rawValue: 1 << 0)
    public static let sound = UNNotificationPresentationOptions(rawValue: 1 << 1)
    public static let alert = UNNotificationPresentationOptions(rawValue: 1 << 2)
    public static let list = UNNotificationPresentationOptions(rawValue: 1 << 3)
    public static let banner = UNNotificationPresentationOptions(rawValue: 1 << 4)
}

public let UNNotificationDefaultActionIdentifier = "com.apple.UNNotificationDefaultActionIdentifier"
public let UNNotificationDismissActionIdentifier = "com.apple.UNNotificationDismissActionIdentifier"

/// The user's answer to a notification: `bgtask respond ID [--action A]` gives it.
open class UNNotificationResponse: NSObject, @unchecked Sendable {
    open private(set) var notification: UNNotification
    open private(set) var actionIdentifier: String

    init(notification: UNNotification, actionIdentifier: String) {
        self.notification = notification
        self.actionIdentifier = actionIdentifier
        super.init()
    }
}

/// The center's delegate, as apps set it in `didFinishLaunching`. `willPresent` is called, on
/// the main queue, for each notification delivered while the app is in the foreground (`bgtask
/// open`); what its completion handler is given (banner, list, sound, badge, or nothing: not
/// shown) is recorded in the launch's record (`notifications_presented`). `didReceive` is called
/// when the user opens a delivered notification (`bgtask respond ID`: the app is launched, or
/// resumed, into the foreground with it), on the main queue once the app has finished
/// launching; the launch lasts until its completion handler is called (background time is held
/// for it). `openSettingsFor` has a default and is not called.
public protocol UNUserNotificationCenterDelegate: NSObjectProtocol {
    func userNotificationCenter(_ center: UNUserNotificationCenter, willPresent notification: UNNotification,
                                withCompletionHandler completionHandler: @escaping (UNNotificationPresentationOptions) -> Void)
    func userNotificationCenter(_ center: UNUserNotificationCenter, didReceive response: UNNotificationResponse,
                                withCompletionHandler completionHandler: @escaping () -> Void)
    func userNotificationCenter(_ center: UNUserNotificationCenter, openSettingsFor notification: UNNotification?)
}

extension UNUserNotificationCenterDelegate {
    public func userNotificationCenter(_ center: UNUserNotificationCenter, willPresent notification: UNNotification,
                                       withCompletionHandler completionHandler: @escaping (UNNotificationPresentationOptions) -> Void) {
        completionHandler([])
    }
    public func userNotificationCenter(_ center: UNUserNotificationCenter, didReceive response: UNNotificationResponse,
                                       withCompletionHandler completionHandler: @escaping () -> Void) {
        completionHandler()
    }
    public func userNotificationCenter(_ center: UNUserNotificationCenter, openSettingsFor notification: UNNotification?) {}
}

/// The app's notification center: authorization (the operator's decision), requests kept and
/// delivered by the host whether or not the app runs, and the delivered list.
///
/// Every call goes to the host through the ABI and may wait for it (at most 30 s), so the
/// completion-handler forms call their handler on a global queue, as Apple's do, and the
/// `async` forms suspend. Outside a launch nothing is allowed and every list is empty.
open class UNUserNotificationCenter: NSObject, @unchecked Sendable {
    private static let shared = UNUserNotificationCenter()
    private let lock = NSLock()
    private weak var storedDelegate: (any UNUserNotificationCenterDelegate)?
    private var categories = Set<UNNotificationCategory>()

    private override init() { super.init() }

    /// The app's notification center.
    open class func current() -> UNUserNotificationCenter { shared }

    open weak var delegate: (any UNUserNotificationCenterDelegate)? {
        get { lock.withLock { storedDelegate } }
        set {
            let first = lock.withLock { () -> Bool in
                storedDelegate = newValue
                defer { followsLaunches = true }
                return !followsLaunches
            }
            if first {
                NotificationResponses.follow(self)
                ForegroundPresentation.follow(self)
            }
        }
    }
    private var followsLaunches = false

    open var supportsContentExtensions: Bool { false }

    // MARK: Authorization

    /// Asks for authorization. No prompt exists: the answer is the operator's decision
    /// (`granted` true when authorized), and the host records that the app asked (an app that
    /// asked and is not allowed is `.denied`, as after a user's "Don't Allow").
    open func requestAuthorization(options: UNAuthorizationOptions = [], completionHandler: @escaping @Sendable (Bool, (any Error)?) -> Void) {
        DispatchQueue.global().async {
            completionHandler(Host.authorization(options: options, request: true) == .authorized, nil)
        }
    }

    open func requestAuthorization(options: UNAuthorizationOptions = []) async throws -> Bool {
        await withCheckedContinuation { continuation in
            requestAuthorization(options: options) { granted, _ in continuation.resume(returning: granted) }
        }
    }

    open func getNotificationSettings(completionHandler: @escaping @Sendable (UNNotificationSettings) -> Void) {
        DispatchQueue.global().async {
            completionHandler(UNNotificationSettings(authorizationStatus: Host.authorization(options: [], request: false)))
        }
    }

    open func notificationSettings() async -> UNNotificationSettings {
        await withCheckedContinuation { continuation in
            getNotificationSettings { continuation.resume(returning: $0) }
        }
    }

    open func setNotificationCategories(_ categories: Set<UNNotificationCategory>) {
        lock.withLock { self.categories = categories }
    }

    open func getNotificationCategories(completionHandler: @escaping @Sendable (Set<UNNotificationCategory>) -> Void) {
        let categories = lock.withLock { self.categories }
        DispatchQueue.global().async { completionHandler(categories) }
    }

    open func notificationCategories() async -> Set<UNNotificationCategory> { lock.withLock { categories } }

    // MARK: Requests

    /// Adds a request (replacing one with its identifier). The handler gets nil, a `UNError`
    /// (`.notificationsNotAllowed` when the app is not authorized, `.notificationInvalidNoDate`
    /// for a calendar trigger no date matches), or a `CocoaError` naming a field the host
    /// refuses (`.propertyListWriteInvalid` for a `userInfo` that is not JSON-representable,
    /// `.coderInvalidValue` for a field over its limit).
    open func add(_ request: UNNotificationRequest, withCompletionHandler completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        DispatchQueue.global().async {
            let error = Host.add(request)
            completionHandler?(error)
        }
    }

    open func add(_ request: UNNotificationRequest) async throws {
        let error: (any Error)? = await withCheckedContinuation { continuation in
            add(request) { continuation.resume(returning: $0.map { $0 as any Error }) }
        }
        if let error { throw error }
    }

    /// Pending requests, soonest first.
    open func getPendingNotificationRequests(completionHandler: @escaping @Sendable ([UNNotificationRequest]) -> Void) {
        DispatchQueue.global().async { completionHandler(Host.list(delivered: false).map(\.request)) }
    }

    open func pendingNotificationRequests() async -> [UNNotificationRequest] {
        await withCheckedContinuation { continuation in
            getPendingNotificationRequests { continuation.resume(returning: $0) }
        }
    }

    open func removePendingNotificationRequests(withIdentifiers identifiers: [String]) {
        Host.remove(delivered: false, identifiers: identifiers)
    }

    open func removeAllPendingNotificationRequests() {
        Host.remove(delivered: false, identifiers: nil)
    }

    // MARK: Delivered

    /// Delivered notifications the host keeps for the app, newest first.
    open func getDeliveredNotifications(completionHandler: @escaping @Sendable ([UNNotification]) -> Void) {
        DispatchQueue.global().async {
            completionHandler(Host.list(delivered: true).map { UNNotification(date: $0.date ?? Date(), request: $0.request) })
        }
    }

    open func deliveredNotifications() async -> [UNNotification] {
        await withCheckedContinuation { continuation in
            getDeliveredNotifications { continuation.resume(returning: $0) }
        }
    }

    open func removeDeliveredNotifications(withIdentifiers identifiers: [String]) {
        Host.remove(delivered: true, identifiers: identifiers)
    }

    open func removeAllDeliveredNotifications() {
        Host.remove(delivered: true, identifiers: nil)
    }

    /// The app icon's badge: kept nowhere on Linux (there is no icon); accepted.
    open func setBadgeCount(_ newBadgeCount: Int, withCompletionHandler completionHandler: (@Sendable ((any Error)?) -> Void)? = nil) {
        DispatchQueue.global().async { completionHandler?(nil) }
    }

    open func setBadgeCount(_ newBadgeCount: Int) async throws {}
}

/// A category of notifications and its actions (kept by the center; no one acts on a banner
/// on Linux).
open class UNNotificationCategory: NSObject, @unchecked Sendable {
    open private(set) var identifier: String
    open private(set) var actions: [UNNotificationAction]
    open private(set) var intentIdentifiers: [String]
    open private(set) var options: UNNotificationCategoryOptions

    public init(identifier: String, actions: [UNNotificationAction], intentIdentifiers: [String], options: UNNotificationCategoryOptions = []) {
        self.identifier = identifier
        self.actions = actions
        self.intentIdentifiers = intentIdentifiers
        self.options = options
        super.init()
    }

    open override func isEqual(_ object: Any?) -> Bool { (object as? UNNotificationCategory)?.identifier == identifier }
    open override var hash: Int { identifier.hashValue }
}

public struct UNNotificationCategoryOptions: OptionSet, Sendable {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    public static let customDismissAction = UNNotificationCategoryOptions(rawValue: 1 << 0)
    public static let allowInCarPlay = UNNotificationCategoryOptions(rawValue: 1 << 1)
    public static let hiddenPreviewsShowTitle = UNNotificationCategoryOptions(rawValue: 1 << 2)
    public static let hiddenPreviewsShowSubtitle = UNNotificationCategoryOptions(rawValue: 1 << 3)
}

public struct UNNotificationActionOptions: OptionSet, Sendable {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    public static let authenticationRequired = UNNotificationActionOptions(rawValue: 1 << 0)
    public static let destructive = UNNotificationActionOptions(rawValue: 1 << 1)
    public static let foreground = UNNotificationActionOptions(rawValue: 1 << 2)
}

open class UNNotificationAction: NSObject, @unchecked Sendable {
    open private(set) var identifier: String
    open private(set) var title: String
    open private(set) var options: UNNotificationActionOptions

    public init(identifier: String, title: String, options: UNNotificationActionOptions = []) {
        self.identifier = identifier
        self.title = title
        self.options = options
        super.init()
    }
}

/// A launch that brings the user's response to a notification (`notification-response`): the
/// delegate hears it on the main queue, with background time held until its completion handler
/// is called, so the launch cannot end first.
enum NotificationResponses {
    static func follow(_ center: UNUserNotificationCenter) {
        HostConnection.current.whenLaunched { reason, eventJSON in
            guard reason == LaunchReason.notificationResponse.rawValue, let eventJSON,
                  let event = try? JSONDecoder().decode(NotificationResponseEvent.self, from: Data(eventJSON.utf8)),
                  let delegate = center.delegate else { return false }
            let notification = UNNotification(date: event.notification.date.map(Date.init(timeIntervalSince1970:)) ?? Date(),
                                              request: Host.request(event.notification.request))
            let response = UNNotificationResponse(notification: notification, actionIdentifier: event.action)
            let assertion = BackgroundTime.begin(named: "notification-response")
            nonisolated(unsafe) let target = delegate
            DispatchQueue.main.async {
                target.userNotificationCenter(center, didReceive: response) { BackgroundTime.end(assertion) }
            }
            return true
        }
    }
}

/// Background time through the ABI (UIKit's `beginBackgroundTask`, which this module does not link).
enum BackgroundTime {
    static func begin(named name: String) -> UInt64 {
        guard let (api, host) = HostConnection.current.connection, api.has(\.begin_background_time) else { return 0 }
        return name.withCString { api.begin_background_time(host, $0, nil, nil) }
    }

    static func end(_ id: UInt64) {
        guard id != 0, let (api, host) = HostConnection.current.connection, api.has(\.end_background_time) else { return }
        api.end_background_time(host, id)
    }
}

/// Notifications delivered while the app is in the foreground: the delegate's `willPresent`
/// decides how each is shown, and the host hears its answer.
enum ForegroundPresentation {
    nonisolated(unsafe) private static weak var center: UNUserNotificationCenter?

    static func follow(_ center: UNUserNotificationCenter) {
        guard let (api, host) = HostConnection.current.connection, api.has(\.set_notification_handler), api.has(\.notification_presented) else { return }
        Self.center = center
        api.set_notification_handler(host, deliveredInForeground, nil)
    }

    /// On the runner's reader thread: to the main queue, where the delegate answers.
    fileprivate static func delivered(_ json: Data) {
        guard let entry = try? JSONDecoder().decode(NotificationEntry.self, from: json) else { return }
        let identifier = entry.request.identifier
        guard let center, let delegate = center.delegate else { return answer(identifier, []) }
        let notification = UNNotification(date: entry.date.map(Date.init(timeIntervalSince1970:)) ?? Date(), request: Host.request(entry.request))
        nonisolated(unsafe) let target = delegate
        DispatchQueue.main.async {
            target.userNotificationCenter(center, willPresent: notification) { options in answer(identifier, options) }
        }
    }

    private static func answer(_ identifier: String, _ options: UNNotificationPresentationOptions) {
        guard let (api, host) = HostConnection.current.connection, api.has(\.notification_presented) else { return }
        identifier.withCString { api.notification_presented(host, $0, UInt32(truncatingIfNeeded: options.rawValue)) }
    }
}

private let deliveredInForeground: bgtask_json_visitor = { _, json in
    guard let json else { return }
    ForegroundPresentation.delivered(Data(bytes: json, count: strlen(json)))
}

import Foundation
import FoundationNetworking

// `URLSessionConfiguration.background(withIdentifier:)` and the properties of a background
// configuration that swift-corelibs-foundation lacks. Foundation declares `background` as
// unavailable on Linux; this one is available, so Swift picks it wherever the UIKit module is
// imported (docs/transfers.md).

extension URLSessionConfiguration {
    /// A configuration whose tasks the host carries out (`bgtask transfers`), as nsurlsessiond
    /// carries them on iOS: they go on after the app exits, across host restarts, and their
    /// events are delivered to the session the app makes with the same identifier.
    public class func background(withIdentifier identifier: String) -> URLSessionConfiguration {
        BackgroundSessionConfiguration.make(identifier: identifier)
    }

    /// Launch the app in the background when the session's tasks finish (default true). Only a
    /// background configuration has it; on others it reads true and setting it does nothing.
    public var sessionSendsLaunchEvents: Bool {
        get { (self as? BackgroundSessionConfiguration)?.sendsLaunchEvents ?? true }
        set { (self as? BackgroundSessionConfiguration)?.sendsLaunchEvents = newValue }
    }

    /// Whether tasks may use an expensive network (default true). Held as for
    /// `allowsCellularAccess`; only a background configuration keeps it.
    public var allowsExpensiveNetworkAccess: Bool {
        get { (self as? BackgroundSessionConfiguration)?.expensiveNetworkAccess ?? true }
        set { (self as? BackgroundSessionConfiguration)?.expensiveNetworkAccess = newValue }
    }

    /// Whether tasks may use a constrained (Low Data Mode) network (default true).
    public var allowsConstrainedNetworkAccess: Bool {
        get { (self as? BackgroundSessionConfiguration)?.constrainedNetworkAccess ?? true }
        set { (self as? BackgroundSessionConfiguration)?.constrainedNetworkAccess = newValue }
    }
}

/// A background configuration: Foundation's, with the launch-event and network switches, and
/// every task routed to `BackgroundTransferProtocol` (the host). A session copies its
/// configuration when it is made; the copy keeps the class and the switches.
final class BackgroundSessionConfiguration: URLSessionConfiguration, @unchecked Sendable {
    var sendsLaunchEvents = true
    var expensiveNetworkAccess = true
    var constrainedNetworkAccess = true

    /// A configuration with iOS's defaults for a background session: a week to finish, no
    /// cache, cookies kept. (`init()` is not inherited: this is the only way to make one.)
    static func make(identifier: String) -> BackgroundSessionConfiguration {
        construct(BackgroundSessionConfiguration.self, identifier: identifier)
    }

    private static func construct<Made: FoundationDeprecatedUse>(_: Made.Type, identifier: String) -> Made {
        Made(backgroundIdentifier: identifier)
    }

    @available(*, deprecated, message: "calls Foundation's deprecated init(): use make(identifier:)")
    init(backgroundIdentifier: String) {
        super.init()
        identifier = backgroundIdentifier
        timeoutIntervalForResource = 7 * 24 * 3600
        urlCache = nil
        protocolClasses = [BackgroundTransferProtocol.self]
    }

    override func copy(with zone: NSZone? = nil) -> Any {
        let copy = Self.make(identifier: identifier ?? "")
        copy.requestCachePolicy = requestCachePolicy
        copy.timeoutIntervalForRequest = timeoutIntervalForRequest
        copy.timeoutIntervalForResource = timeoutIntervalForResource
        copy.networkServiceType = networkServiceType
        copy.allowsCellularAccess = allowsCellularAccess
        copy.isDiscretionary = isDiscretionary
        copy.connectionProxyDictionary = connectionProxyDictionary
        copy.httpShouldSetCookies = httpShouldSetCookies
        copy.httpCookieAcceptPolicy = httpCookieAcceptPolicy
        copy.httpAdditionalHeaders = httpAdditionalHeaders
        copy.httpMaximumConnectionsPerHost = httpMaximumConnectionsPerHost
        copy.httpCookieStorage = httpCookieStorage
        copy.urlCredentialStorage = urlCredentialStorage
        copy.urlCache = urlCache
        (self as any FoundationDeprecatedUse).copyDeprecatedFields(to: copy)
        // Tasks of a background session always go to the host: custom protocol classes are
        // not available to background sessions on iOS either.
        copy.protocolClasses = [BackgroundTransferProtocol.self]
        copy.sendsLaunchEvents = sendsLaunchEvents
        copy.expensiveNetworkAccess = expensiveNetworkAccess
        copy.constrainedNetworkAccess = constrainedNetworkAccess
        return copy
    }

    @available(*, deprecated, message: "copies fields Foundation deprecates")
    func copyDeprecatedFields(to copy: BackgroundSessionConfiguration) {
        copy.httpShouldUsePipelining = httpShouldUsePipelining
        copy.shouldUseExtendedBackgroundIdleMode = shouldUseExtendedBackgroundIdleMode
    }
}

/// What the background configuration must use of Foundation's deprecated API: a subclass can
/// only be made through `init()` (deprecated on Linux in favour of `.default`), and a copy
/// keeps every field, `httpShouldUsePipelining` and `shouldUseExtendedBackgroundIdleMode`
/// included. The declarations that use them are deprecated themselves, and are called through
/// this protocol, so that building the UIKit module (every app's build) shows no deprecation
/// warning for these deliberate uses.
protocol FoundationDeprecatedUse {
    init(backgroundIdentifier: String)
    func copyDeprecatedFields(to copy: BackgroundSessionConfiguration)
}

extension BackgroundSessionConfiguration: FoundationDeprecatedUse {}

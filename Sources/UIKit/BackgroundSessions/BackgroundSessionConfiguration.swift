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
        BackgroundSessionConfiguration(backgroundIdentifier: identifier)
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

    init(backgroundIdentifier: String) {
        super.init()
        identifier = backgroundIdentifier
        // iOS's defaults for a background session: a week to finish, no cache, cookies kept.
        timeoutIntervalForResource = 7 * 24 * 3600
        urlCache = nil
        protocolClasses = [BackgroundTransferProtocol.self]
    }

    @available(*, unavailable)
    override init() { fatalError("use URLSessionConfiguration.background(withIdentifier:)") }

    override func copy(with zone: NSZone? = nil) -> Any {
        let copy = BackgroundSessionConfiguration(backgroundIdentifier: identifier ?? "")
        copy.requestCachePolicy = requestCachePolicy
        copy.timeoutIntervalForRequest = timeoutIntervalForRequest
        copy.timeoutIntervalForResource = timeoutIntervalForResource
        copy.networkServiceType = networkServiceType
        copy.allowsCellularAccess = allowsCellularAccess
        copy.isDiscretionary = isDiscretionary
        copy.connectionProxyDictionary = connectionProxyDictionary
        copy.httpShouldUsePipelining = httpShouldUsePipelining
        copy.httpShouldSetCookies = httpShouldSetCookies
        copy.httpCookieAcceptPolicy = httpCookieAcceptPolicy
        copy.httpAdditionalHeaders = httpAdditionalHeaders
        copy.httpMaximumConnectionsPerHost = httpMaximumConnectionsPerHost
        copy.httpCookieStorage = httpCookieStorage
        copy.urlCredentialStorage = urlCredentialStorage
        copy.urlCache = urlCache
        copy.shouldUseExtendedBackgroundIdleMode = shouldUseExtendedBackgroundIdleMode
        // Tasks of a background session always go to the host: custom protocol classes are
        // not available to background sessions on iOS either.
        copy.protocolClasses = [BackgroundTransferProtocol.self]
        copy.sendsLaunchEvents = sendsLaunchEvents
        copy.expensiveNetworkAccess = expensiveNetworkAccess
        copy.constrainedNetworkAccess = constrainedNetworkAccess
        return copy
    }
}

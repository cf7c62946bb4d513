import Foundation

/// The error domain of `BGTaskScheduler` errors, as Apple's SDK exports it.
public let BGTaskSchedulerErrorDomain = "BGTaskSchedulerErrorDomain"

extension BGTaskScheduler {
    /// The error domain of `BGTaskScheduler` errors.
    public static let errorDomain = BGTaskSchedulerErrorDomain

    /// An error `submit(_:)` and `submitTaskRequest(_:)` throw, shaped as Apple's: a wrapper
    /// around the `NSError` it stores, built on swift-corelibs-foundation's own bridging
    /// protocols (as its `CocoaError` and `URLError` are).
    ///
    /// Apps match it as they do on iOS: `catch let e as BGTaskScheduler.Error` with
    /// `switch e.code`, `catch BGTaskScheduler.Error.notPermitted` (which also matches an
    /// `NSError` of this domain and code, such as an app's test double throws), and
    /// `(error as NSError).domain / .code`.
    public struct Error: _BridgedStoredNSError, @unchecked Sendable {
        public let _nsError: NSError

        /// Wraps `error`, which should be of `BGTaskSchedulerErrorDomain`.
        public init(_nsError error: NSError) {
            _nsError = error
        }

        public static var _nsErrorDomain: String { BGTaskSchedulerErrorDomain }

        public enum Code: Int, _ErrorCodeProtocol, Sendable {
            public typealias _ErrorType = BGTaskScheduler.Error

            /// Background task scheduling is not available (Background App Refresh off, Low
            /// Power Mode, an extension that may not submit, or no host).
            case unavailable = 1
            /// At most 1 refresh and 10 processing requests may be pending per app.
            case tooManyPendingTaskRequests = 2
            /// The identifier is not in BGTaskSchedulerPermittedIdentifiers or the background
            /// mode (or entitlement) the request needs is missing.
            case notPermitted = 3
            /// A continued-processing request with the `.fail` strategy could not start now.
            case immediateRunIneligible = 4

            /// `catch BGTaskScheduler.Error.notPermitted`: matches this code in a
            /// `BGTaskScheduler.Error` or in any error whose `NSError` has this domain and
            /// code. Apple's runtime bridges such an `NSError` to `BGTaskScheduler.Error`
            /// before `_ErrorCodeProtocol`'s own `~=` looks; Linux's cannot (`as?` gives
            /// nil), so this member, which shadows that one, compares domain and code itself.
            public static func ~= (match: Code, error: any Swift.Error) -> Bool {
                if let error = error as? BGTaskScheduler.Error {
                    return error._nsError.code == match.rawValue
                }
                let nsError = error as NSError
                return nsError.domain == BGTaskSchedulerErrorDomain && nsError.code == match.rawValue
            }
        }

        /// The error's code; `.unavailable` for a stored code this SDK does not know (Apple's
        /// traps there).
        public var code: Code { Code(rawValue: _nsError.code) ?? .unavailable }

        public static var unavailable: Code { .unavailable }
        public static var tooManyPendingTaskRequests: Code { .tooManyPendingTaskRequests }
        public static var notPermitted: Code { .notPermitted }
        public static var immediateRunIneligible: Code { .immediateRunIneligible }

        /// An error carrying the host's explanation as its localized description.
        init(_ code: Code, message: String?) {
            self.init(code, userInfo: message.map { [NSLocalizedDescriptionKey: $0] } ?? [:])
        }

        // The protocols' defaults hash the stored NSError, and corelibs' NSError.hash traps
        // (CFHash): hash what `==` compares first, the domain and code.
        public func hash(into hasher: inout Hasher) {
            hasher.combine(_nsError.domain)
            hasher.combine(_nsError.code)
        }

        public var hashValue: Int {
            var hasher = Hasher()
            hash(into: &hasher)
            return hasher.finalize()
        }

        /// As Apple's NSError describes itself (corelibs' misplaces the spaces and quotes the
        /// failure reason instead of the description).
        public var description: String {
            Self.describe(domain: _nsError.domain, code: _nsError.code, userInfo: _nsError.userInfo)
        }

        /// The user info's description, or Apple's sentence for an error without one
        /// ("couldn’t", where corelibs says "could not").
        public var localizedDescription: String {
            let userInfo = _nsError.userInfo
            if let description = userInfo[NSLocalizedDescriptionKey] as? String { return description }
            let reason = userInfo[NSLocalizedFailureReasonErrorKey] as? String
                ?? "(\(_nsError.domain) error \(_nsError.code).)"
            return "The operation couldn’t be completed. \(reason)"
        }

        static func describe(domain: String, code: Int, userInfo: [String: Any]) -> String {
            let text = userInfo[NSLocalizedDescriptionKey] as? String ?? "(null)"
            var description = "Error Domain=\(domain) Code=\(code) \"\(text)\""
            if !userInfo.isEmpty {
                let entries = userInfo.sorted { $0.key < $1.key }.map { key, value in
                    switch value {
                    case let error as BGTaskScheduler.Error: "\(key)={\(error)}"
                    case let error as NSError: "\(key)={\(describe(domain: error.domain, code: error.code, userInfo: error.userInfo))}"
                    default: "\(key)=\(value)"
                    }
                }
                description += " UserInfo={\(entries.joined(separator: ", "))}"
            }
            return description
        }
    }
}

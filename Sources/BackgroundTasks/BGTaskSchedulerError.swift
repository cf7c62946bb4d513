import Foundation

/// The error domain of `BGTaskScheduler` errors, as Apple's SDK exports it.
public let BGTaskSchedulerErrorDomain = "BGTaskSchedulerErrorDomain"

extension BGTaskScheduler {
    /// The error domain of `BGTaskScheduler` errors.
    public static let errorDomain = BGTaskSchedulerErrorDomain

    /// An error `submit(_:)` throws. Matchable as Apple's is: `catch let e as
    /// BGTaskScheduler.Error` with `switch e.code`, `catch BGTaskScheduler.Error.notPermitted`,
    /// and `(error as NSError).domain / .code`.
    public struct Error: CustomNSError, Hashable, Sendable {
        public enum Code: Int, Sendable, Hashable {
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
        }

        public let code: Code
        private let message: String?

        public init(_ code: Code, message: String? = nil) {
            self.code = code
            self.message = message
        }

        public init(_ code: Code, userInfo: [String: Any] = [:]) {
            self.init(code, message: userInfo[NSLocalizedDescriptionKey] as? String)
        }

        public static var errorDomain: String { BGTaskSchedulerErrorDomain }
        public var errorCode: Int { code.rawValue }
        public var errorUserInfo: [String: Any] {
            message.map { [NSLocalizedDescriptionKey: $0] } ?? [:]
        }

        public static var unavailable: Code { .unavailable }
        public static var tooManyPendingTaskRequests: Code { .tooManyPendingTaskRequests }
        public static var notPermitted: Code { .notPermitted }
        public static var immediateRunIneligible: Code { .immediateRunIneligible }

        public static func == (lhs: Self, rhs: Self) -> Bool { lhs.code == rhs.code }
        public func hash(into hasher: inout Hasher) { hasher.combine(code) }
    }
}

extension BGTaskScheduler.Error: LocalizedError {
    public var errorDescription: String? {
        message ?? "The operation couldn’t be completed. (BGTaskSchedulerErrorDomain error \(code.rawValue).)"
    }
}

/// Lets `catch BGTaskScheduler.Error.notPermitted` match, as Apple's overlay does for
/// error-code enums.
public func ~= (code: BGTaskScheduler.Error.Code, error: any Swift.Error) -> Bool {
    guard let error = error as? BGTaskScheduler.Error else { return false }
    return error.code == code
}

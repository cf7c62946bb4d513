import Foundation

/// The error domain of `UNUserNotificationCenter` errors, as Apple's SDK exports it.
public let UNErrorDomain = "UNErrorDomain"

/// An error the notification center returns, shaped as Apple's: a wrapper around the `NSError`
/// it stores (as `BGTaskScheduler.Error` is), matched with `catch let e as UNError` +
/// `switch e.code`, `catch UNError.notificationsNotAllowed`, or `(error as NSError).code`.
public struct UNError: _BridgedStoredNSError, @unchecked Sendable {
    public let _nsError: NSError

    public init(_nsError error: NSError) {
        _nsError = error
    }

    public static var _nsErrorDomain: String { UNErrorDomain }
    public static var errorDomain: String { UNErrorDomain }

    /// Apple's codes (`UNErrorCode`).
    public enum Code: Int, _ErrorCodeProtocol, Sendable {
        public typealias _ErrorType = UNError

        /// The app is not authorized to post notifications (the operator has not allowed it).
        case notificationsNotAllowed = 1
        case attachmentInvalidURL = 100
        case attachmentUnrecognizedType = 101
        case attachmentInvalidFileSize = 102
        case attachmentNotInDataStore = 103
        case attachmentMoveIntoDataStoreFailed = 104
        case attachmentCorrupt = 105
        /// A calendar trigger whose components match no date.
        case notificationInvalidNoDate = 1400
        case notificationInvalidNoContent = 1401
        case contentProvidingObjectNotAllowed = 1500
        case contentProvidingInvalid = 1501
        case badgeInputInvalid = 1600

        /// `catch UNError.notificationsNotAllowed`: matches this code in a `UNError` or in any
        /// error whose `NSError` has this domain and code (Linux cannot bridge an `NSError` to
        /// the struct at a cast; see `BGTaskScheduler.Error.Code.~=`).
        public static func ~= (match: Code, error: any Swift.Error) -> Bool {
            if let error = error as? UNError { return error._nsError.code == match.rawValue }
            let nsError = error as NSError
            return nsError.domain == UNErrorDomain && nsError.code == match.rawValue
        }
    }

    public var code: Code { Code(rawValue: _nsError.code) ?? .notificationsNotAllowed }

    public static var notificationsNotAllowed: Code { .notificationsNotAllowed }
    public static var attachmentInvalidURL: Code { .attachmentInvalidURL }
    public static var attachmentUnrecognizedType: Code { .attachmentUnrecognizedType }
    public static var attachmentInvalidFileSize: Code { .attachmentInvalidFileSize }
    public static var attachmentNotInDataStore: Code { .attachmentNotInDataStore }
    public static var attachmentMoveIntoDataStoreFailed: Code { .attachmentMoveIntoDataStoreFailed }
    public static var attachmentCorrupt: Code { .attachmentCorrupt }
    public static var notificationInvalidNoDate: Code { .notificationInvalidNoDate }
    public static var notificationInvalidNoContent: Code { .notificationInvalidNoContent }
    public static var contentProvidingObjectNotAllowed: Code { .contentProvidingObjectNotAllowed }
    public static var contentProvidingInvalid: Code { .contentProvidingInvalid }
    public static var badgeInputInvalid: Code { .badgeInputInvalid }

    init(_ code: Code, message: String?) {
        self.init(code, userInfo: message.map { [NSLocalizedDescriptionKey: $0] } ?? [:])
    }

    // corelibs' NSError.hash traps (CFHash): hash what `==` compares first.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(_nsError.domain)
        hasher.combine(_nsError.code)
    }

    public var hashValue: Int {
        var hasher = Hasher()
        hash(into: &hasher)
        return hasher.finalize()
    }

    /// As Apple's NSError describes itself.
    public var description: String {
        let text = _nsError.userInfo[NSLocalizedDescriptionKey] as? String ?? "(null)"
        return "Error Domain=\(_nsError.domain) Code=\(_nsError.code) \"\(text)\""
    }

    public var localizedDescription: String {
        _nsError.userInfo[NSLocalizedDescriptionKey] as? String ?? "The operation couldn’t be completed. (\(_nsError.domain) error \(_nsError.code).)"
    }
}

import BGTaskModel
import Foundation

/// A transfer as the host keeps it (table `transfer`): what the app sees (`info`), the request
/// it handed over, and what only the host needs (the bundle that made it, the validator and
/// spool file of a resumable download, the launches it was launched for and delivered in).
public struct StoredTransfer: Sendable, Equatable {
    public var info: TransferInfo
    public var request: TransferRequest
    /// The bundle whose launch created it (its container holds the upload's body file).
    public var bundle: String
    /// ETag (preferred) or Last-Modified of the partial body: sent as If-Range on resume.
    public var validator: String?
    /// The host-private spool file (a download's partial body, an upload's copied body).
    public var spool: String?
    /// earliestBeginDate moved onto the host's clock (seconds since 1970).
    public var notBefore: Double?
    /// The `background-transfer` launch started for its events.
    public var launchedFor: String?
    /// The launch whose app was told it ended (`delivered`).
    public var deliveredInLaunch: String?
    public var deliveredAt: Double?

    public var id: String { info.id }
    public var app: String { info.app }

    /// The memberwise initializer, for the modules above this one.
    package init(info: TransferInfo, request: TransferRequest, bundle: String, validator: String? = nil, spool: String? = nil, notBefore: Double? = nil, launchedFor: String? = nil, deliveredInLaunch: String? = nil, deliveredAt: Double? = nil) {
        self.info = info
        self.request = request
        self.bundle = bundle
        self.validator = validator
        self.spool = spool
        self.notBefore = notBefore
        self.launchedFor = launchedFor
        self.deliveredInLaunch = deliveredInLaunch
        self.deliveredAt = deliveredAt
    }
}

import BGTaskControl
import BGTaskLaunch
import BGTaskTransfers
import BGTaskStore
import BGTaskModel
import Dispatch
import Foundation

/// How the verbs' answers are made: a rejection as a response, run records within a frame, an
/// app's size in a listing.
extension ControlVerbs {
    static func response(_ rejection: SubmissionRules.Rejection?) -> ControlResponse {
        rejection.map { .failure(code($0.status), $0.message) } ?? ControlResponse()
    }

    static func code(_ status: SubmissionRules.Status) -> ControlErrorCode {
        switch status {
        case .unavailable: .unavailable
        case .tooManyPendingTaskRequests: .tooManyPendingTaskRequests
        case .notPermitted: .notPermitted
        case .immediateRunIneligible: .immediateRunIneligible
        }
    }

    // MARK: Reading

    /// A page of `apps` stops before its estimated JSON passes this, so that it fits a control
    /// frame whatever the apps hold (long paths, many permitted identifiers: an app's own size
    /// is bounded by validation, see `BundleReader.Limits`).
    static let appsPageBytes = ControlFrame.maximumPayload / 2

    /// Room for the records of a `history` answer: the frame less room for the rest of it.
    static let historyBytes = ControlFrame.maximumPayload - 64 * 1024

    /// `records` (newest first) as many as fit `budget` bytes of the control protocol's JSON,
    /// in order, and how many were left out: the oldest that did not fit, and any record too
    /// large by itself (so that no launch's record can make another app's history unanswerable).
    static func fitting(_ records: [RunRecord], budget: Int = historyBytes) -> ([RunRecord], omitted: Int) {
        let encoder = JSONEncoder.control
        var kept: [RunRecord] = []
        var bytes = 0
        for record in records {
            let size = ((try? encoder.encode(record))?.count ?? budget) + 1
            if size > budget { continue }
            if bytes + size > budget { break }
            bytes += size
            kept.append(record)
        }
        return (kept, records.count - kept.count)
    }

    /// An upper estimate of an app's JSON in an `apps` answer: its strings, doubled for
    /// escapes (JSONEncoder writes `/` as `\/`), and room for the keys and the fixed fields.
    static func estimatedBytes(_ bundle: PluginBundle, running: String?) -> Int {
        var strings: [String] = [bundle.identifier, bundle.url.path, running ?? ""]
        strings += bundle.permittedIdentifiers
        strings += bundle.backgroundModes
        strings += bundle.extensions.map(\.identifier)
        strings += bundle.appGroups
        strings += bundle.entitlements.keys
        return 256 + strings.reduce(0) { $0 + 2 * $1.utf8.count + 3 }
    }
}

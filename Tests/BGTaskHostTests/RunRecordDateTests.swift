@testable import BGTaskHost
import BGTaskControl
import Foundation
import Testing

/// Records write their dates without an ISO8601DateFormatter (`RunRecord.iso8601`): the text
/// must be the formatter's, to the millisecond, and read back to the same millisecond.
@Suite struct RunRecordDateTests {
    @Test func theRecordsDatesAreTheFormattersText() {
        let formatter = RunRecord.dateFormatter(fractional: true)
        var generator = SystemRandomNumberGenerator()
        var dates: [Date] = [
            Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: -0.0005), Date(timeIntervalSince1970: -1.5),
            Date(timeIntervalSince1970: 1_795_000_000.123), Date(timeIntervalSince1970: 1_795_000_000.9999),
            Date(timeIntervalSince1970: 951_782_400), // 2000-02-29
            Date(timeIntervalSince1970: 4_107_542_399.999), // 2099-12-31T23:59:59.999
            Date(timeIntervalSince1970: -2_208_988_800), // 1900-01-01
            Date(), Date.distantPast, Date.distantFuture,
        ]
        // Out of any calendar: the formatter's answer, never a trap converting to time_t.
        for absurd in [Date(timeIntervalSince1970: 1e300), Date(timeIntervalSince1970: -1e300), Date(timeIntervalSince1970: .nan)] {
            #expect(RunRecord.iso8601(absurd) == formatter.string(from: absurd))
        }
        for _ in 0..<5_000 { dates.append(Date(timeIntervalSince1970: Double.random(in: 0...4_102_444_800, using: &generator))) }
        // Dates made at millisecond precision, as records keep them.
        for _ in 0..<5_000 { dates.append(Date(timeIntervalSince1970: Double(Int64.random(in: 0...4_102_444_800_000, using: &generator)) / 1000)) }
        var mismatches: [String] = []
        for date in dates where RunRecord.iso8601(date) != formatter.string(from: date) {
            mismatches.append("\(date.timeIntervalSince1970): \(RunRecord.iso8601(date)) vs \(formatter.string(from: date))")
        }
        #expect(mismatches.isEmpty, "\(mismatches.count) differ: \(mismatches.prefix(5))")
    }
}

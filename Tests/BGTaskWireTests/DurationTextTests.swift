import BGTaskModel
import Testing

/// Durations as the CLI reads them and as the CLI and the host print them (`DurationText`):
/// what is accepted, what is refused and with which words, and that printing then reading gives
/// the same duration back.
@Suite struct DurationTextTests {
    @Test(arguments: [
        ("30", 30_000), ("0", 0), ("0.25", 250), ("1.5", 1_500),
        ("90s", 90_000), ("250ms", 250), ("15m", 900_000), ("2h", 7_200_000), ("1d", 86_400_000), ("7d", 604_800_000),
        ("1h30m", 5_400_000), ("2h0m", 7_200_000), ("1d2h", 93_600_000), ("1m30s", 90_000), ("1s500ms", 1_500),
        ("1d2h3m4s5ms", 93_784_005), ("1.5h", 5_400_000), (".5s", 500), ("0.0004s", 0), ("0.0006s", 1),
        ("1H30M", 5_400_000), ("1D", 86_400_000), ("  15m ", 900_000), ("36525d", 3_155_760_000_000),
    ] as [(String, Int64)])
    func accepted(_ text: String, _ milliseconds: Int64) throws {
        #expect(try DurationText.parse(text) == .milliseconds(milliseconds), "\(text)")
    }

    @Test(arguments: [
        ("", "it is empty"),
        ("soon", "it does not start with a number"),
        ("nan", "it does not start with a number"),
        ("inf", "it does not start with a number"),
        ("-5s", "a duration is never negative"),
        ("+5m", "a duration takes no sign here"),
        ("1e308", "unknown unit 'e' after '1' (units: d, h, m, s, ms)"),
        ("5x", "unknown unit 'x' after '5' (units: d, h, m, s, ms)"),
        ("5µs", "unknown unit 'µs' after '5'"),
        ("1w", "unknown unit 'w' after '1'"),
        ("1h30", "'30' after '1h' has no unit (after h comes m, s, ms)"),
        ("30s5", "'5' after '30s' has no unit (after s comes ms)"),
        ("1m1h", "'1h' comes after 'm': units go from the largest to the smallest (d, h, m, s, ms)"),
        ("1h1h", "the unit 'h' comes twice"),
        ("1h 30m", "no spaces inside a duration (write 1h30m, not 1h 30m)"),
        ("1h-5m", "unexpected '-' after '1h'"),
        (".", "'.' is not a number"),
        ("1..5s", "unexpected '.' after '1.'"),
        ("36526d", "longer than the most any duration may be, 36525d (100 years)"),
        ("3155760001", "longer than the most any duration may be"),
        ("99999999999999999999d", "longer than the most any duration may be"),
        ("1ms1ms", "the unit 'ms' comes twice"),
        ("9223372036854775807ms", "longer than the most any duration may be"),
        ("106751991167d", "longer than the most any duration may be"),
    ])
    func refused(_ text: String, _ reason: String) {
        #expect {
            _ = try DurationText.parse(text)
        } throws: { error in
            guard let error = error as? DurationText.ParseError else { return false }
            // The message names the text as given, then why.
            return error.text == text && error.reason.contains(reason) && error.description.hasPrefix("'\(text)' is not a duration: ")
        }
    }

    @Test(arguments: [
        (0, "0s"), (250, "250ms"), (1_000, "1s"), (1_500, "1s500ms"), (59_000, "59s"), (60_000, "1m"), (90_000, "1m30s"),
        (3_600_000, "1h"), (5_400_000, "1h30m"), (7_200_000, "2h"), (86_400_000, "1d"), (93_600_000, "1d2h"),
        (604_800_000, "7d"), (93_784_005, "1d2h3m4s5ms"), (3_155_760_000_000, "36525d"),
    ] as [(Int64, String)])
    func printed(_ milliseconds: Int64, _ text: String) throws {
        #expect(DurationText.format(.milliseconds(milliseconds)) == text)
        #expect(try DurationText.parse(text) == .milliseconds(milliseconds), "printed text reads back")
    }

    /// Every duration printed reads back as itself, and every accepted text prints in the one
    /// canonical form, which reads back the same.
    @Test func formatThenParseIsTheIdentity() throws {
        var generator = SystemRandomNumberGenerator()
        let maximum = Int64(DurationText.maximum.components.seconds) * 1000
        let edges: [Int64] = [0, 1, 999, 1_000, 59_999, 60_000, 3_599_999, 3_600_000, 86_399_999, 86_400_000, maximum - 1, maximum]
        let samples = edges + (0..<2_000).map { _ in
            // Spread over every magnitude, not only the largest.
            Int64.random(in: 0...maximum, using: &generator) >> Int64.random(in: 0...40, using: &generator)
        }
        for milliseconds in samples {
            let text = DurationText.format(.milliseconds(milliseconds))
            #expect(try DurationText.parse(text) == .milliseconds(milliseconds), "\(milliseconds) ms printed as \(text)")
        }
        for text in ["90s", "2h0m", "1.5h", "60m", "24h", "1000ms", "3600", "0.5"] {
            let canonical = DurationText.format(try DurationText.parse(text))
            #expect(DurationText.format(try DurationText.parse(canonical)) == canonical, "\(text) → \(canonical)")
        }
        #expect(DurationText.format(try DurationText.parse("90s")) == "1m30s")
        #expect(DurationText.format(try DurationText.parse("2h0m")) == "2h")
        #expect(DurationText.format(try DurationText.parse("24h")) == "1d")
    }

    /// Seconds as the control protocol carries them: NaN, infinities and huge values print
    /// without trapping; sub-millisecond parts round.
    @Test func secondsPrintWithoutTrapping() throws {
        #expect(DurationText.format(seconds: 5_400) == "1h30m")
        #expect(DurationText.format(seconds: 0.2504) == "250ms")
        #expect(DurationText.format(seconds: -90) == "-1m30s")
        #expect(DurationText.format(seconds: .nan) == "0s")
        #expect(DurationText.format(seconds: .infinity).hasSuffix("ms"))
        #expect(DurationText.format(seconds: -.infinity).hasPrefix("-"))
        #expect(DurationText.format(seconds: 1e300) == DurationText.format(seconds: .infinity))
        #expect(try DurationText.parseSeconds("1h30m") == 5_400)
        #expect(try DurationText.parseSeconds("250ms") == 0.25)
    }
}

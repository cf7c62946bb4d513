import Crypto
@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import BGTaskSystem
import Foundation
import Testing

/// Background pushes through a real host: `bgtask push` as simctl's, a device token stable across
/// restarts, delivery in a `remote-notification` launch to the app delegate with its completion
/// handler's result in the record, and iOS's rules for what waits, what is coalesced and what is
/// dropped, each answer saying why.
@Suite struct PushTests {
    static let pushApp = TestBundle(library: "PushApp", info: "Tests/Fixtures/PushApp/Info.plist", name: "PushApp.app")
    static let noMode = TestBundle(library: "BackgroundTime", info: "Tests/Fixtures/BackgroundTime/Info.plist", name: "BackgroundTime.app")
    static let app = "com.example.pushapp"

    private func payload(_ scratch: Scratch, _ name: String, _ json: String) throws -> String {
        let path = scratch.url.appendingPathComponent(name).path
        try json.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    private func pushReport(_ host: HostProcess, _ arguments: [String]) throws -> PushReport {
        let result = try host.cli(["push"] + arguments + ["--json"])
        try #require(result.status == 0, "push failed: \(result.stderr)")
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try decoder.decode(PushReport.self, from: Data(result.stdout.utf8))
    }

    private func record(_ host: HostProcess, launch id: String) throws -> RunRecord {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let record = (try host.send(.history(limit: 100)).records ?? []).first(where: { $0.launchID == id }) { return record }
            usleep(20_000)
        }
        throw HostTestError("no record of launch \(id)")
    }

    @Test func theTokenIsTheAppsAcrossRestartsAndReachesTheDelegate() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        var host = try HostProcess.started(scratch, installing: [Self.pushApp])
        let token = try host.cli(["device-token", Self.app]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(token.count == 64 && token.allSatisfy(\.isHexDigit), "\(token)")
        let launched = try host.cli(["simulate-launch", "com.example.pushapp.register", "--force", "--json"])
        #expect(launched.status == 0, "\(launched.stderr)")
        let record = try #require(try? RunRecord.decode(Data(launched.stdout.utf8)))
        #expect(record.succeeded, "\(record)")
        #expect(try record.logText().contains("pushapp: token \(token), registered true"))
        #expect(host.stop() == 0)
        host = try HostProcess.started(scratch, installing: [])
        #expect(try host.cli(["device-token", Self.app]).stdout.trimmingCharacters(in: .whitespacesAndNewlines) == token)
        #expect(try host.cli(["device-token", "com.example.nothere"]).stderr.contains("no valid bundle with identifier com.example.nothere"))
        #expect(host.stop() == 0)
    }

    @Test func aBackgroundPushLaunchesTheAppAndItsResultIsRecorded() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [Self.pushApp])
        defer { _ = host.stop() }
        // simctl's file shape, the app named inside it.
        let file = try payload(scratch, "episode.apns", #"{"Simulator Target Bundle": "com.example.pushapp", "aps": {"content-available": 1}, "episode": 42}"#)
        let report = try pushReport(host, [file])
        #expect(report.state == .delivered && report.kind == .background && report.priority == 5, "\(report)")
        let launchID = try #require(report.launchID)
        let record = try record(host, launch: launchID)
        #expect(record.reason == "remote-notification" && record.termination == .suspended, "\(record)")
        let push = try #require(record.push)
        #expect(push.id == report.id && push.result == "new-data" && push.deliveredAfterMs >= 0 && push.deliveredAfterMs < 5000, "\(push)")
        #expect((push.completedMs ?? 0) >= 50)
        let log = try record.logText()
        #expect(log.contains("pushapp: launched for a push, episode 42"))
        #expect(log.contains("pushapp: push episode 42, content-available 1, state 2, main true"))
        #expect(record.description.contains("completion handler: new-data"))

        // From standard input, app named on the command line.
        let piped = try runCommand(["/bin/sh", "-c", #"printf '%s' "$PAYLOAD" | "$CLI" push "$APP" - --state "$STATE""#], environment: [
            "PAYLOAD": #"{"aps":{"content-available":1},"episode":43}"#, "CLI": Products.cli, "APP": Self.app, "STATE": scratch.state.path])
        #expect(piped.status == 0 && piped.stdout.contains("delivered in launch"), "\(piped.stdout) \(piped.stderr)")
        // An alert push shows; it does not launch the app.
        let alert = try pushReport(host, [Self.app, try payload(scratch, "alert.json", #"{"aps":{"alert":"New episode"}}"#)])
        #expect(alert.state == .delivered && alert.kind == .alert && alert.launchID == nil && alert.detail?.contains("not launched") == true)
    }

    @Test func pushesWaitCoalesceAndDropAsOnIOSAndSayWhy() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [Self.pushApp, Self.noMode])
        defer { _ = host.stop() }
        let file = try payload(scratch, "p.json", #"{"aps":{"content-available":1},"episode":1}"#)
        #expect(try host.cli(["device", "--app", Self.app, "--refresh", "off"]).status == 0)
        let first = try pushReport(host, [Self.app, file])
        #expect(first.state == .pending)
        #expect(first.blockers?.map(\.code) == ["app-refresh-disabled"], "\(first)")
        let second = try pushReport(host, [Self.app, file])
        #expect(second.state == .pending)
        // The first was coalesced into the second; `why` says so.
        let why = try host.cli(["why", first.id])
        #expect(why.stdout.contains("dropped") && why.stdout.contains("coalesced: a newer push for the app (\(second.id))"), "\(why.stdout)")
        // apns-expiration 0: now or never.
        let never = try pushReport(host, [Self.app, file, "--expiration", "0"])
        #expect(never.state == .dropped && never.detail?.contains("now or never") == true, "\(never)")
        // The switch back on: the waiting push is delivered. (`never` coalesced `second`: APNs
        // keeps an app's latest push only.)
        #expect(try host.cli(["device", "--app", Self.app, "--refresh", "on"]).status == 0)
        let later = try pushReport(host, [Self.app, file])
        #expect(later.state == .delivered, "\(later)")
        // An app without the remote-notification background mode never gets one.
        let noMode = try pushReport(host, ["com.example.bgtime", file])
        #expect(noMode.state == .dropped && noMode.detail?.contains("no 'remote-notification' in UIBackgroundModes") == true, "\(noMode)")
        let listed = try host.cli(["pushes", Self.app]).stdout
        #expect(listed.contains(first.id) && listed.contains(later.id), "\(listed)")
    }

    @Test func apnsRulesRefuseWhatAPNsRefuses() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, installing: [Self.pushApp])
        defer { _ = host.stop() }
        let background = try payload(scratch, "b.json", #"{"aps":{"content-available":1}}"#)
        let cases: [([String], String)] = [
            ([Self.app, background, "--priority", "10"], "BadPriority"),
            ([Self.app, background, "--priority", "7"], "BadPriority"),
            ([Self.app, try payload(scratch, "big.json", #"{"aps":{"content-available":1},"x":""# + "\"" + String(repeating: "x", count: 5000) + "\"}")], "PayloadTooLarge"),
            ([Self.app, try payload(scratch, "bad.json", "not json")], "BadPayload"),
            ([Self.app, try payload(scratch, "noaps.json", #"{"episode":1}"#)], "BadPayload"),
            ([Self.app, background, "--type", "voip"], "InvalidPushType"),
            ([Self.app, try payload(scratch, "alert.json", #"{"aps":{"alert":"x"}}"#), "--type", "background"], "InvalidPushType"),
            ([Self.app, background, "--id", "not-a-uuid"], "BadMessageId"),
            ([Self.app, background, "--collapse-id", String(repeating: "c", count: 65)], "BadCollapseId"),
            ([Self.app, background, "--expiration=-1"], "BadExpirationDate"),
            (["com.example.nothere", background], "Unregistered"),
        ]
        for (arguments, reason) in cases {
            let result = try host.cli(["push"] + arguments)
            #expect(result.status != 0 && result.stderr.contains(reason), "\(arguments.prefix(3)): \(result.stderr)")
        }
        // The same apns-id twice (a provider's retry) is accepted, as APNs accepts it: the same
        // push, kept once and delivered once, in whatever case the retry writes the id.
        let id = UUID().uuidString
        let first = try pushReport(host, [Self.app, background, "--id", id])
        let retried = try pushReport(host, [Self.app, background, "--id", id.lowercased()])
        #expect(first.id == id && retried.id == id && retried.launchID == first.launchID, "\(first) \(retried)")
        #expect(try host.send(.pushes(app: Self.app)).pushes?.filter { $0.id == id }.count == 1)
    }

    @Test func aHandlerThatNeverCompletesIsKilledAndTheRecordSaysSo() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "1s", "--grace", "300ms"], installing: [Self.pushApp])
        defer { _ = host.stop() }
        let report = try pushReport(host, [Self.app, try payload(scratch, "hang.json", #"{"aps":{"content-available":1},"hang":true}"#)])
        let record = try record(host, launch: try #require(report.launchID))
        #expect(record.termination == .watchdog, "\(record)")
        #expect(record.push?.result == nil)
        #expect(record.description.contains("completion handler never called"))
    }

    @Test func theRealisticPolicyThrottlesBackgroundPushes() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--policy", "realistic"], installing: [Self.pushApp])
        defer { _ = host.stop() }
        let file = try payload(scratch, "p.json", #"{"aps":{"content-available":1}}"#)
        for _ in 0..<PushRules.backgroundPushesPerHour {
            let report = try pushReport(host, [Self.app, file])
            #expect(report.state == .delivered, "\(report)")
            _ = try record(host, launch: try #require(report.launchID))
        }
        let throttled = try pushReport(host, [Self.app, file])
        #expect(throttled.state == .pending && throttled.blockers?.first?.code == "rate-limit", "\(throttled)")
        #expect(throttled.blockers?.first?.until != nil)
    }
}

/// The endpoint's pieces that need no host.
@Suite struct APNsPartsTests {
    /// Ids the host makes (apns-ids too): canonical upper-case version-4 UUIDs from getrandom,
    /// all distinct.
    @Test func madeIdsAreCanonicalRandomUUIDs() throws {
        var seen = Set<String>()
        for _ in 0..<1000 {
            let id = RandomIdentifier.uuidString()
            #expect(id.range(of: #"^[0-9A-F]{8}-[0-9A-F]{4}-4[0-9A-F]{3}-[89AB][0-9A-F]{3}-[0-9A-F]{12}$"#, options: .regularExpression) != nil, "\(id)")
            #expect(UUID(uuidString: id)?.uuidString == id)
            seen.insert(id)
        }
        #expect(seen.count == 1000)
    }

    /// `iat` as APNs takes it: a JSON number (integer or not) or a string of digits.
    @Test func issuedAtIsANumberOrANumericString() {
        #expect(APNsProviderAuth.issuedAt(1_700_000_000) == 1_700_000_000)
        #expect(APNsProviderAuth.issuedAt(1_700_000_000.5) == 1_700_000_000.5)
        #expect(APNsProviderAuth.issuedAt("1700000000") == 1_700_000_000)
        for bad: Any? in ["", "abc", "-1", "1e9", " 1700000000", "17000000000000000000000", nil, ["1"]] {
            #expect(APNsProviderAuth.issuedAt(bad) == nil, "\(String(describing: bad))")
        }
    }
}

/// The APNs-compatible endpoint, driven by a real HTTP/2 client (curl, prior knowledge), as a
/// provider's server would drive APNs.
@Suite struct APNsEndpointTests {
    static let app = PushTests.app

    /// `curl --http2-prior-knowledge` against the endpoint: the status, the response headers
    /// and the body.
    private func post(_ port: Int, token: String, headers: [String: String], body: String, method: String = "POST",
                      path: String? = nil, tls: Bool = false) throws -> (status: Int, headers: [String: String], body: String) {
        let curl = try #require(
            (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":").map { "\($0)/curl" }
                .first { FileManager.default.isExecutableFile(atPath: $0) },
            "curl (Debian's, with HTTP/2 through nghttp2) is needed: apt-get install curl")
        var command = [curl, "-sS"] + (tls ? ["--http2", "-k"] : ["--http2-prior-knowledge"]) + ["-X", method, "-D", "-", "--max-time", "20"]
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { command += ["-H", "\(name): \(value)"] }
        command += ["--data-binary", body, "\(tls ? "https" : "http")://127.0.0.1:\(port)\(path ?? "/3/device/\(token)")"]
        let result = try runCommand(command, timeout: .seconds(30))
        try #require(result.status == 0, "curl failed: \(result.stderr)")
        // Headers, a blank line, then the body.
        let sections = result.stdout.components(separatedBy: "\r\n\r\n")
        let headLines = sections[0].components(separatedBy: "\r\n")
        let status = Int(headLines[0].split(separator: " ").dropFirst().first ?? "") ?? 0
        var parsed: [String: String] = [:]
        for line in headLines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            parsed[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return (status, parsed, sections.dropFirst().joined(separator: "\r\n\r\n"))
    }

    private func boundPort(_ host: HostProcess) throws -> Int {
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            let log = (try? String(contentsOfFile: host.logPath, encoding: .utf8)) ?? ""
            if let line = log.split(separator: "\n").first(where: { $0.contains("APNs endpoint listening") }),
               let range = line.range(of: #"127\.0\.0\.1:(\d+)"#, options: .regularExpression),
               let port = Int(line[range].split(separator: ":").last ?? "") {
                return port
            }
            usleep(20_000)
        }
        throw HostTestError("the host did not log its APNs endpoint")
    }

    @Test func aProviderPushesThroughHTTP2AsToAPNs() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--apns-port", "0"], installing: [PushTests.pushApp])
        defer { _ = host.stop() }
        let port = try boundPort(host)
        let token = try host.cli(["device-token", Self.app]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let id = UUID().uuidString
        let background = #"{"aps":{"content-available":1},"episode":7}"#
        let accepted = try post(port, token: token, headers: [
            "apns-topic": Self.app, "apns-push-type": "background", "apns-priority": "5", "apns-id": id,
        ], body: background)
        #expect(accepted.status == 200, "\(accepted)")
        #expect(accepted.headers["apns-id"] == id)
        #expect(accepted.headers["bgtask-push-state"] == "delivered", "\(accepted.headers)")
        let report = try #require(try host.send(.pushes(app: Self.app)).pushes?.first { $0.id == id })
        let deadline = Date().addingTimeInterval(30)
        var record: RunRecord?
        while record == nil && Date() < deadline {
            record = (try host.send(.history(limit: 20)).records ?? []).first { $0.launchID == report.launchID }
            if record == nil { usleep(20_000) }
        }
        #expect(record?.push?.id == id && record?.push?.result == "new-data", "\(String(describing: record))")
        #expect(try record?.logText().contains("pushapp: push episode 7") == true)

        // APNs's refusals, with its statuses and reasons.
        let refusals: [(headers: [String: String], body: String, token: String, method: String, path: String?, status: Int, reason: String)] = [
            (["apns-topic": Self.app, "apns-priority": "10"], background, token, "POST", nil, 400, "BadPriority"),
            (["apns-topic": "com.example.other"], background, token, "POST", nil, 400, "DeviceTokenNotForTopic"),
            ([:], background, token, "POST", nil, 400, "MissingTopic"),
            (["apns-topic": Self.app], background, "abc", "POST", nil, 400, "BadDeviceToken"),
            (["apns-topic": Self.app], background, String(repeating: "0", count: 64), "POST", nil, 400, "BadDeviceToken"),
            (["apns-topic": Self.app], #"{"aps":{"content-available":1},"x":""# + "\"" + String(repeating: "x", count: 5000) + "\"}", token, "POST", nil, 413, "PayloadTooLarge"),
            (["apns-topic": Self.app], background, token, "GET", nil, 405, "MethodNotAllowed"),
            (["apns-topic": Self.app], background, token, "POST", "/3/other/\(token)", 404, "BadPath"),
            (["apns-topic": Self.app, "apns-id": "nope"], background, token, "POST", nil, 400, "BadMessageId"),
            (["apns-topic": Self.app, "apns-push-type": "voip"], background, token, "POST", nil, 400, "InvalidPushType"),
        ]
        for refusal in refusals {
            let answer = try post(port, token: refusal.token, headers: refusal.headers, body: refusal.body, method: refusal.method, path: refusal.path)
            #expect(answer.status == refusal.status && answer.body.contains("\"reason\":\"\(refusal.reason)\""),
                    "\(refusal.reason): \(answer.status) \(answer.body)")
        }
        // The host served on: a last push is accepted.
        #expect(try post(port, token: token, headers: ["apns-topic": Self.app], body: background).status == 200)
    }

    /// As APNs serves providers: TLS with ALPN h2 (a self-signed certificate made with openssl).
    @Test func overTLSWithALPNH2AsAPNsServesIt() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let key = scratch.url.appendingPathComponent("key.pem").path, certificate = scratch.url.appendingPathComponent("cert.pem").path
        let made = try runCommand(["/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                                   "-days", "1", "-keyout", key, "-out", certificate])
        try #require(made.status == 0, "openssl: \(made.stderr)")
        // A file that is not a certificate: the host refuses to start and names it.
        let refused = try runCLI(["host", "--plugins", scratch.url.appendingPathComponent("none").path, "--state", scratch.state.path,
                                  "--apns-port", "0", "--apns-tls-certificate", key, "--apns-tls-key", key], timeout: .seconds(30))
        #expect(refused.status != 0 && refused.stderr.contains(key) && refused.stderr.contains("not a PEM certificate chain"), "\(refused.stderr)")

        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--apns-port", "0", "--apns-tls-certificate", certificate,
                                                                "--apns-tls-key", key], installing: [PushTests.pushApp])
        defer { _ = host.stop() }
        let port = try boundPort(host)
        let token = try host.cli(["device-token", Self.app]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let answer = try post(port, token: token, headers: ["apns-topic": Self.app, "apns-push-type": "background", "apns-priority": "5"],
                              body: #"{"aps":{"content-available":1},"episode":9}"#, tls: true)
        #expect(answer.status == 200 && answer.headers["bgtask-push-state"] == "delivered", "\(answer)")
        #expect(try post(port, token: token, headers: [:], body: "{}", tls: true).body.contains("MissingTopic"))
    }

    /// Token-based provider authentication (`--apns-auth-key`, `--apns-team-id`): a JWT signed
    /// with ES256 by the provider's key goes through; no token, another key, another team, a
    /// forged signature or a token over an hour old is refused as APNs refuses it.
    @Test func providerTokensAreCheckedAsAPNsChecksThem() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let key = P256.Signing.PrivateKey(), stranger = P256.Signing.PrivateKey()
        let keyFile = scratch.url.appendingPathComponent("AuthKey_ABC123DEFG.p8")
        try key.pemRepresentation.write(to: keyFile, atomically: true, encoding: .utf8)
        // A key file that holds no key: the host refuses to start and names it.
        let bad = scratch.url.appendingPathComponent("bad.p8")
        try "not a key".write(to: bad, atomically: true, encoding: .utf8)
        let refused = try runCLI(["host", "--plugins", scratch.url.appendingPathComponent("none").path, "--state", scratch.state.path,
                                  "--apns-port", "0", "--apns-auth-key", "K:\(bad.path)"], timeout: .seconds(30))
        #expect(refused.status != 0 && refused.stderr.contains(bad.path) && refused.stderr.contains("no P-256 key"), "\(refused.stderr)")

        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--apns-port", "0", "--apns-auth-key", "ABC123DEFG:\(keyFile.path)",
                                                                "--apns-team-id", "TEAM123456"], installing: [PushTests.pushApp])
        defer { _ = host.stop() }
        let port = try boundPort(host)
        let token = try host.cli(["device-token", Self.app]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let body = #"{"aps":{"content-available":1},"episode":11}"#
        func jwt(_ signer: P256.Signing.PrivateKey, kid: String = "ABC123DEFG", iss: String = "TEAM123456", iat: Double = Date().timeIntervalSince1970,
                 alg: String = "ES256") throws -> String {
            func encode(_ data: Data) -> String {
                data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            }
            let header = encode(try JSONSerialization.data(withJSONObject: ["alg": alg, "kid": kid]))
            let claims = encode(try JSONSerialization.data(withJSONObject: ["iss": iss, "iat": Int(iat)]))
            let signature = try signer.signature(for: Data("\(header).\(claims)".utf8))
            return "\(header).\(claims).\(encode(signature.rawRepresentation))"
        }
        let valid = try jwt(key)
        let accepted = try post(port, token: token, headers: ["apns-topic": Self.app, "authorization": "bearer \(valid)"], body: body)
        #expect(accepted.status == 200, "\(accepted)")
        let forged = valid.dropLast(4) + (valid.hasSuffix("AAAA") ? "BBBB" : "AAAA")
        let cases: [(String?, String)] = [
            (nil, "MissingProviderToken"),
            ("bearer \(try jwt(stranger))", "InvalidProviderToken"),
            ("bearer \(try jwt(key, kid: "OTHERKEY00"))", "InvalidProviderToken"),
            ("bearer \(try jwt(key, iss: "OTHERTEAM0"))", "InvalidProviderToken"),
            ("bearer \(try jwt(key, alg: "HS256"))", "InvalidProviderToken"),
            ("bearer \(forged)", "InvalidProviderToken"),
            ("bearer not.a.jwt", "InvalidProviderToken"),
            ("basic \(valid)", "InvalidProviderToken"),
            ("bearer \(try jwt(key, iat: Date().timeIntervalSince1970 - 3700))", "ExpiredProviderToken"),
            ("bearer \(try jwt(key, iat: Date().timeIntervalSince1970 + 3600))", "InvalidProviderToken"),
        ]
        for (authorization, reason) in cases {
            var headers = ["apns-topic": Self.app]
            if let authorization { headers["authorization"] = authorization }
            let answer = try post(port, token: token, headers: headers, body: body)
            #expect(answer.status == 403 && answer.body.contains("\"reason\":\"\(reason)\""), "\(reason): \(answer.status) \(answer.body)")
        }
    }
}

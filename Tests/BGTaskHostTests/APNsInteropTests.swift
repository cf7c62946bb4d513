import Crypto
@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// Provider client libraries from PyPI, in the venv `scripts/install-test-deps.sh` makes (CI
/// runs it first). Outside CI a machine without the venv skips these tests; under CI (`CI=true`)
/// a missing venv fails them, naming the script.
enum ProviderLibraries {
    static let venv = ProcessInfo.processInfo.environment["BGTASK_TEST_VENV"] ?? "/opt/bgtask-test-venv"
    static var python: String { "\(venv)/bin/python" }
    static let interop = Products.packageRoot.appendingPathComponent("Tests/Interop")
    static var installed: Bool { FileManager.default.isExecutableFile(atPath: python) }
    static var underCI: Bool { ProcessInfo.processInfo.environment["CI"] == "true" }
    /// Run the test: the venv is there, or CI is (where its absence is a failure).
    static var runnable: Bool { installed || underCI }

    static func require(sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(installed, "no provider libraries at \(venv): run scripts/install-test-deps.sh (as root) first", sourceLocation: sourceLocation)
    }
}

/// A CA and a server certificate for 127.0.0.1 signed by it, made with openssl: the clients
/// trust the CA as they would trust Apple's, with full verification (no `-k`, no CERT_NONE).
struct TestTLS {
    let ca: String, certificate: String, key: String

    init(_ scratch: Scratch) throws {
        let directory = scratch.url.appendingPathComponent("tls")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        func path(_ name: String) -> String { directory.appendingPathComponent(name).path }
        ca = path("ca.pem"); certificate = path("cert.pem"); key = path("key.pem")
        try "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            .write(toFile: path("ext.cnf"), atomically: true, encoding: .utf8)
        let steps: [[String]] = [
            ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=bgtask test CA", "-days", "2",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", path("ca.key"), "-out", ca],
            ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", path("req.csr")],
            ["x509", "-req", "-in", path("req.csr"), "-CA", ca, "-CAkey", path("ca.key"), "-CAcreateserial", "-days", "2",
             "-extfile", path("ext.cnf"), "-out", certificate],
        ]
        for step in steps {
            let made = try runCommand(["/usr/bin/openssl"] + step)
            try #require(made.status == 0, "openssl \(step[0]): \(made.stderr)")
        }
    }
}

/// The APNs endpoint as real provider libraries from PyPI drive it, each its own way (aioapns:
/// asyncio and h2, the authority as a `host` header, ids in lower case; kalyke-apns: httpx2,
/// `iat` a numeric string, one connection a push; pyapns_client: httpx, `iat` a float), and as
/// curl does: token auth, TLS with a certificate they verify, delivery to the app's delegate,
/// APNs's errors, the apns-id echoed byte for byte, a retry with the same id.
@Suite struct APNsInteropTests {
    static let app = PushTests.app
    static let keyID = "ABC123DEFG", team = "TEAM123456"

    /// A host serving the endpoint over TLS with token auth, PushApp installed.
    struct Provided {
        let scratch: Scratch, host: HostProcess, tls: TestTLS, port: Int, deviceToken: String
        let keyFile: String, strangerKeyFile: String
    }

    static func providedHost(_ scratch: Scratch, extra: [String] = []) throws -> Provided {
        let tls = try TestTLS(scratch)
        let key = P256.Signing.PrivateKey(), stranger = P256.Signing.PrivateKey()
        let keyFile = scratch.url.appendingPathComponent("AuthKey_\(keyID).p8").path
        let strangerKeyFile = scratch.url.appendingPathComponent("AuthKey_stranger.p8").path
        try key.pemRepresentation.write(toFile: keyFile, atomically: true, encoding: .utf8)
        try stranger.pemRepresentation.write(toFile: strangerKeyFile, atomically: true, encoding: .utf8)
        let host = try HostProcess.started(scratch, arguments: [
            "--clock", "virtual", "--apns-port", "0", "--apns-tls-certificate", tls.certificate, "--apns-tls-key", tls.key,
            "--apns-auth-key", "\(keyID):\(keyFile)", "--apns-team-id", team,
        ] + extra, installing: [PushTests.pushApp])
        let port = try boundPort(host)
        let token = try host.cli(["device-token", app]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        return Provided(scratch: scratch, host: host, tls: tls, port: port, deviceToken: token, keyFile: keyFile, strangerKeyFile: strangerKeyFile)
    }

    static func boundPort(_ host: HostProcess) throws -> Int {
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

    /// A provider token for the host's key, `iat` a numeric string (as kalyke-apns writes it).
    static func providerToken(_ provided: Provided) throws -> String {
        let key = try P256.Signing.PrivateKey(pemRepresentation: try String(contentsOfFile: provided.keyFile, encoding: .utf8))
        func encode(_ data: Data) -> String {
            data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }
        let header = encode(try JSONSerialization.data(withJSONObject: ["alg": "ES256", "kid": keyID]))
        let claims = encode(try JSONSerialization.data(withJSONObject: ["iss": team, "iat": "\(Int(Date().timeIntervalSince1970))"]))
        return "\(header).\(claims).\(encode(try key.signature(for: Data("\(header).\(claims)".utf8)).rawRepresentation))"
    }

    /// A background push with curl over TLS, the test's CA trusted; curl's status, the response
    /// head and body on stdout.
    static func curlPush(_ provided: Provided, id: String, episode: Int) throws -> CLIResult {
        try runCommand(["/usr/bin/curl", "-sS", "--http2", "--cacert", provided.tls.ca, "-D", "-", "--max-time", "10",
                        "-H", "apns-topic: \(app)", "-H", "apns-push-type: background", "-H", "apns-priority: 5",
                        "-H", "apns-id: \(id)", "-H", "authorization: bearer \(try providerToken(provided))",
                        "--data-binary", #"{"aps":{"content-available":1},"episode":\#(episode)}"#,
                        "https://127.0.0.1:\(provided.port)/3/device/\(provided.deviceToken)"], timeout: .seconds(20))
    }

    /// One library's answer to one request.
    struct Answer: Decodable, CustomStringConvertible {
        var status: Int?
        var reason: String?
        var apns_id: String?
        var error: String?
        var description: String { "status \(status.map(String.init) ?? "-") reason \(reason ?? "-") apns-id \(apns_id ?? "-") error \(error ?? "-")" }
    }

    /// The requests through `Tests/Interop/apns_provider.py LIBRARY`, the answers in order.
    static func send(_ library: String, _ provided: Provided, _ requests: [[String: Any]]) throws -> [Answer] {
        let spec: [String: Any] = ["host": "127.0.0.1", "port": provided.port, "ca": provided.tls.ca, "requests": requests]
        let specFile = provided.scratch.url.appendingPathComponent("spec-\(library).json")
        try JSONSerialization.data(withJSONObject: spec).write(to: specFile)
        let result = try runCommand([ProviderLibraries.python, ProviderLibraries.interop.appendingPathComponent("apns_provider.py").path,
                                     library, specFile.path], timeout: .seconds(120))
        try #require(result.status == 0, "\(library) driver exited \(result.status): \(result.stderr)")
        let answers = try result.stdout.split(separator: "\n").map { try JSONDecoder().decode(Answer.self, from: Data($0.utf8)) }
        try #require(answers.count == requests.count, "\(library): \(answers.count) answers to \(requests.count) requests: \(result.stdout) \(result.stderr)")
        return answers
    }

    /// The record of the launch a push was delivered in (bounded wait).
    static func deliveredRecord(_ host: HostProcess, pushID: String) throws -> RunRecord {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let record = (try host.send(.history(limit: 100)).records ?? []).first(where: { $0.push?.id == pushID }) {
                return record
            }
            usleep(50_000)
        }
        throw HostTestError("no launch delivered push \(pushID)")
    }

    @Test(.enabled(if: ProviderLibraries.runnable), arguments: ["aioapns", "kalyke", "pyapns_client"])
    func aProviderLibraryDeliversAndGetsAPNsErrors(library: String) throws {
        try ProviderLibraries.require()
        let scratch = try Scratch()
        defer { scratch.remove() }
        let provided = try Self.providedHost(scratch)
        defer { _ = provided.host.stop() }
        func request(episode: Int, id: String? = nil, token: String? = nil, topic: String = Self.app, key: String? = nil,
                     team: String = Self.team, padding: Int = 0) -> [String: Any] {
            var payload: [String: Any] = ["aps": ["content-available": 1], "episode": episode]
            if padding > 0 { payload["padding"] = String(repeating: "x", count: padding) }
            var request: [String: Any] = ["token": token ?? provided.deviceToken, "topic": topic, "payload": payload,
                                          "key": key ?? provided.keyFile, "key_id": Self.keyID, "team": team,
                                          "push_type": "background", "priority": 5]
            if let id { request["apns_id"] = id }
            return request
        }
        // Lower case, as most libraries write UUIDs: it must come back exactly so.
        let id = UUID().uuidString.lowercased()
        let answers = try Self.send(library, provided, [
            request(episode: 100, id: id),
            request(episode: 100, id: id),  // a retry of the same push
            request(episode: 101),  // no apns-id from kalyke and pyapns_client: the host makes one
            request(episode: 102, token: String(repeating: "0", count: 64)),
            request(episode: 103, topic: "com.example.other"),
            request(episode: 104, team: "OTHERTEAM0"),
            request(episode: 105, key: provided.strangerKeyFile),
            request(episode: 106, padding: 5000),
        ])
        let context = "\(library): \(answers)"
        #expect(answers.allSatisfy { $0.error == nil }, "\(context)")
        #expect(answers[0].status == 200 && answers[0].apns_id == id, "\(context)")
        #expect(answers[1].status == 200 && answers[1].apns_id == id, "the retry: \(context)")
        #expect(answers[2].status == 200, "\(context)")
        if let made = answers[2].apns_id, library != "aioapns" {
            // Made by the host as APNs makes it: a canonical upper-case UUID, not all zeros.
            #expect(made.range(of: #"^[0-9A-F]{8}-[0-9A-F]{4}-4[0-9A-F]{3}-[89AB][0-9A-F]{3}-[0-9A-F]{12}$"#, options: .regularExpression) != nil, "\(made)")
        }
        #expect(answers[2].apns_id != nil, "\(context)")
        let expected: [(Int, String)] = [(400, "BadDeviceToken"), (400, "DeviceTokenNotForTopic"), (403, "InvalidProviderToken"),
                                          (403, "InvalidProviderToken"), (413, "PayloadTooLarge")]
        for (answer, (status, reason)) in zip(answers[3...], expected) {
            // kalyke-apns raises the reason's exception without the status.
            #expect(answer.reason == reason && (answer.status == nil || answer.status == status), "\(reason): \(context)")
        }
        // Delivered once, to the app delegate, with the payload the library sent.
        let record = try Self.deliveredRecord(provided.host, pushID: id.uppercased())
        #expect(record.reason == "remote-notification" && record.push?.result == "new-data", "\(record)")
        #expect(try record.logText().contains("pushapp: push episode 100"))
        let pushes = try provided.host.send(.pushes(app: Self.app)).pushes ?? []
        #expect(pushes.filter { $0.id == id.uppercased() }.count == 1, "\(pushes.map(\.id))")
        // Every refusal is in the host's log with its reason.
        let log = (try? String(contentsOfFile: provided.host.logPath, encoding: .utf8)) ?? ""
        for reason in ["BadDeviceToken", "DeviceTokenNotForTopic", "InvalidProviderToken", "PayloadTooLarge"] {
            #expect(log.contains("apns.reason=\(reason)") || log.contains("\"apns.reason\":\"\(reason)\""), "\(reason) not logged:\n\(log.suffix(3000))")
        }
    }

    /// curl (nghttp2) with the CA trusted, token auth: the success answer is HEADERS with
    /// END_STREAM and no body, the apns-id comes back as sent, a retry is accepted.
    @Test func curlWithTokenAuthOverVerifiedTLS() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let provided = try Self.providedHost(scratch)
        defer { _ = provided.host.stop() }
        let id = UUID().uuidString.lowercased()
        func post() throws -> CLIResult { try Self.curlPush(provided, id: id, episode: 120) }
        for attempt in ["first", "retry"] {
            let result = try post()
            #expect(result.status == 0, "\(attempt): \(result.stderr)")
            let lines = result.stdout.components(separatedBy: "\r\n")
            #expect(lines.first?.hasPrefix("HTTP/2 200") == true, "\(attempt): \(result.stdout)")
            #expect(lines.contains("apns-id: \(id)"), "\(attempt): \(result.stdout)")
            // No body after the blank line that ends the headers.
            #expect(result.stdout.hasSuffix("\r\n\r\n"), "\(attempt): \(result.stdout.debugDescription)")
        }
        let record = try Self.deliveredRecord(provided.host, pushID: id.uppercased())
        #expect(record.push?.result == "new-data")
    }
}

extension APNsInteropTests {
    /// A push written frame by frame: the header block over HEADERS and two CONTINUATION frames,
    /// the authority as `host` (no `:authority`), headers in an unusual order. Before, the
    /// stream was reset (RST_STREAM CANCEL) with nothing logged; now it is delivered, and the
    /// answer is HEADERS with END_STREAM and no DATA frame, the apns-id as sent.
    @Test(.enabled(if: ProviderLibraries.runnable)) func continuationFramesAndAHostHeaderAreTaken() throws {
        try ProviderLibraries.require()
        let scratch = try Scratch()
        defer { scratch.remove() }
        let provided = try Self.providedHost(scratch)
        defer { _ = provided.host.stop() }
        let id = UUID().uuidString.lowercased()
        let result = try runCommand([ProviderLibraries.python, ProviderLibraries.interop.appendingPathComponent("raw_h2_push.py").path,
                                     "127.0.0.1", "\(provided.port)", provided.tls.ca, provided.deviceToken, Self.app, id,
                                     "bearer \(try Self.providerToken(provided))"], timeout: .seconds(30))
        try #require(result.status == 0, "\(result.stderr)")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result.stdout)")
        #expect(answer["status"] as? Int == 200 && answer["apns_id"] as? String == id, "\(answer)")
        #expect(answer["headers_end_stream"] as? Bool == true && answer["data_frames"] as? Int == 0, "\(answer)")
        let record = try Self.deliveredRecord(provided.host, pushID: id.uppercased())
        #expect(try record.logText().contains("pushapp: push episode 140"))
    }
}

/// The endpoint under a connection flood: idle TCP connections by the thousand, as a hostile
/// local process or a port scan makes them. The host keeps its descriptors (the cap), closes
/// idle connections (the handshake and idle timeouts) and serves the control socket and a
/// provider's push meanwhile.
@Suite struct APNsEndpointBoundsTests {
    /// Descriptors the process holds now.
    static func openDescriptors(_ pid: pid_t) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).count
    }

    @Test func aFloodOfIdleConnectionsIsCappedAndTimedOut() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let cap = 64
        let provided = try APNsInteropTests.providedHost(scratch, extra: [
            "--apns-max-connections", "\(cap)", "--apns-handshake-timeout", "1s", "--apns-idle-timeout", "2s",
        ])
        defer { _ = provided.host.stop() }
        let pid = provided.host.pid
        // The descriptors a systemd unit gives (LimitNOFILE=1024), as the issue measured.
        let limited = try runCommand(["/usr/bin/prlimit", "--pid", "\(pid)", "--nofile=1024:1024"])
        try #require(limited.status == 0, "prlimit: \(limited.stderr)")
        let baseline = Self.openDescriptors(pid)

        // This process holds the attacker's sockets: room for them.
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        let wanted: rlim_t = 4096
        if limit.rlim_cur < wanted {
            limit.rlim_cur = min(wanted, limit.rlim_max)
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        let flood = 1100, deadline = Date().addingTimeInterval(20)
        var sockets: [Int32] = []
        defer { sockets.forEach { close($0) } }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(provided.port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var peak = baseline
        while sockets.count < flood && Date() < deadline {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { break }
            _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            sockets.append(fd)
            // The host's accept queue is 64 deep: let it accept as the flood goes.
            if sockets.count % 50 == 0 {
                usleep(20_000)
                peak = max(peak, Self.openDescriptors(pid))
            }
        }
        #expect(sockets.count == flood, "only \(sockets.count) connections opened by the deadline")
        // Meanwhile (the attacker still holds every socket): the host's descriptors stay under
        // the cap plus its own, the control socket answers, and a provider's push goes through
        // once the handshake timeout has freed the slots.
        for _ in 0..<10 {
            peak = max(peak, Self.openDescriptors(pid))
            usleep(100_000)
        }
        #expect(peak <= baseline + cap + 16, "the host held \(peak) descriptors (baseline \(baseline), cap \(cap))")
        #expect(try provided.host.send(.status).ok == true)
        let id = UUID().uuidString
        var pushed = false
        let pushDeadline = Date().addingTimeInterval(15)
        while !pushed && Date() < pushDeadline {
            let answer = try APNsInteropTests.curlPush(provided, id: id, episode: 130)
            pushed = answer.status == 0 && answer.stdout.hasPrefix("HTTP/2 200")
            if !pushed { usleep(300_000) }
        }
        #expect(pushed, "no push went through while the flood's sockets were held")
        // The handshake timeout has closed every flood connection the host took: back to its own.
        let settled = Date().addingTimeInterval(10)
        var now = Self.openDescriptors(pid)
        while now > baseline + 8 && Date() < settled {
            usleep(100_000)
            now = Self.openDescriptors(pid)
        }
        #expect(now <= baseline + 8, "the host still holds \(now) descriptors (baseline \(baseline))")
        let log = (try? String(contentsOfFile: provided.host.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("APNs connection refused: over the connection cap"), "\(log.suffix(2000))")
        #expect(log.contains("TLS handshake not finished in time"), "\(log.suffix(2000))")
        #expect(processExists(pid))
    }

    /// A connection that finished its TLS handshake and HTTP/2 preface but opens no stream is
    /// closed after the idle timeout (2 s here), not held; one that opens a stream and never
    /// ends its request has the stream reset after the request timeout (1 s), then is closed
    /// as idle.
    @Test(.enabled(if: ProviderLibraries.runnable)) func idleConnectionsAndStalledStreamsAreClosed() throws {
        try ProviderLibraries.require()
        let scratch = try Scratch()
        defer { scratch.remove() }
        let provided = try APNsInteropTests.providedHost(scratch, extra: ["--apns-idle-timeout", "2s", "--apns-request-timeout", "1s"])
        defer { _ = provided.host.stop() }
        func hold(_ mode: String) throws -> (reset: Double?, closed: Double?) {
            let result = try runCommand([ProviderLibraries.python, ProviderLibraries.interop.appendingPathComponent("idle_connection.py").path,
                                         "127.0.0.1", "\(provided.port)", provided.tls.ca, "10", mode], timeout: .seconds(30))
            try #require(result.status == 0, "\(mode): \(result.stderr)")
            let answer = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result.stdout)")
            return ((answer["reset"] as? NSNumber)?.doubleValue, (answer["closed"] as? NSNumber)?.doubleValue)
        }
        let idle = try hold("idle")
        #expect(idle.reset == nil && idle.closed.map { $0 >= 1.8 && $0 < 5 } == true, "idle: \(idle)")
        let stalled = try hold("stalled")
        #expect(stalled.reset.map { $0 >= 0.8 && $0 < 3 } == true, "stalled: \(stalled)")
        #expect(stalled.closed.map { $0 >= 2.8 && $0 < 7 } == true, "stalled: \(stalled)")
        let log = (try? String(contentsOfFile: provided.host.logPath, encoding: .utf8)) ?? ""
        #expect(log.contains("the request did not end in time") && log.contains("no open stream for the idle timeout"), "\(log.suffix(2000))")
    }
}

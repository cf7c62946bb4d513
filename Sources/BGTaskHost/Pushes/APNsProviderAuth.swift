import BGTaskControl
import Crypto
import Foundation

/// Token-based provider authentication, as APNs checks it: every request carries
/// `authorization: bearer JWT`, an ES256 JSON Web Token whose header names the signing key
/// (`kid`) and whose claims name the team (`iss`) and when it was made (`iat`). The host knows
/// the keys it accepts (`bgtask host --apns-auth-key KEY_ID:FILE`, the provider's `.p8` file or
/// its public key) and, optionally, the team (`--apns-team-id`). Without keys the endpoint
/// accepts every request, as before (it listens on loopback by default).
///
/// The answers are APNs's: 403 `MissingProviderToken`, 403 `InvalidProviderToken` (not a JWT,
/// not ES256, an unknown key, another team, a signature that does not verify, a date in the
/// future), 403 `ExpiredProviderToken` (made more than an hour ago). `iat` is taken as a number
/// or a numeric string, as APNs takes it.
// Immutable after init; swift-crypto's key type does not declare Sendable.
struct APNsProviderAuth: @unchecked Sendable {
    /// The accepted keys by key identifier.
    let keys: [String: P256.Signing.PublicKey]
    let teamID: String?
    /// How long a token stays valid (APNs: one hour).
    static let tokenLifetime: TimeInterval = 3600
    /// How far in the future a token's date may be (clocks differ a little).
    static let clockSkew: TimeInterval = 60

    /// Reads each key file (a PKCS#8 private key, as Apple hands out `.p8` files, or a public
    /// key, both PEM); errors name the key and the file.
    init(keyFiles: [String: String], teamID: String?) throws(BGTaskError) {
        var keys: [String: P256.Signing.PublicKey] = [:]
        for (keyID, path) in keyFiles {
            let pem: String
            do { pem = try String(contentsOfFile: path, encoding: .utf8) } catch {
                throw BGTaskError(.system, file: path, "--apns-auth-key \(keyID): cannot read \(path): \(error.localizedDescription)")
            }
            if let key = try? P256.Signing.PrivateKey(pemRepresentation: pem) {
                keys[keyID] = key.publicKey
            } else if let key = try? P256.Signing.PublicKey(pemRepresentation: pem) {
                keys[keyID] = key
            } else {
                throw BGTaskError(.outOfRange, file: path, "--apns-auth-key \(keyID): \(path) holds no P-256 key in PEM (a .p8 private key or a public key)")
            }
        }
        self.keys = keys
        self.teamID = teamID
    }

    /// APNs's reason, and why (for the host's log: APNs's answer carries the reason alone).
    struct Refusal: Error, Equatable {
        enum Reason: String, Equatable {
            case missing = "MissingProviderToken"
            case invalid = "InvalidProviderToken"
            case expired = "ExpiredProviderToken"
        }
        var reason: Reason
        var why: String
        init(_ reason: Reason, _ why: String) {
            self.reason = reason
            self.why = why
        }
    }

    /// Nil when the request may go on; otherwise APNs's reason (status 403) and why.
    func check(authorization: String?, now: Date = Date()) -> Refusal? {
        guard let authorization, !authorization.isEmpty else { return Refusal(.missing, "no authorization header") }
        let words = authorization.split(separator: " ", maxSplits: 1)
        guard words.count == 2, words[0].lowercased() == "bearer" else { return Refusal(.invalid, "authorization is not 'bearer TOKEN'") }
        let parts = words[1].split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, words[1].utf8.count <= 4096,
              let headerData = Self.base64URL(parts[0]), let claimsData = Self.base64URL(parts[1]),
              let signatureData = Self.base64URL(parts[2]),
              let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
              let claims = try? JSONSerialization.jsonObject(with: claimsData) as? [String: Any] else {
            return Refusal(.invalid, "the token is not a JWT (three base64url parts, JSON header and claims, at most 4096 bytes)")
        }
        guard header["alg"] as? String == "ES256" else { return Refusal(.invalid, "the token's alg is not ES256") }
        guard let keyID = header["kid"] as? String, let key = keys[keyID] else {
            return Refusal(.invalid, "the token's kid '\(String(describing: header["kid"] ?? "none").prefix(64))' is not a key the host accepts")
        }
        if let teamID, claims["iss"] as? String != teamID {
            return Refusal(.invalid, "the token's iss '\(String(describing: claims["iss"] ?? "none").prefix(64))' is not team \(teamID)")
        }
        guard let issued = Self.issuedAt(claims["iat"]) else { return Refusal(.invalid, "the token's iat is not a number of seconds") }
        guard let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureData),
              key.isValidSignature(signature, for: Data("\(parts[0]).\(parts[1])".utf8)) else {
            return Refusal(.invalid, "the token's signature does not verify with key \(keyID)")
        }
        let age = now.timeIntervalSince1970 - issued
        if age < -Self.clockSkew { return Refusal(.invalid, "the token's iat is \(Int(-age)) s in the future") }
        if age > Self.tokenLifetime { return Refusal(.expired, "the token was made \(Int(age)) s ago, over \(Int(Self.tokenLifetime))") }
        return nil
    }

    /// `iat` as APNs takes it: seconds since 1970 as a JSON number, or as a string of digits
    /// (kalyke-apns, among others, sends `"iat": "1700000000"`). Nil for anything else.
    static func issuedAt(_ value: Any?) -> Double? {
        if let string = value as? String {
            guard !string.isEmpty, string.utf8.count <= 20, string.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
            return Double(string)
        }
        return (value as? NSNumber)?.doubleValue
    }

    /// base64url without padding (RFC 7515), or nil.
    static func base64URL(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("=") else { return nil }
        while base64.utf8.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }
}

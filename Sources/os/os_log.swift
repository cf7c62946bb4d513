import Foundation

/// `os_log` with a printf-style format (Apple's, iOS 10): `%d`, `%@`, `%s`, `%.2f`, ... with
/// the privacy specifiers `%{public}@`, `%{private}d`, `%{sensitive}@` and masks
/// (`%{private, mask.hash}@`). As on Apple's systems, strings and objects (`%@`, `%s`) are
/// private unless marked public, scalars public unless marked private.
public func os_log(_ message: StaticString, dso: UnsafeRawPointer? = #dsohandle, log: OSLog = .default,
                   type: OSLogType = .default, _ args: CVarArg...) {
    guard log.enabled else { return }
    UnifiedLogSink.emit(type, log: log, LogFormat.render(message.description, args, keepingPrivate: UnifiedLogSink.keepsPrivateValues))
}

/// `os_log` with the type first (Apple's, iOS 12).
public func os_log(_ type: OSLogType, dso: UnsafeRawPointer = #dsohandle, log: OSLog = .default,
                   _ message: StaticString, _ args: CVarArg...) {
    guard log.enabled else { return }
    UnifiedLogSink.emit(type, log: log, LogFormat.render(message.description, args, keepingPrivate: UnifiedLogSink.keepsPrivateValues))
}

/// `os_log` with an interpolated message (Apple's, iOS 14), as `Logger` takes.
public func os_log(_ logLevel: OSLogType, dso: UnsafeRawPointer = #dsohandle, log logObject: OSLog = .default,
                   _ message: OSLogMessage) {
    guard logObject.enabled else { return }
    UnifiedLogSink.emit(logLevel, log: logObject, message.rendered(keepingPrivate: UnifiedLogSink.keepsPrivateValues))
}

/// The printf-style formats of `os_log` and `os_signpost`: each conversion is formatted with
/// `String(format:)` on its own argument, after its privacy specifier is read and removed.
package enum LogFormat {
    package static func render(_ format: String, _ args: [CVarArg], keepingPrivate: Bool) -> String {
        var output = ""
        var next = args.makeIterator()
        var characters = Array(format)
        var index = 0
        characters.append("\0") // a sentinel: no bounds checks below
        while index < characters.count - 1 {
            let character = characters[index]
            guard character == "%" else {
                output.append(character)
                index += 1
                continue
            }
            index += 1
            if characters[index] == "%" {
                output.append("%")
                index += 1
                continue
            }
            // %{public, mask.hash}
            var privacy = OSLogPrivacy.auto
            var annotations: [String] = []
            if characters[index] == "{" {
                var text = ""
                index += 1
                while characters[index] != "}" && characters[index] != "\0" {
                    text.append(characters[index])
                    index += 1
                }
                if characters[index] == "}" { index += 1 }
                annotations = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                let hashed = annotations.contains("mask.hash")
                if annotations.contains("public") {
                    privacy = .public
                } else if annotations.contains("private") {
                    privacy = .private(mask: hashed ? .hash : .none)
                } else if annotations.contains("sensitive") {
                    privacy = .sensitive(mask: hashed ? .hash : .none)
                } else if hashed {
                    privacy = .auto(mask: .hash)
                }
            }
            // Flags, width, precision, length, conversion.
            var spec = "%"
            while "-+ #0'".contains(characters[index]) {
                spec.append(characters[index])
                index += 1
            }
            func number() {
                if characters[index] == "*" {
                    let value = next.next().flatMap { ($0 as? Int) ?? ($0 as? Int32).map(Int.init) } ?? 0
                    spec += String(value)
                    index += 1
                    return
                }
                while characters[index].isASCII && characters[index].isNumber {
                    spec.append(characters[index])
                    index += 1
                }
            }
            number()
            if characters[index] == "." {
                spec.append(".")
                index += 1
                number()
            }
            var length = ""
            while "hlqjztL".contains(characters[index]) {
                length.append(characters[index])
                index += 1
            }
            let conversion = characters[index]
            guard conversion != "\0" else {
                output += spec
                break
            }
            index += 1
            let scalar = !"@sS".contains(conversion)
            guard let argument = next.next() else {
                output += "<missing>"
                continue
            }
            let text: String
            if annotations.contains("bool") || annotations.contains("BOOL") {
                let truth = (argument as? Bool) ?? ((argument as? any BinaryInteger).map { Self.isNonZero($0) } ?? false)
                text = annotations.contains("bool") ? (truth ? "true" : "false") : (truth ? "YES" : "NO")
            } else if conversion == "@" || ((conversion == "s" || conversion == "S") && argument is String) {
                let value = (argument as? String) ?? (argument as? CustomStringConvertible)?.description ?? "\(argument)"
                text = String(format: spec + "@", value)
            } else {
                text = String(format: spec + length + String(conversion), argument)
            }
            output += privacy.redacts(scalar: scalar, keepingPrivate: keepingPrivate) ? privacy.redaction(of: text) : text
        }
        return output
    }

    private static func isNonZero<T: BinaryInteger>(_ value: T) -> Bool { value != 0 }
}

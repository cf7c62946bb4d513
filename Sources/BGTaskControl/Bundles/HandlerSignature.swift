import BGTaskModel
import Foundation

/// Parses the C signatures of `BGTaskHandlers` entries:
/// `symbol(argument, argument, ...) -> result`, arguments from `MappedHandler.Argument`
/// (`identifier`, `task`, `task_id`, `type`, `data_directory`, `api`, `host`, `complete`),
/// result `void`, `bool` or `int` (omitted means `void`).
public enum HandlerSignature {
    public struct ParseError: Error, CustomStringConvertible {
        public var description: String

        /// The memberwise initializer, for the modules above this one.
        package init(description: String) {
            self.description = description
        }
    }

    public static func parse(_ text: String, identifier: String) throws(ParseError) -> MappedHandler {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let open = trimmed.firstIndex(of: "("), let close = trimmed.lastIndex(of: ")"), open < close else {
            throw ParseError(description: "'\(text)' is not a signature like \"feed_refresh(identifier, data_directory) -> bool\"")
        }
        let symbol = trimmed[..<open].trimmingCharacters(in: .whitespaces)
        guard let first = symbol.unicodeScalars.first, first == "_" || (first.properties.isAlphabetic && first.isASCII),
              symbol.unicodeScalars.allSatisfy({ $0 == "_" || ($0.isASCII && $0.properties.isAlphabetic) || ("0"..."9").contains($0) })
        else {
            throw ParseError(description: "'\(symbol)' is not a C symbol name")
        }
        let inside = trimmed[trimmed.index(after: open)..<close].trimmingCharacters(in: .whitespacesAndNewlines)
        var arguments: [MappedHandler.Argument] = []
        if !inside.isEmpty && inside != "void" {
            for part in inside.split(separator: ",", omittingEmptySubsequences: false) {
                let name = part.trimmingCharacters(in: .whitespacesAndNewlines)
                guard !name.isEmpty else {
                    throw ParseError(description: "empty argument in '\(text)' (a stray comma?)")
                }
                guard let argument = MappedHandler.Argument(rawValue: name) else {
                    let known = MappedHandler.Argument.allCases.map(\.rawValue).joined(separator: ", ")
                    throw ParseError(description: "unknown argument '\(name)' in '\(text)' (known: \(known))")
                }
                arguments.append(argument)
            }
        }
        let rest = trimmed[trimmed.index(after: close)...].trimmingCharacters(in: .whitespacesAndNewlines)
        var result = MappedHandler.Result.void
        if !rest.isEmpty {
            guard rest.hasPrefix("->") else {
                throw ParseError(description: "expected '-> void|bool|int' after the arguments in '\(text)'")
            }
            let name = rest.dropFirst(2).trimmingCharacters(in: .whitespacesAndNewlines)
            guard let parsed = MappedHandler.Result(rawValue: name) else {
                throw ParseError(description: "unknown result type '\(name)' in '\(text)' (known: void, bool, int)")
            }
            result = parsed
        }
        if result == .void && !arguments.contains(.complete) && !(arguments.contains(.api) && (arguments.contains(.taskID) || arguments.contains(.task))) {
            throw ParseError(description: "'\(text)' returns void but takes no way to complete its task: add a 'complete' argument, or return bool or int")
        }
        return MappedHandler(identifier: identifier, symbol: symbol, arguments: arguments, result: result)
    }
}


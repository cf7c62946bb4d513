@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Testing

/// Parses `text`, expecting a ParseError whose description contains every one of `mentions`.
private func expectParseError(
    _ text: String, mentions words: [String], sourceLocation: SourceLocation = #_sourceLocation
) {
    do throws(HandlerSignature.ParseError) {
        let parsed = try HandlerSignature.parse(text, identifier: "com.example.app.task")
        Issue.record("expected '\(text)' to be rejected, parsed \(parsed)", sourceLocation: sourceLocation)
    } catch let error {
        for word in words {
            #expect(error.description.contains(word), "'\(word)' missing from: \(error.description)", sourceLocation: sourceLocation)
        }
    }
}

@Suite struct HandlerSignatureTests {
    // MARK: Accepted

    @Test func everyArgumentKind() throws {
        let handler = try HandlerSignature.parse(
            "run_all(identifier, task, task_id, type, data_directory, api, host, complete)", identifier: "com.example.app.all")
        #expect(handler == MappedHandler(
            identifier: "com.example.app.all", symbol: "run_all",
            arguments: [.identifier, .task, .taskID, .type, .dataDirectory, .api, .host, .complete], result: .void))
        #expect(Set(handler.arguments) == Set(MappedHandler.Argument.allCases))
    }

    @Test(arguments: MappedHandler.Argument.allCases)
    func eachArgumentAlone(_ argument: MappedHandler.Argument) throws {
        let handler = try HandlerSignature.parse("handler(\(argument.rawValue)) -> bool", identifier: "com.example.app.x")
        #expect(handler.symbol == "handler")
        #expect(handler.arguments == [argument])
        #expect(handler.result == .bool)
        #expect(handler.identifier == "com.example.app.x")
    }

    @Test func argumentOrderIsKeptAndRepeatsAllowed() throws {
        let handler = try HandlerSignature.parse("f(host, api, identifier, api) -> int", identifier: "com.example.app.x")
        #expect(handler.arguments == [.host, .api, .identifier, .api])
    }

    @Test(arguments: [
        ("f(identifier) -> bool", MappedHandler.Result.bool),
        ("f(identifier) -> int", .int),
        ("f(identifier, complete) -> void", .void),
        ("f(identifier, complete)", .void),
    ])
    func results(_ text: String, result: MappedHandler.Result) throws {
        let handler = try HandlerSignature.parse(text, identifier: "com.example.app.x")
        #expect(handler.result == result)
        #expect(handler.symbol == "f")
    }

    @Test(arguments: [
        "feed_refresh(identifier, data_directory) -> bool",
        "feed_refresh(identifier,data_directory)->bool",
        "  feed_refresh  (  identifier  ,  data_directory  )  ->  bool  ",
        "\tfeed_refresh\t(\tidentifier,\tdata_directory\t)\t->\tbool\t",
        "feed_refresh( identifier ,data_directory)-> bool",
    ])
    func whitespaceVariations(_ text: String) throws {
        let handler = try HandlerSignature.parse(text, identifier: "com.example.feed.refresh")
        #expect(handler == MappedHandler(
            identifier: "com.example.feed.refresh", symbol: "feed_refresh",
            arguments: [.identifier, .dataDirectory], result: .bool))
    }

    @Test(arguments: ["f(void) -> int", "f() -> int", "f( ) -> int", "f( void ) -> int"])
    func noArguments(_ text: String) throws {
        let handler = try HandlerSignature.parse(text, identifier: "com.example.app.x")
        #expect(handler.symbol == "f")
        #expect(handler.arguments.isEmpty)
        #expect(handler.result == .int)
    }

    @Test(arguments: ["_f", "__bgtask_run", "Feed2Refresh", "a_1_b", "Z"])
    func symbolNames(_ symbol: String) throws {
        let handler = try HandlerSignature.parse("\(symbol)(identifier) -> bool", identifier: "com.example.app.x")
        #expect(handler.symbol == symbol)
    }

    /// A void handler may complete through the host api with its task (`task` or `task_id`).
    @Test(arguments: ["f(api, task_id)", "f(task, api) -> void", "f(complete)"])
    func voidWithAWayToComplete(_ text: String) throws {
        #expect(try HandlerSignature.parse(text, identifier: "com.example.app.x").result == .void)
    }

    // MARK: Rejected

    @Test(arguments: ["f", "f identifier -> bool", "f(identifier -> bool", "f identifier) -> bool", "f)identifier( -> bool", ""])
    func missingParentheses(_ text: String) {
        expectParseError(text, mentions: ["'\(text)'", "not a signature"])
    }

    @Test(arguments: ["9f", "my-func", "f.g", "f g", "caf\u{E9}", "\u{3B1}beta", "f$", "f*"])
    func badSymbolNames(_ symbol: String) {
        expectParseError("\(symbol)(identifier) -> bool", mentions: ["'\(symbol)'", "not a C symbol name"])
    }

    @Test func emptySymbolName() {
        expectParseError("(identifier) -> bool", mentions: ["not a C symbol name"])
    }

    @Test(arguments: ["context", "Identifier", "task id", "data-directory", "const char *identifier", "void"])
    func unknownArgument(_ name: String) {
        let text = "f(identifier, \(name)) -> bool"
        let known = MappedHandler.Argument.allCases.map(\.rawValue)
        #expect(known == ["identifier", "task", "task_id", "type", "data_directory", "api", "host", "complete"])
        expectParseError(text, mentions: ["unknown argument '\(name)'", "'\(text)'", "known: " + known.joined(separator: ", ")])
    }

    @Test(arguments: ["float", "Bool", "bool int", "int32_t", "", "*"])
    func unknownResult(_ name: String) {
        expectParseError("f(identifier) -> \(name)", mentions: ["unknown result type '\(name)'", "known: void, bool, int"])
    }

    @Test(arguments: ["f(identifier) bool", "f(identifier) => bool", "f(identifier) - > bool", "f(identifier): bool"])
    func missingArrow(_ text: String) {
        expectParseError(text, mentions: ["expected '-> void|bool|int'", "'\(text)'"])
    }

    @Test(arguments: ["f(identifier)", "f(identifier) -> void", "f(api)", "f(task_id)", "f(void)", "f()"])
    func voidWithoutAWayToComplete(_ text: String) {
        expectParseError(text, mentions: ["'\(text)'", "returns void", "complete"])
    }

    /// An empty argument (a stray comma) is a typo in C, not an argument to drop.
    @Test(arguments: ["f(identifier,) -> bool", "f(, identifier) -> bool", "f(identifier,, task) -> bool", "f(,) -> bool"])
    func emptyArgumentIsRejected(_ text: String) {
        expectParseError(text, mentions: ["'\(text)'", "empty argument"])
    }
}

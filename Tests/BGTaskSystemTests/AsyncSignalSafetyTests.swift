import Foundation
import Glibc
import Testing
import _BGTaskSystemShims

/// What may run after fork (docs/isolation.md, "After fork") is written down next to each
/// function, in a fixed form (`Async-signal-safe: yes`, or `Async-signal-safe: no — why`), and
/// these tests keep it there: every function the C shims' header declares, every function of
/// namespace.c (whose outer and init processes share the zygote's memory), the shims that a
/// zygote's child calls, and the runner's Swift functions that run in a zygote's child or as a
/// spawned runner enters its namespace. A new declaration without a marker fails here.
struct AsyncSignalSafetyTests {
    /// The repository, from this file's path (Tests/BGTaskSystemTests/<this file>).
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func source(_ path: String) throws -> String {
        try String(contentsOf: repository.appendingPathComponent(path), encoding: .utf8)
    }

    /// The shims' C functions (definitions in the .c files) that run in a child after a clone, or
    /// in the zygote around it, beyond namespace.c (all of whose functions are checked).
    static let afterForkShims: [(file: String, functions: [String])] = [
        ("Sources/_BGTaskSystemShims/shims.c", [
            "bgtask_clone_parent", "bgtask_reset_signals", "bgtask_note_signal_actions", "bgtask_thread_count",
            "bgtask_close_from", "bgtask_close_from_except", "bgtask_open_descriptors", "bgtask_send_fds",
            "bgtask_recv_fds", "bgtask_monotonic_ns", "bgtask_pidfd_open", "bgtask_set_process_title",
            "bgtask_resolve_foundation_hooks", "bgtask_set_main_executable",
        ]),
        ("Sources/_BGTaskSystemShims/sandbox.c", [
            "bgtask_landlock_abi", "bgtask_landlock_create", "bgtask_landlock_allow", "add_rule",
            "bgtask_loaded_library_directories",
        ]),
    ]

    /// The runner's Swift functions marked: what a zygote's child (spare or direct launch) runs
    /// from the clone's return to main.swift, and a spawned runner's namespace.
    static let markedSwift: [(file: String, functions: [String])] = [
        ("Sources/bgtask-runner/ZygoteServer.swift", [
            "serve", "forkSpare", "receiveRequest", "rehearse", "rehearseMainThread", "rehearseSymbolLookups",
            "exerciseChildSide", "cloneLaunch", "becomeLaunch",
        ]),
        ("Sources/bgtask-runner/Sandbox.swift", [
            "prepareRuleset", "findLibraryDirectories", "checkNamespaces", "notePidNamespace", "enterPidNamespace",
        ]),
    ]

    @Test func everyFunctionTheShimsHeaderDeclaresIsMarked() throws {
        let declarations = CFunctions.parse(try Self.source("Sources/_BGTaskSystemShims/include/bgtask_system_shims.h"))
        // The parser found the header's functions (not an empty list that proves nothing).
        #expect(declarations.count >= 40, "\(declarations.map(\.name))")
        for expected in ["bgtask_spawn", "bgtask_clone_parent", "bgtask_clone_parent_namespaced", "bgtask_recv_fds"] {
            #expect(declarations.contains { $0.name == expected && !$0.isDefinition }, "\(expected) not found")
        }
        for declaration in declarations {
            #expect(Marker.isPresent(in: declaration.comments),
                    "bgtask_system_shims.h: \(declaration.name) has no `Async-signal-safe: yes` or `Async-signal-safe: no — why` comment of its own above it")
        }
    }

    @Test func everyFunctionOfTheNamespaceMachineryIsMarked() throws {
        let definitions = CFunctions.parse(try Self.source("Sources/_BGTaskSystemShims/namespace.c")).filter(\.isDefinition)
        for expected in ["raw6", "raw_exit", "init_main", "serve_as_init", "outer_main", "mirror", "start_init", "enter"] {
            #expect(definitions.contains { $0.name == expected }, "namespace.c: \(expected) not found")
        }
        for definition in definitions {
            #expect(Marker.isPresent(in: definition.comments), "namespace.c: \(definition.name) has no Async-signal-safe marker above it")
        }
    }

    @Test func theShimsAZygotesChildCallsAreMarkedWhereTheyAreDefined() throws {
        for (file, functions) in Self.afterForkShims {
            let definitions = CFunctions.parse(try Self.source(file)).filter(\.isDefinition)
            for name in functions {
                let found = definitions.filter { $0.name == name }
                #expect(found.count == 1, "\(file): \(name) is defined \(found.count) times")
                if let definition = found.first {
                    #expect(Marker.isPresent(in: definition.comments), "\(file): \(name) has no Async-signal-safe marker above it")
                }
            }
        }
    }

    @Test func theRunnersSwiftAfterForkIsMarked() throws {
        for (file, functions) in Self.markedSwift {
            let lines = try Self.source(file).components(separatedBy: "\n")
            for name in functions {
                let at = lines.indices.filter { lines[$0].contains("func \(name)(") || lines[$0].contains("func \(name)<") }
                #expect(at.count == 1, "\(file): func \(name) found \(at.count) times")
                guard let line = at.first else { continue }
                // The `///` block right above the declaration (attributes may sit between).
                var comment: [String] = []
                var above = line - 1
                while above >= 0 {
                    let text = lines[above].trimmingCharacters(in: .whitespaces)
                    if text.hasPrefix("///") {
                        comment.append(text)
                    } else if !text.hasPrefix("@") {
                        break
                    }
                    above -= 1
                }
                #expect(Marker.isPresent(in: comment), "\(file): \(name) has no `/// Async-signal-safe: ...` line above it")
            }
        }
    }

    /// The parser itself: a declaration's marker must be its own, not its neighbour's.
    @Test func aMarkerCountsOnlyForTheDeclarationRightBelowIt() {
        let parsed = CFunctions.parse("""
            /* Two functions.
             * Async-signal-safe: yes */
            int first(void);
            int second(int a, /* ; ) */ const char *b);
            /* Async-signal-safe: no — locks; why that is fine */
            static int third(void) { if (1) { return ';'; } return "}"[0]; }
            // Async-signal-safe: maybe
            void fourth(void);
            enum { A = 0 };
            static const char **(*pointer)(void);
            static void (*hook)(void);
            struct packed { int a; } __attribute__((packed));
            """)
        #expect(parsed.map(\.name) == ["first", "second", "third", "fourth"])
        #expect(parsed.map { Marker.isPresent(in: $0.comments) } == [true, false, true, false])
        #expect(parsed.map(\.isDefinition) == [false, false, true, false])
    }

    /// The zygote's forks refuse a process that has had a second thread: its child, made without
    /// fork's handlers, could find a lock held for good. This test process has threads.
    @Test func aProcessThatHasHadASecondThreadIsNotClonedByTheZygotesCalls() {
        var thread = pthread_t()
        #expect(pthread_create(&thread, nil, { _ in nil }, nil) == 0)
        pthread_join(thread, nil)

        errno = 0
        let pid = bgtask_clone_parent()
        if pid == 0 { _exit(0) } // a child of this test process: it must never exist
        #expect(pid == -1 && errno == EDEADLK, "bgtask_clone_parent cloned a multi-threaded process: \(pid)")

        var error = [CChar](repeating: 0, count: 512)
        let outer = bgtask_clone_parent_namespaced(&error, error.count)
        if outer == 0 { _exit(0) }
        let text = String(decoding: error.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        #expect(outer == -1 && text.contains("second thread"), "\(outer): \(text)")
    }
}

/// The fixed form of a marker.
enum Marker {
    static func isPresent(in comments: [String]) -> Bool {
        comments.contains { comment in
            guard let range = comment.range(of: "Async-signal-safe: ") else { return false }
            let verdict = comment[range.upperBound...]
            if verdict.hasPrefix("yes") { return true }
            guard verdict.hasPrefix("no — ") else { return false }
            return verdict.dropFirst("no — ".count).first.map { !$0.isWhitespace } ?? false
        }
    }
}

/// A small reader of C at file scope: each function declared or defined, with the comments
/// between the end of the statement before it and its own start. Skips string and character
/// literals, preprocessor lines and function bodies; enough for the shims, not for all of C.
enum CFunctions {
    struct Function {
        var name: String
        var comments: [String]
        var isDefinition: Bool
    }

    static func parse(_ source: String) -> [Function] {
        let text = Array(source.utf8)
        var functions: [Function] = []
        var comments: [String] = []
        var statement: [UInt8] = [] // file-scope code of the current statement, before its first brace
        var depth = 0 // braces
        var sawBrace = false
        var atLineStart = true
        var i = 0

        func endStatement(definition: Bool) {
            if let name = functionName(statement) { functions.append(Function(name: name, comments: comments, isDefinition: definition)) }
            comments = []
            statement = []
            sawBrace = false
        }

        while i < text.count {
            let c = text[i]
            let next: UInt8 = i + 1 < text.count ? text[i + 1] : 0
            if c == UInt8(ascii: "/") && next == UInt8(ascii: "*") {
                let start = i
                i += 2
                while i + 1 < text.count && !(text[i] == UInt8(ascii: "*") && text[i + 1] == UInt8(ascii: "/")) { i += 1 }
                i = min(i + 2, text.count)
                if depth == 0 { comments.append(String(decoding: text[start..<i], as: UTF8.self)) }
                continue
            }
            if c == UInt8(ascii: "/") && next == UInt8(ascii: "/") {
                let start = i
                while i < text.count && text[i] != UInt8(ascii: "\n") { i += 1 }
                if depth == 0 { comments.append(String(decoding: text[start..<i], as: UTF8.self)) }
                continue
            }
            if atLineStart && c == UInt8(ascii: "#") {
                // A preprocessor line (with its continuations): neither code nor a boundary.
                while i < text.count && !(text[i] == UInt8(ascii: "\n") && text[i - 1] != UInt8(ascii: "\\")) { i += 1 }
                continue
            }
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                i += 1
                while i < text.count && text[i] != c {
                    if text[i] == UInt8(ascii: "\\") { i += 1 }
                    i += 1
                }
                i += 1
                if depth == 0 && !sawBrace { statement.append(UInt8(ascii: "_")) }
                atLineStart = false
                continue
            }
            if c == UInt8(ascii: "\n") {
                atLineStart = true
            } else if c != UInt8(ascii: " ") && c != UInt8(ascii: "\t") {
                atLineStart = false
            }
            switch c {
            case UInt8(ascii: "{"):
                depth += 1
                sawBrace = true
            case UInt8(ascii: "}"):
                depth -= 1
                // A function's body closed: the definition ends here (a struct's or an enum's
                // `;` follows and ends an empty statement).
                if depth == 0 { endStatement(definition: true) }
            case UInt8(ascii: ";") where depth == 0:
                endStatement(definition: false)
            default:
                if depth == 0 && !sawBrace { statement.append(c) }
            }
            i += 1
        }
        return functions
    }

    /// The identifier right before the statement's first parenthesis, when the statement reads
    /// as a function's head: not an initializer, not a function pointer (`(*name)`), not an
    /// attribute.
    private static func functionName(_ statement: [UInt8]) -> String? {
        guard let open = statement.firstIndex(of: UInt8(ascii: "(")), !statement[..<open].contains(UInt8(ascii: "=")) else { return nil }
        if statement[(open + 1)...].first(where: { $0 != UInt8(ascii: " ") }) == UInt8(ascii: "*") { return nil }
        var end = open
        while end > 0 && (statement[end - 1] == UInt8(ascii: " ") || statement[end - 1] == UInt8(ascii: "\n")) { end -= 1 }
        var start = end
        while start > 0 && isIdentifier(statement[start - 1]) { start -= 1 }
        guard start < end, !(statement[start] >= UInt8(ascii: "0") && statement[start] <= UInt8(ascii: "9")) else { return nil }
        let name = String(decoding: statement[start..<end], as: UTF8.self)
        return ["if", "while", "for", "switch", "return", "sizeof", "__attribute__"].contains(name) ? nil : name
    }

    private static func isIdentifier(_ c: UInt8) -> Bool {
        (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "z")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z"))
            || (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || c == UInt8(ascii: "_")
    }
}

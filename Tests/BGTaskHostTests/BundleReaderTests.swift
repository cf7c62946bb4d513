@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

// MARK: - Fixture support (file-private: other test files define their own helpers)

/// A property-list value, written out as XML exactly as given (so the test controls whether a
/// value is `<integer>`, `<true/>`, `<string>`, ...). Dictionaries keep their key order.
private indirect enum BRPlist: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    case string(String)
    case integer(Int)
    case real(Double)
    case bool(Bool)
    case array([BRPlist])
    case dict([(String, BRPlist)])

    init(stringLiteral value: String) { self = .string(value) }
    init(integerLiteral value: Int) { self = .integer(value) }
    init(booleanLiteral value: Bool) { self = .bool(value) }
    init(arrayLiteral elements: BRPlist...) { self = .array(elements) }
    init(dictionaryLiteral elements: (String, BRPlist)...) { self = .dict(elements) }

    /// This dictionary with `key` set to `value` (replaced in place, or appended).
    func setting(_ key: String, _ value: BRPlist) -> BRPlist {
        guard case .dict(var entries) = self else { return self }
        if let index = entries.firstIndex(where: { $0.0 == key }) {
            entries[index].1 = value
        } else {
            entries.append((key, value))
        }
        return .dict(entries)
    }

    /// This dictionary without `key`.
    func removing(_ key: String) -> BRPlist {
        guard case .dict(let entries) = self else { return self }
        return .dict(entries.filter { $0.0 != key })
    }

    var xmlDocument: String {
        """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">
        \(xml)
        </plist>

        """
    }

    private var xml: String {
        switch self {
        case .string(let text): "<string>\(Self.escape(text))</string>"
        case .integer(let value): "<integer>\(value)</integer>"
        case .real(let value): "<real>\(value)</real>"
        case .bool(let value): value ? "<true/>" : "<false/>"
        case .array(let elements): "<array>\n" + elements.map(\.xml).joined(separator: "\n") + "\n</array>"
        case .dict(let entries):
            "<dict>\n" + entries.map { "<key>\(Self.escape($0.0))</key>\n\($0.1.xml)" }.joined(separator: "\n") + "\n</dict>"
        }
    }

    private static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;")
            .replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;")
    }
}

/// A fresh temporary directory for one test's bundles; `remove()` it in a `defer`.
private struct BRFixture {
    let root: URL

    init() throws {
        root = FileManager.default.temporaryDirectory
            .appendingPathComponent("BundleReaderTests-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    }

    func remove() {
        try? FileManager.default.removeItem(at: root)
    }

    /// The build products directory (where the fixture plugins are built): the directory of the
    /// running test executable.
    static let productsDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()

    /// A real ELF shared library from the build products.
    static var realLibrary: URL { productsDirectory.appendingPathComponent("libNoEntry.so") }

    /// Creates the directory `relative` (like `Name.app` or `Name.app/PlugIns/Share.appex`).
    @discardableResult
    func directory(_ relative: String) throws -> URL {
        let url = root.appendingPathComponent(relative, isDirectory: true)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    func writeInfo(_ plist: BRPlist, in bundle: URL) throws {
        try writeText(plist.xmlDocument, to: bundle.appendingPathComponent("Info.plist"))
    }

    func writeText(_ text: String, to url: URL) throws {
        try Data(text.utf8).write(to: url)
    }

    /// Copies the real shared library into `bundle` as `name`.
    func copyLibrary(named name: String, into bundle: URL) throws {
        let source = Self.realLibrary
        try #require(
            FileManager.default.fileExists(atPath: source.path),
            "no libNoEntry.so next to the test executable in \(Self.productsDirectory.path): run swift build --build-tests")
        try FileManager.default.copyItem(at: source, to: bundle.appendingPathComponent(name))
    }

    /// A complete, valid app bundle `relative` with `plist` as its Info.plist and the real
    /// library as `libApp.so`.
    @discardableResult
    func app(_ relative: String = "App.app", plist: BRPlist = BRFixture.validApp) throws -> URL {
        let bundle = try directory(relative)
        try writeInfo(plist, in: bundle)
        try copyLibrary(named: "libApp.so", into: bundle)
        return bundle
    }

    static let validApp: BRPlist = [
        "CFBundleIdentifier": "com.example.app",
        "CFBundleExecutable": "libApp.so",
        "BGTaskSchedulerPermittedIdentifiers": [
            "com.example.app.refresh", "com.example.app.clean", "com.example.app.export.*",
        ],
        "UIBackgroundModes": ["fetch", "processing"],
    ]

    static func validExtension(identifier: String = "com.example.app.share") -> BRPlist {
        [
            "CFBundleIdentifier": .string(identifier),
            "CFBundleExecutable": "libApp.so",
            "NSExtension": ["NSExtensionPointIdentifier": "com.apple.share-services"],
        ]
    }
}

/// Reads `bundle`, expecting an `.invalidBundle` error at `file`/`key` whose description names
/// the file, the key and the problem (`mentions`). Returns the error for further checks.
@discardableResult
private func expectInvalidBundle(
    _ bundle: URL, file: String, key: String?, mentions words: [String],
    sourceLocation: SourceLocation = #_sourceLocation
) -> BGTaskError? {
    let thrown: BGTaskError
    do throws(BGTaskError) {
        let read = try BundleReader.read(bundle)
        Issue.record("expected BundleReader.read to throw, but it read \(read.identifier)", sourceLocation: sourceLocation)
        return nil
    } catch let error {
        thrown = error
    }
    checkInvalidBundle(thrown, file: file, key: key, mentions: words, sourceLocation: sourceLocation)
    return thrown
}

private func checkInvalidBundle(
    _ error: BGTaskError, file: String, key: String?, mentions words: [String],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(error.code == .invalidBundle, sourceLocation: sourceLocation)
    #expect(error.file == file, sourceLocation: sourceLocation)
    #expect(error.key == key, sourceLocation: sourceLocation)
    let description = error.description
    #expect(description.contains(file), "description does not name the file: \(description)", sourceLocation: sourceLocation)
    if let key {
        #expect(description.contains(key), "description does not name the key: \(description)", sourceLocation: sourceLocation)
    }
    for word in words {
        #expect(description.contains(word), "description does not say '\(word)': \(description)", sourceLocation: sourceLocation)
    }
}

private func infoPath(_ bundle: URL) -> String {
    bundle.appendingPathComponent("Info.plist").path
}

// MARK: - Tests

@Suite struct BundleReaderTests {
    // MARK: The bundle and its Info.plist

    @Test func bundlePathMissing() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = fixture.root.appendingPathComponent("Missing.app")
        expectInvalidBundle(bundle, file: bundle.path, key: nil, mentions: ["not found"])
    }

    @Test func bundleIsAFileNotADirectory() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = fixture.root.appendingPathComponent("File.app")
        try fixture.writeText(BRFixture.validApp.xmlDocument, to: bundle)
        expectInvalidBundle(bundle, file: bundle.path, key: nil, mentions: ["directory"])
    }

    @Test func infoPlistMissing() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.copyLibrary(named: "libApp.so", into: bundle)
        expectInvalidBundle(bundle, file: infoPath(bundle), key: nil, mentions: ["Info.plist", "missing"])
    }

    @Test func infoPlistMalformedXML() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.copyLibrary(named: "libApp.so", into: bundle)
        try fixture.writeText(
            """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict><key>CFBundleIdentifier</key></plist>
            """,
            to: bundle.appendingPathComponent("Info.plist"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: nil, mentions: ["not a valid property list"])
    }

    @Test func infoPlistCorruptBinary() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.copyLibrary(named: "libApp.so", into: bundle)
        try Data("bplist00".utf8 + [0x01, 0x02, 0x03, 0xFF, 0x10]).write(to: bundle.appendingPathComponent("Info.plist"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: nil, mentions: ["a binary property list (bplist) that cannot be read", "13 bytes"])
    }

    @Test func infoPlistRootIsAnArray() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: ["com.example.app"])
        expectInvalidBundle(bundle, file: infoPath(bundle), key: nil, mentions: ["dictionary", "an array"])
    }

    // MARK: CFBundleIdentifier

    @Test func identifierMissing() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.removing("CFBundleIdentifier"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleIdentifier", mentions: ["missing"])
    }

    @Test func identifierNotAString() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleIdentifier", ["com.example.app"]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleIdentifier", mentions: ["must be a string", "an array"])
    }

    @Test func identifierEmpty() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleIdentifier", ""))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleIdentifier", mentions: ["empty"])
    }

    @Test(arguments: ["feed", "com..x", "com.ex ample", ".com.example", "com.example.", "com.exam_ple", "com.example.*"])
    func identifierNotReverseDNS(_ identifier: String) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleIdentifier", .string(identifier)))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleIdentifier",
                            mentions: ["'\(identifier)'", "reverse-DNS"])
    }

    @Test(arguments: ["com.example", "com.example.feed", "org.my-company.App2", "A.B"])
    func identifierReverseDNSAccepted(_ identifier: String) throws {
        #expect(BundleReader.isReverseDNS(identifier))
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let plist = BRFixture.validApp
            .setting("CFBundleIdentifier", .string(identifier))
            .removing("BGTaskSchedulerPermittedIdentifiers")
        let bundle = try fixture.app(plist: plist)
        let read = try BundleReader.read(bundle)
        #expect(read.identifier == identifier)
    }

    // MARK: CFBundleExecutable

    @Test func executableMissing() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.removing("CFBundleExecutable"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable", mentions: ["missing"])
    }

    @Test func executableNotAString() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleExecutable", true))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable", mentions: ["must be a string", "a boolean"])
    }

    @Test func executableNotInTheBundle() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleExecutable", "libMissing.so"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable",
                            mentions: ["libMissing.so", "not in the bundle"])
    }

    @Test(arguments: ["lib/libApp.so", "../App.app/libApp.so", "/usr/lib/libc.so.6", ".", ".."])
    func executableIsAPath(_ executable: String) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleExecutable", .string(executable)))
        // A copy where the path would resolve, so only the "not a path" rule can reject it.
        try fixture.directory("App.app/lib")
        try fixture.copyLibrary(named: "lib/libApp.so", into: bundle)
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable",
                            mentions: ["'\(executable)'", "not a path"])
    }

    @Test func executableNotELF() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.writeInfo(BRFixture.validApp, in: bundle)
        try fixture.writeText("#!/bin/sh\necho this is not a shared library\n", to: bundle.appendingPathComponent("libApp.so"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable",
                            mentions: ["libApp.so", "not an ELF"])
    }

    @Test func executableTruncatedELFHeader() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.writeInfo(BRFixture.validApp, in: bundle)
        try Data([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1]).write(to: bundle.appendingPathComponent("libApp.so"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable",
                            mentions: ["libApp.so", "not an ELF"])
    }

    /// ET_REL (1), ET_EXEC (2), ET_CORE (4): ELF files that are not shared objects. (`/bin/true`
    /// is usually a PIE, which is ET_DYN like a shared library, so the header is crafted.)
    @Test(arguments: [UInt8(1), 2, 4])
    func executableELFButNotSharedLibrary(_ elfType: UInt8) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.writeInfo(BRFixture.validApp, in: bundle)
        var header = Data([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0])  // ELF64, little-endian, version 1
        header.append(contentsOf: [UInt8](repeating: 0, count: 8))
        header.append(contentsOf: [elfType, 0])  // e_type
        header.append(contentsOf: [0x3e, 0])  // e_machine x86-64
        #expect(header.count == 20)
        try header.write(to: bundle.appendingPathComponent("libApp.so"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable",
                            mentions: ["libApp.so", "not a shared library"])
    }

    @Test func executableBinTrueIsCheckedByItsType() throws {
        let binTrue = URL(fileURLWithPath: "/bin/true").resolvingSymlinksInPath()
        let header = try #require(FileHandle(forReadingAtPath: binTrue.path)?.readData(ofLength: 18))
        try #require(header.count == 18)
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.directory("App.app")
        try fixture.writeInfo(BRFixture.validApp, in: bundle)
        try FileManager.default.copyItem(at: binTrue, to: bundle.appendingPathComponent("libApp.so"))
        if header[16] == 3 {
            // A PIE executable is ET_DYN: by its header alone it passes (the runner's dlopen is
            // what rejects it). Nothing more to check here.
            #expect(throws: Never.self) { try BundleReader.read(bundle) }
        } else {
            expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleExecutable",
                                mentions: ["not a shared library"])
        }
    }

    // MARK: BGTaskSchedulerPermittedIdentifiers, UIBackgroundModes, Entitlements

    @Test func permittedIdentifiersNotAnArray() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskSchedulerPermittedIdentifiers", "com.example.app.refresh"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskSchedulerPermittedIdentifiers",
                            mentions: ["must be an array", "a string"])
    }

    @Test func permittedIdentifierElementNotAString() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskSchedulerPermittedIdentifiers", ["com.example.app.refresh", 42]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskSchedulerPermittedIdentifiers[1]",
                            mentions: ["must be a non-empty string", "a number"])
    }

    @Test func permittedIdentifierElementEmpty() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskSchedulerPermittedIdentifiers", ["com.example.app.refresh", ""]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskSchedulerPermittedIdentifiers[1]",
                            mentions: ["is an empty string"])
    }

    @Test(arguments: ["com.example.*.x", "com.example.app.*.*", "*", "com.*x", "com.example.app*", "com.example..refresh", "refresh"])
    func permittedIdentifierMalformed(_ entry: String) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting(
            "BGTaskSchedulerPermittedIdentifiers", ["com.example.app.refresh", "com.example.app.clean", .string(entry)]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskSchedulerPermittedIdentifiers[2]",
                            mentions: ["'\(entry)'", "reverse-DNS", "wildcard"])
    }

    @Test func backgroundModesNotAnArray() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("UIBackgroundModes", "fetch"))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "UIBackgroundModes", mentions: ["must be an array", "a string"])
    }

    @Test func backgroundModeElementNotAString() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("UIBackgroundModes", [true]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "UIBackgroundModes[0]", mentions: ["non-empty string", "a boolean"])
    }

    @Test func entitlementsNotADictionary() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("Entitlements", [.string(PluginBundle.healthResearchEntitlement)]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "Entitlements", mentions: ["must be a dictionary", "an array"])
    }

    @Test func entitlementValueNotABoolean() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let name = PluginBundle.healthResearchEntitlement
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("Entitlements", [name: "YES"]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "Entitlements.\(name)", mentions: ["must be a boolean", "a string"])
    }

    @Test func entitlementValueLargeIntegerIsNotABoolean() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let name = PluginBundle.healthResearchEntitlement
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("Entitlements", [name: 7]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "Entitlements.\(name)", mentions: ["must be a boolean", "a number"])
    }

    /// `<integer>1</integer>` / `<integer>0</integer>` / `<real>1.0</real>` are not booleans, though
    /// Foundation's NSNumber casts to Bool for 0 and 1: they must not grant an entitlement.
    @Test(arguments: [BRPlist.integer(1), .integer(0), .real(1.0)])
    fileprivate func entitlementValueZeroOrOneNumberIsNotABoolean(_ value: BRPlist) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let name = PluginBundle.healthResearchEntitlement
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("Entitlements", [name: value]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "Entitlements.\(name)", mentions: ["must be a boolean", "a number"])
    }

    /// The type named in "found ..." for a number 0 or 1 is "a number", not "a boolean".
    @Test func wrongTypeMessageNamesANumberAsANumber() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("CFBundleIdentifier", 1))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "CFBundleIdentifier", mentions: ["must be a string", "found a number"])
    }

    // MARK: BGTaskHandlers

    private static let withHandlersApp = BRFixture.validApp
        .setting("BGTaskHandlers", [
            "com.example.app.refresh": "feed_refresh(identifier, data_directory) -> bool",
        ])

    @Test func handlersNotADictionary() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskHandlers", ["feed_refresh(identifier) -> bool"]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskHandlers", mentions: ["must be a dictionary", "an array"])
    }

    @Test func handlerValueNotAString() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskHandlers", ["com.example.app.refresh": 3]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskHandlers.com.example.app.refresh",
                            mentions: ["must be a string", "a number"])
    }

    @Test func handlerIdentifierNotPermitted() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskHandlers", [
            "com.example.app.refresh": "feed_refresh(identifier) -> bool",
            "com.example.app.other": "other(identifier) -> bool",
        ]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskHandlers.com.example.app.other",
                            mentions: ["'com.example.app.other'", "not in BGTaskSchedulerPermittedIdentifiers"])
    }

    @Test(arguments: [
        ("feed_refresh(identifier, context) -> bool", "unknown argument 'context'"),
        ("feed_refresh(identifier) -> float", "unknown result type 'float'"),
        ("feed_refresh(identifier, data_directory)", "no way to complete"),
        ("feed_refresh(identifier) -> void", "no way to complete"),
        ("feed_refresh", "is not a signature"),
        ("9feed(identifier) -> bool", "not a C symbol name"),
    ])
    func handlerBadSignature(_ signature: String, problem: String) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskHandlers", [
            "com.example.app.refresh": .string(signature),
        ]))
        expectInvalidBundle(bundle, file: infoPath(bundle), key: "BGTaskHandlers.com.example.app.refresh", mentions: [problem])
    }

    @Test func handlerForAWildcardMatchIsPermitted() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: BRFixture.validApp.setting("BGTaskHandlers", [
            "com.example.app.export.video": "export_video(identifier, complete)",
        ]))
        let read = try BundleReader.read(bundle)
        #expect(read.mappedHandlers == [
            MappedHandler(identifier: "com.example.app.export.video", symbol: "export_video",
                          arguments: [.identifier, .complete], result: .void),
        ])
    }

    // MARK: A valid bundle

    @Test func validBundleReadsBackEveryField() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let plist: BRPlist = [
            "CFBundleIdentifier": "com.example.app",
            "CFBundleExecutable": "libApp.so",
            "BGTaskSchedulerPermittedIdentifiers": [
                "com.example.app.refresh", "com.example.app.clean", "com.example.app.export.*",
            ],
            "UIBackgroundModes": ["fetch", "processing", "audio"],
            "Entitlements": [
                PluginBundle.healthResearchEntitlement: true,
                PluginBundle.continuedProcessingGPUEntitlement: false,
            ],
            "BGTaskHandlers": [
                "com.example.app.refresh": "feed_refresh(identifier, data_directory) -> bool",
                "com.example.app.clean": "  clean_up ( task_id , api ) ",
                "com.example.app.export.*": "do_export(task, type, host, complete) -> int",
            ],
        ]
        let bundle = try fixture.app(plist: plist)
        let read = try BundleReader.read(bundle)
        #expect(read.kind == .app)
        #expect(read.url == bundle)
        #expect(read.identifier == "com.example.app")
        #expect(read.executableName == "libApp.so")
        #expect(read.executableURL.path == bundle.appendingPathComponent("libApp.so").path)
        #expect(read.infoPlistURL.path == infoPath(bundle))
        #expect(read.permittedIdentifiers == ["com.example.app.refresh", "com.example.app.clean", "com.example.app.export.*"])
        #expect(read.backgroundModes == ["fetch", "processing", "audio"])
        #expect(read.entitlements == [
            PluginBundle.healthResearchEntitlement: true,
            PluginBundle.continuedProcessingGPUEntitlement: false,
        ])
        // Sorted by task identifier.
        #expect(read.mappedHandlers == [
            MappedHandler(identifier: "com.example.app.clean", symbol: "clean_up", arguments: [.taskID, .api], result: .void),
            MappedHandler(identifier: "com.example.app.export.*", symbol: "do_export",
                          arguments: [.task, .type, .host, .complete], result: .int),
            MappedHandler(identifier: "com.example.app.refresh", symbol: "feed_refresh",
                          arguments: [.identifier, .dataDirectory], result: .bool),
        ])
        #expect(read.extensionPoint == nil)
        #expect(read.extensions.isEmpty)
        #expect(read.invalidExtensions.isEmpty)
    }

    @Test func minimalValidBundleHasEmptyOptionalFields() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let bundle = try fixture.app(plist: [
            "CFBundleIdentifier": "com.example.minimal",
            "CFBundleExecutable": "libApp.so",
        ])
        let read = try BundleReader.read(bundle)
        #expect(read.identifier == "com.example.minimal")
        #expect(read.permittedIdentifiers.isEmpty)
        #expect(read.backgroundModes.isEmpty)
        #expect(read.mappedHandlers.isEmpty)
        #expect(read.entitlements.isEmpty)
    }

    // MARK: Extensions

    @Test func validExtensionIsListed() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let app = try fixture.app()
        let appex = try fixture.app("App.app/PlugIns/Share.appex", plist: BRFixture.validExtension())
        let read = try BundleReader.read(app)
        #expect(read.invalidExtensions.isEmpty)
        let share = try #require(read.extensions.first)
        #expect(read.extensions.count == 1)
        #expect(share.kind == .extension)
        #expect(share.url.path == appex.path)
        #expect(share.identifier == "com.example.app.share")
        #expect(share.executableName == "libApp.so")
        #expect(share.extensionPoint == "com.apple.share-services")
        #expect(share.extensions.isEmpty)
    }

    @Test(arguments: ["com.other.share", "com.example.appx.share", "com.example.ap.share"])
    func extensionIdentifierNotUnderTheApp(_ identifier: String) throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let app = try fixture.app()
        let appex = try fixture.app("App.app/PlugIns/Share.appex", plist: BRFixture.validExtension(identifier: identifier))
        let read = try BundleReader.read(app)
        #expect(read.identifier == "com.example.app")
        #expect(read.extensions.isEmpty)
        #expect(read.invalidExtensions.count == 1)
        let problem = try #require(read.invalidExtensions.first)
        checkInvalidBundle(problem, file: infoPath(appex), key: "CFBundleIdentifier",
                           mentions: ["must start with", "'com.example.app.'", "'\(identifier)'"])
    }

    @Test func extensionWithoutNSExtensionIsInvalid() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let app = try fixture.app()
        let appex = try fixture.app("App.app/PlugIns/Share.appex",
                                    plist: BRFixture.validExtension().removing("NSExtension"))
        let read = try BundleReader.read(app)
        #expect(read.extensions.isEmpty)
        let problem = try #require(read.invalidExtensions.first)
        #expect(read.invalidExtensions.count == 1)
        checkInvalidBundle(problem, file: infoPath(appex), key: "NSExtension", mentions: ["missing"])
    }

    @Test func extensionNSExtensionNotADictionary() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let app = try fixture.app()
        let appex = try fixture.app("App.app/PlugIns/Share.appex",
                                    plist: BRFixture.validExtension().setting("NSExtension", "com.apple.share-services"))
        let read = try BundleReader.read(app)
        let problem = try #require(read.invalidExtensions.first)
        checkInvalidBundle(problem, file: infoPath(appex), key: "NSExtension", mentions: ["must be a dictionary", "a string"])
    }

    @Test func extensionPointNotAString() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let app = try fixture.app()
        let appex = try fixture.app("App.app/PlugIns/Share.appex",
                                    plist: BRFixture.validExtension().setting("NSExtension", ["NSExtensionPointIdentifier": 5]))
        let read = try BundleReader.read(app)
        let problem = try #require(read.invalidExtensions.first)
        checkInvalidBundle(problem, file: infoPath(appex), key: "NSExtension.NSExtensionPointIdentifier",
                           mentions: ["must be a string", "a number"])
    }

    @Test func validAndInvalidExtensionsAreSeparatedAndOtherEntriesIgnored() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let app = try fixture.app()
        try fixture.app("App.app/PlugIns/A.appex", plist: BRFixture.validExtension(identifier: "com.example.app.a"))
        let bad = try fixture.app("App.app/PlugIns/B.appex", plist: BRFixture.validExtension(identifier: "com.other.b"))
        try fixture.app("App.app/PlugIns/C.appex", plist: BRFixture.validExtension(identifier: "com.example.app.c"))
        // Not extensions: ignored.
        try fixture.app("App.app/PlugIns/D.bundle", plist: BRFixture.validExtension(identifier: "com.other.d"))
        try fixture.writeText("notes", to: app.appendingPathComponent("PlugIns/README"))
        let read = try BundleReader.read(app)
        #expect(read.extensions.map(\.identifier) == ["com.example.app.a", "com.example.app.c"])
        #expect(read.invalidExtensions.map(\.file) == [infoPath(bad)])
    }

    @Test func extensionReadDirectly() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let appex = try fixture.app("Share.appex", plist: BRFixture.validExtension(identifier: "com.example.share"))
        let read = try BundleReader.read(appex)
        #expect(read.kind == .extension)
        #expect(read.identifier == "com.example.share")
        #expect(read.extensionPoint == "com.apple.share-services")
    }

    @Test func extensionReadDirectlyWithoutNSExtension() throws {
        let fixture = try BRFixture()
        defer { fixture.remove() }
        let appex = try fixture.app("Share.appex", plist: BRFixture.validExtension().removing("NSExtension"))
        expectInvalidBundle(appex, file: infoPath(appex), key: "NSExtension", mentions: ["missing", "NSExtension dictionary"])
    }
}

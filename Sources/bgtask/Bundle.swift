import ArgumentParser
import BGTaskHost
import BGTaskControl
import BGTaskLaunch
import Foundation

extension BGTaskCommand {
    struct Bundle: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Assemble and validate a bundle from a built library and its Info.plist.",
            discussion: """
                The packaging step after `swift build`: copies the library (under the name \
                CFBundleExecutable gives) and the Info.plist into the output directory, then \
                validates the result. An invalid bundle is removed again and the error names \
                the file and key at fault (exit status 65).
                """)

        @Option(name: .long, help: ArgumentHelp("The plugin's shared library (e.g. .build/debug/libFeed.so).", valueName: "lib.so"), completion: .file(extensions: ["so"]))
        var library: String

        @Option(name: .long, help: ArgumentHelp("The bundle's Info.plist.", valueName: "Info.plist"), completion: .file(extensions: ["plist"]))
        var info: String

        @Option(name: .long, help: ArgumentHelp("The bundle to write (Name.app, or Name.appex for an extension).", valueName: "dir/Name.app"), completion: .directory)
        var output: String

        @Option(name: .customLong("extension"), help: ArgumentHelp("An extension bundle (.appex) to copy into PlugIns/. Repeatable.", valueName: "Name.appex"), completion: .directory)
        var extensions: [String] = []

        func run() throws {
            let fm = FileManager.default
            let out = URL(fileURLWithPath: output).standardizedFileURL
            guard ["app", "appex"].contains(out.pathExtension) else {
                throw ValidationError("--output must end in .app or .appex, got '\(output)'")
            }
            guard fm.fileExists(atPath: library) else { throw ValidationError("--library: no file at '\(library)'") }
            guard fm.fileExists(atPath: info) else { throw ValidationError("--info: no file at '\(info)'") }

            // Read CFBundleExecutable leniently here; full validation happens on the result.
            let executableName: String = {
                guard let data = fm.contents(atPath: info),
                      let plist = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any],
                      let name = plist["CFBundleExecutable"] as? String, !name.isEmpty, !name.contains("/")
                else { return URL(fileURLWithPath: library).lastPathComponent }
                return name
            }()

            try? fm.removeItem(at: out)
            try fm.createDirectory(at: out, withIntermediateDirectories: true)
            try fm.copyItem(at: URL(fileURLWithPath: info), to: out.appendingPathComponent("Info.plist"))
            try fm.copyItem(at: URL(fileURLWithPath: library), to: out.appendingPathComponent(executableName))
            if !extensions.isEmpty {
                let plugIns = out.appendingPathComponent("PlugIns")
                try fm.createDirectory(at: plugIns, withIntermediateDirectories: true)
                for path in extensions {
                    let source = URL(fileURLWithPath: path).standardizedFileURL
                    try fm.copyItem(at: source, to: plugIns.appendingPathComponent(source.lastPathComponent))
                }
            }
            do {
                let bundle = try BundleReader.read(out)
                if let problem = bundle.invalidExtensions.first { throw problem }
                print("\(out.path): \(bundle.identifier), \(bundle.permittedIdentifiers.count) permitted identifier(s), \(bundle.extensions.count) extension(s)")
            } catch {
                try? fm.removeItem(at: out)
                printError("\(error)")
                throw Status.invalidBundle
            }
        }
    }

    struct Validate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Validate a bundle without loading it; print what it declares.")

        @Argument(help: "The bundle (Name.app or Name.appex).", completion: .directory)
        var bundle: String

        @Flag(name: .long, help: "Print the result as JSON.")
        var json = false

        @Option(name: .long, help: ArgumentHelp(
            "Also say which of the bundle's app groups a host on this state directory would refuse it (each group is its first app's, its extensions' and whom the operator grants it).",
            valueName: "dir"), completion: .directory)
        var state: String?

        func run() throws {
            let url = URL(fileURLWithPath: bundle).standardizedFileURL
            do {
                let app = try BundleReader.read(url)
                var summary = BundleSummary(app)
                if let state {
                    let owners = AppGroupOwners(stateDirectory: URL(fileURLWithPath: state))
                    var refused = try owners.decide(app: app.identifier, groups: app.appGroups, claim: false).refused
                    for ext in app.extensions {
                        refused.merge(try owners.decide(app: app.identifier, groups: ext.appGroups, claim: false).refused) { first, _ in first }
                    }
                    summary.appGroupsRefused = refused
                }
                if json {
                    let encoder = JSONEncoder()
                    encoder.outputFormatting = [.sortedKeys]
                    FileHandle.standardOutput.write(try encoder.encode(summary) + Data("\n".utf8))
                } else {
                    print(summary.text)
                }
                if !app.invalidExtensions.isEmpty { throw Status.invalidBundle }
            } catch let error as BGTaskError {
                if json {
                    let encoder = JSONEncoder()
                    encoder.outputFormatting = [.sortedKeys]
                    let body = ["valid": "false", "error": error.description, "file": error.file ?? "", "key": error.key ?? ""]
                    FileHandle.standardOutput.write(try encoder.encode(body) + Data("\n".utf8))
                } else {
                    printError(error.description)
                }
                throw Status.invalidBundle
            }
        }
    }
}

struct BundleSummary: Encodable {
    var valid = true
    var identifier: String
    var kind: String
    var executable: String
    var permittedIdentifiers: [String]
    var backgroundModes: [String]
    var mappedHandlers: [String: String]
    var extensions: [BundleSummary]
    var invalidExtensions: [String]
    /// With `--state`: the app groups a host on that state directory would refuse (group → why).
    var appGroupsRefused: [String: String]?

    init(_ bundle: PluginBundle) {
        identifier = bundle.identifier
        kind = bundle.kind.rawValue
        executable = bundle.executableName
        permittedIdentifiers = bundle.permittedIdentifiers
        backgroundModes = bundle.backgroundModes.sorted()
        mappedHandlers = Dictionary(uniqueKeysWithValues: bundle.mappedHandlers.map {
            ($0.identifier, "\($0.symbol)(\($0.arguments.map(\.rawValue).joined(separator: ", "))) -> \($0.result.rawValue)")
        })
        extensions = bundle.extensions.map(BundleSummary.init)
        invalidExtensions = bundle.invalidExtensions.map(\.description)
    }

    enum CodingKeys: String, CodingKey {
        case valid, identifier, kind, executable, extensions
        case permittedIdentifiers = "permitted_identifiers", backgroundModes = "background_modes"
        case mappedHandlers = "mapped_handlers", invalidExtensions = "invalid_extensions"
        case appGroupsRefused = "app_groups_refused"
    }

    var text: String {
        var lines = ["\(identifier) (\(kind)): \(executable)"]
        lines.append("  permitted: \(permittedIdentifiers.joined(separator: ", "))")
        lines.append("  background modes: \(backgroundModes.isEmpty ? "none" : backgroundModes.joined(separator: ", "))")
        for (identifier, signature) in mappedHandlers.sorted(by: { $0.key < $1.key }) {
            lines.append("  mapped: \(identifier) -> \(signature)")
        }
        for ext in extensions { lines.append("  extension: \(ext.identifier)") }
        for problem in invalidExtensions { lines.append("  invalid extension: \(problem)") }
        for (_, why) in (appGroupsRefused ?? [:]).sorted(by: { $0.key < $1.key }) { lines.append("  app group refused: \(why)") }
        return lines.joined(separator: "\n")
    }
}

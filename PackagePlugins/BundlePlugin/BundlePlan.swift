import Foundation

// The plugin's decisions, apart from PackagePlugin so that a test target can compile this file
// too (Tests/BundlePluginTests links it in): what was asked, which products are apps and which
// their extensions, and the `bgtask bundle` command lines that assemble them. The layout itself
// is `bgtask bundle`'s (Sources/bgtask/Bundle.swift), never repeated here.

/// `swift package bgtask-bundle [--product NAME ...] [--extension NAME ...] [--info PATH]
/// [--output DIR] [-c debug|release]`
struct BundleOptions: Equatable {
    var products: [String] = []
    var extensions: [String] = []
    var info: String?
    var output: String?
    var configuration = "debug"

    static let usage = """
        usage: swift package --allow-writing-to-package-directory bgtask-bundle [--product NAME ...] [--extension NAME ...] [--info PATH] [--output DIR] [-c debug|release]
          --product NAME     a dynamic library product to bundle as NAME.app (repeatable; default: every
                             dynamic library product with an Info.plist beside its sources that is not an extension)
          --extension NAME   a dynamic library product to put in the app's PlugIns/ as NAME.appex (repeatable;
                             products whose Info.plist has NSExtension and whose CFBundleIdentifier starts with
                             the app's are found without it)
          --info PATH        the app's Info.plist, for one --product whose Info.plist is not beside its sources
          --output DIR       where NAME.app is written (default: the build directory, beside libNAME.so)
          -c, --configuration debug|release
        """

    struct Invalid: Error, CustomStringConvertible {
        var description: String
    }

    static func parse(_ arguments: [String]) throws -> BundleOptions {
        var options = BundleOptions()
        var rest = arguments[...]
        func value(_ flag: String) throws -> String {
            guard let next = rest.popFirst(), !next.hasPrefix("-") else { throw Invalid(description: "\(flag) needs a value\n\(usage)") }
            return next
        }
        while let argument = rest.popFirst() {
            let (flag, inline) = argument.split(separator: "=", maxSplits: 1).map(String.init).splitFlag
            func given() throws -> String { try inline ?? value(flag) }
            switch flag {
            case "--product": options.products.append(try given())
            case "--extension": options.extensions.append(try given())
            case "--info": options.info = try given()
            case "--output": options.output = try given()
            case "-c", "--configuration":
                let configuration = try given()
                guard ["debug", "release"].contains(configuration) else {
                    throw Invalid(description: "--configuration must be debug or release, got '\(configuration)'")
                }
                options.configuration = configuration
            case "-h", "--help": throw Invalid(description: usage)
            default: throw Invalid(description: "unknown argument '\(argument)'\n\(usage)")
            }
        }
        if options.info != nil && options.products.count != 1 {
            throw Invalid(description: "--info names the Info.plist of one app: give exactly one --product with it")
        }
        return options
    }
}

private extension Array where Element == String {
    var splitFlag: (String, String?) { (self[0], count > 1 ? self[1] : nil) }
}

/// A dynamic library product with its Info.plist: what can become a bundle.
struct BundleCandidate: Equatable {
    var product: String
    var infoPlist: URL
    /// `CFBundleIdentifier`, when the Info.plist could be read.
    var identifier: String?
    /// The Info.plist has `NSExtension`: it is an app extension.
    var isExtension: Bool

    init(product: String, infoPlist: URL) {
        self.product = product
        self.infoPlist = infoPlist
        let plist = (try? Data(contentsOf: infoPlist)).flatMap {
            try? PropertyListSerialization.propertyList(from: $0, format: nil) as? [String: Any]
        }
        identifier = plist?["CFBundleIdentifier"] as? String
        isExtension = plist?["NSExtension"] != nil
    }
}

enum BundlePlan {
    /// The apps to bundle: the products asked for, else every candidate that is not an extension.
    static func apps(_ options: BundleOptions, candidates: [BundleCandidate]) throws -> [BundleCandidate] {
        guard !options.products.isEmpty else {
            let apps = candidates.filter { !$0.isExtension }
            guard !apps.isEmpty else {
                throw BundleOptions.Invalid(description: "no dynamic library product has an Info.plist beside its sources: declare one (.library(name: \"Feed\", type: .dynamic, targets: [\"Feed\"])) and put its Info.plist in the target's directory")
            }
            return apps
        }
        return try options.products.map { name in
            if let info = options.info { return BundleCandidate(product: name, infoPlist: URL(fileURLWithPath: info)) }
            guard let found = candidates.first(where: { $0.product == name }) else {
                throw BundleOptions.Invalid(description: "'\(name)' is not a dynamic library product with an Info.plist beside its sources (give --info PATH, or declare it .library(name: \"\(name)\", type: .dynamic, ...))")
            }
            return found
        }
    }

    /// The extensions of `app`: the ones named, and every candidate whose Info.plist declares
    /// an extension (`NSExtension`) with an identifier under the app's, as bgtask requires.
    static func extensions(of app: BundleCandidate, _ options: BundleOptions, candidates: [BundleCandidate]) throws -> [BundleCandidate] {
        var found = try options.extensions.map { name in
            guard let candidate = candidates.first(where: { $0.product == name }) else {
                throw BundleOptions.Invalid(description: "--extension '\(name)' is not a dynamic library product with an Info.plist beside its sources")
            }
            return candidate
        }
        if let identifier = app.identifier {
            for candidate in candidates where candidate.isExtension && candidate.product != app.product
                && (candidate.identifier?.hasPrefix(identifier + ".") ?? false) && !found.contains(candidate) {
                found.append(candidate)
            }
        }
        return found
    }

    /// The `bgtask` arguments that assemble `app` (its library at `library`) with `extensions`
    /// (each `(candidate, library)`) into `output/APP.app`: one `bundle` per extension into
    /// `staging`, then the app's with an `--extension` for each.
    static func commands(app: BundleCandidate, library: String, extensions: [(BundleCandidate, String)],
                         output: URL, staging: URL) -> [[String]] {
        var commands: [[String]] = []
        var staged: [String] = []
        for (candidate, extensionLibrary) in extensions {
            let appex = staging.appendingPathComponent("\(candidate.product).appex").path
            commands.append(["bundle", "--library", extensionLibrary, "--info", candidate.infoPlist.path, "--output", appex])
            staged.append(appex)
        }
        commands.append(["bundle", "--library", library, "--info", app.infoPlist.path,
                         "--output", output.appendingPathComponent("\(app.product).app").path]
                        + staged.flatMap { ["--extension", $0] })
        return commands
    }
}

import Foundation
import PackagePlugin

/// `swift package bgtask-bundle`: builds dynamic library products and assembles each into a
/// bgtask bundle (`NAME.app`, extensions in `PlugIns/`) from the Info.plist beside its sources,
/// by running the package's own `bgtask bundle`, which validates the result as the host will.
@main
struct BundlePlugin: CommandPlugin {
    func performCommand(context: PluginContext, arguments: [String]) async throws {
        let options: BundleOptions
        do {
            options = try BundleOptions.parse(arguments)
        } catch {
            Diagnostics.error("\(error)")
            throw error
        }
        let candidates = context.package.products.compactMap { product -> BundleCandidate? in
            guard let library = product as? LibraryProduct, case .dynamic = library.kind,
                  let target = library.targets.first as? SourceModuleTarget else { return nil }
            guard let info = Self.directory(of: target)?.appendingPathComponent("Info.plist") else { return nil }
            guard FileManager.default.fileExists(atPath: info.path) else { return nil }
            return BundleCandidate(product: product.name, infoPlist: info)
        }
        let bgtask = try context.tool(named: "bgtask").url
        let configuration: PackageManager.BuildConfiguration = options.configuration == "release" ? .release : .debug

        for app in try BundlePlan.apps(options, candidates: candidates) {
            let extensions = try BundlePlan.extensions(of: app, options, candidates: candidates)
            let library = try build(app.product, configuration, context)
            let built = try extensions.map { ($0, try build($0.product, configuration, context)) }
            let output = options.output.map { URL(fileURLWithPath: $0, relativeTo: context.package.directoryURL).standardizedFileURL }
                ?? URL(fileURLWithPath: library).deletingLastPathComponent()
            let staging = context.pluginWorkDirectoryURL.appendingPathComponent("staging-\(app.product)")
            try? FileManager.default.removeItem(at: staging)
            try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
            try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
            for command in BundlePlan.commands(app: app, library: library, extensions: built, output: output, staging: staging) {
                try run(bgtask, command)
            }
        }
    }

    /// The target's directory: `directoryURL` of the concrete target types (the protocol's own
    /// needs tools version 6.1; the Path-based `directory` is deprecated).
    private static func directory(of target: any SourceModuleTarget) -> URL? {
        switch target {
        case let swift as SwiftSourceModuleTarget: swift.directoryURL
        case let clang as ClangSourceModuleTarget: clang.directoryURL
        default: nil
        }
    }

    /// Builds `product` and returns its shared library's path.
    private func build(_ product: String, _ configuration: PackageManager.BuildConfiguration, _ context: PluginContext) throws -> String {
        let result = try packageManager.build(.product(product), parameters: .init(configuration: configuration, logging: .concise))
        guard result.succeeded else {
            Diagnostics.error(result.logText)
            throw BundleOptions.Invalid(description: "building \(product) failed")
        }
        guard let library = result.builtArtifacts.first(where: { $0.kind == .dynamicLibrary }) else {
            throw BundleOptions.Invalid(description: "building \(product) produced no shared library")
        }
        return library.url.path
    }

    /// Runs `bgtask ARGUMENTS`, passing its output through; a failure (an invalid bundle: the
    /// error names the file and key) fails the command.
    private func run(_ bgtask: URL, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = bgtask
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw BundleOptions.Invalid(description: "bgtask \(arguments.joined(separator: " ")) exited with status \(process.terminationStatus)")
        }
    }
}

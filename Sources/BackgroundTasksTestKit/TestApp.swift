import BGTaskControl
import Foundation

/// The app a test scheduler plays the system for: what its Info.plist declares (permitted
/// identifiers, background modes, entitlements, app groups), read and validated by the host's
/// own reader, so a test holds app code to the same declaration the host will.
public struct TestApp: Sendable {
    let bundle: PluginBundle

    /// The bundle identifier (`CFBundleIdentifier`).
    public var identifier: String { bundle.identifier }
    /// `BGTaskSchedulerPermittedIdentifiers`.
    public var permittedIdentifiers: [String] { bundle.permittedIdentifiers }

    /// The app as the Info.plist at `url` declares it (usually the one next to the app's
    /// sources, which `swift package bgtask-bundle` puts in its bundle). Throws the host's
    /// validation error, which names the file and key at fault.
    public static func infoPlist(_ url: URL) throws -> TestApp {
        TestApp(bundle: try BundleReader.read(infoPlist: url))
    }

    /// An app declared in the test itself (written to a temporary Info.plist and read as one).
    /// `backgroundModes`: `fetch` for refresh, `processing` for processing and health research.
    public static func declared(
        identifier: String,
        permittedIdentifiers: [String],
        backgroundModes: [String] = ["fetch", "processing"],
        entitlements: [String: Bool] = [:],
        appGroups: [String] = []
    ) throws -> TestApp {
        var declaredEntitlements: [String: Any] = entitlements
        if !appGroups.isEmpty { declaredEntitlements[PluginBundle.appGroupsEntitlement] = appGroups }
        var info: [String: Any] = [
            "CFBundleIdentifier": identifier,
            "CFBundleExecutable": "lib\(identifier.split(separator: ".").last ?? "App").so",
            "BGTaskSchedulerPermittedIdentifiers": permittedIdentifiers,
            "UIBackgroundModes": backgroundModes,
        ]
        if !declaredEntitlements.isEmpty { info["Entitlements"] = declaredEntitlements }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-testkit-app-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let plist = directory.appendingPathComponent("Info.plist")
        try PropertyListSerialization.data(fromPropertyList: info, format: .xml, options: 0).write(to: plist)
        return try infoPlist(plist)
    }
}

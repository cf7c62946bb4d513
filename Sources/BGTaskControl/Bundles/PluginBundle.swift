import BGTaskModel
import Foundation

/// A validated app (`.app`) or extension (`.appex`) bundle: what its Info.plist says, checked.
/// Nothing in it has been loaded; plugin code runs only in launch children.
public struct PluginBundle: Sendable, Equatable {
    public enum Kind: String, Sendable { case app, `extension` }

    public var kind: Kind
    public var url: URL
    public var identifier: String
    public var executableName: String
    public var permittedIdentifiers: [String]
    public var backgroundModes: Set<String>
    public var mappedHandlers: [MappedHandler]
    /// Entitlements (`Entitlements` dictionary), keys as Apple names them, boolean values.
    public var entitlements: [String: Bool]
    /// App groups (`com.apple.security.application-groups`): shared containers between an app
    /// and its extensions.
    public var appGroups: [String] = []
    /// An extension's app (the bundle whose `PlugIns` holds it), when it was read through it.
    public var containingApp: String? = nil
    /// The `NSExtension` dictionary's `NSExtensionPointIdentifier`, for extensions.
    public var extensionPoint: String?
    /// Extensions in `PlugIns/` that validated.
    public var extensions: [PluginBundle]
    /// Extensions in `PlugIns/` that did not, with the reason.
    public var invalidExtensions: [BGTaskError]
    /// CFBundleShortVersionString and CFBundleVersion (MetricKit's app and build versions).
    public var shortVersion: String? = nil
    public var buildVersion: String? = nil

    // `isDirectory` given: without it, Foundation stats the path to decide (every launch reads these).
    public var executableURL: URL { url.appendingPathComponent(executableName, isDirectory: false) }
    public var infoPlistURL: URL { url.appendingPathComponent("Info.plist", isDirectory: false) }

    public static let healthResearchEntitlement = "com.apple.developer.background-tasks.health-research"
    public static let continuedProcessingGPUEntitlement = "com.apple.developer.background-tasks.continued-processing.gpu"
    public static let appGroupsEntitlement = "com.apple.security.application-groups"

    /// True when `identifier` is in BGTaskSchedulerPermittedIdentifiers, directly or through a
    /// `prefix.*` wildcard (continued processing).
    public func permits(_ identifier: String) -> Bool {
        permittedIdentifiers.contains { Self.pattern($0, matches: identifier) }
    }

    /// True when `identifier` is permitted only through a wildcard entry.
    public func isContinuedProcessingIdentifier(_ identifier: String) -> Bool {
        permittedIdentifiers.contains { $0.hasSuffix(".*") && Self.pattern($0, matches: identifier) }
    }

    package static func pattern(_ pattern: String, matches identifier: String) -> Bool {
        PermittedIdentifiers.pattern(pattern, matches: identifier)
    }

    /// The background mode a task kind needs.
    public static func requiredMode(for kind: TaskKind) -> String? {
        switch kind {
        case .refresh: "fetch"
        case .processing, .healthResearch: "processing"
        case .continuedProcessing: nil
        }
    }

    /// The kind a task with `identifier` runs as when the caller does not say: from the
    /// wildcard (continued processing) or the single background mode that allows it.
    public func inferredKind(of identifier: String) throws(BGTaskError) -> TaskKind {
        guard permits(identifier) else {
            throw BGTaskError(.invalidRequest, file: infoPlistURL.path, key: "BGTaskSchedulerPermittedIdentifiers",
                              "'\(identifier)' is not permitted (permitted: \(permittedIdentifiers.joined(separator: ", ")))")
        }
        if isContinuedProcessingIdentifier(identifier) { return .continuedProcessing }
        switch (backgroundModes.contains("fetch"), backgroundModes.contains("processing")) {
        case (true, false): return .refresh
        case (false, true): return .processing
        case (true, true):
            throw BGTaskError(.invalidRequest, file: infoPlistURL.path, key: "UIBackgroundModes",
                              "both fetch and processing are enabled, so the type of '\(identifier)' is ambiguous: pass --type refresh|processing|health-research (or --task \(identifier):TYPE)")
        case (false, false):
            throw BGTaskError(.invalidRequest, file: infoPlistURL.path, key: "UIBackgroundModes",
                              "neither fetch nor processing is enabled, so '\(identifier)' cannot run as a refresh or processing task")
        }
    }

    /// The memberwise initializer, for the modules above this one.
    package init(kind: Kind, url: URL, identifier: String, executableName: String, permittedIdentifiers: [String], backgroundModes: Set<String>, mappedHandlers: [MappedHandler], entitlements: [String: Bool], appGroups: [String] = [], containingApp: String? = nil, extensionPoint: String? = nil, extensions: [PluginBundle], invalidExtensions: [BGTaskError]) {
        self.kind = kind
        self.url = url
        self.identifier = identifier
        self.executableName = executableName
        self.permittedIdentifiers = permittedIdentifiers
        self.backgroundModes = backgroundModes
        self.mappedHandlers = mappedHandlers
        self.entitlements = entitlements
        self.appGroups = appGroups
        self.containingApp = containingApp
        self.extensionPoint = extensionPoint
        self.extensions = extensions
        self.invalidExtensions = invalidExtensions
    }
}

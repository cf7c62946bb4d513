import BGTaskWire
import Foundation

/// Reads and validates bundles (the layout and keys of DESIGN.md). Every error names the file,
/// the key and what is wrong. Reading never loads plugin code: the executable is only checked
/// to exist and to be an ELF shared object.
public enum BundleReader {
    /// Reads the bundle at `url` (`Name.app` or `Name.appex`).
    public static func read(_ url: URL) throws(BGTaskError) -> PluginBundle {
        let kind: PluginBundle.Kind = url.pathExtension == "appex" ? .extension : .app
        return try read(url, kind: kind, containingApp: nil)
    }

    static func read(_ url: URL, kind: PluginBundle.Kind, containingApp: String?) throws(BGTaskError) -> PluginBundle {
        let bundlePath = url.path
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: bundlePath, isDirectory: &isDirectory) else {
            throw BGTaskError(.invalidBundle, file: bundlePath, "bundle not found")
        }
        guard isDirectory.boolValue else {
            throw BGTaskError(.invalidBundle, file: bundlePath, "a bundle is a directory holding Info.plist and the library")
        }
        let plistURL = url.appendingPathComponent("Info.plist")
        let plist = plistURL.path
        guard FileManager.default.fileExists(atPath: plist) else {
            throw BGTaskError(.invalidBundle, file: plist, "Info.plist is missing")
        }
        let data: Data
        do {
            data = try Data(contentsOf: plistURL)
        } catch {
            throw BGTaskError(.invalidBundle, file: plist, "cannot be read: \(error.localizedDescription)")
        }
        let root: Any
        do {
            root = try PropertyListSerialization.propertyList(from: data, options: [], format: nil)
        } catch {
            throw BGTaskError(.invalidBundle, file: plist, "not a valid property list: \(describe(error))")
        }
        guard let info = root as? [String: Any] else {
            throw BGTaskError(.invalidBundle, file: plist, "the top-level object must be a dictionary, found \(typeName(root))")
        }
        let fields = Fields(info: info, file: plist)

        let identifier = try fields.string("CFBundleIdentifier")
        guard isReverseDNS(identifier) else {
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleIdentifier",
                              "'\(identifier)' is not a reverse-DNS identifier (like com.example.feed: two or more dot-separated parts of letters, digits and hyphens)")
        }
        if let app = containingApp, !identifier.hasPrefix(app + ".") {
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleIdentifier",
                              "an extension's identifier must start with its app's ('\(app).'), found '\(identifier)'")
        }

        let executable = try fields.string("CFBundleExecutable")
        guard !executable.contains("/"), executable != "..", executable != "." else {
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleExecutable",
                              "'\(executable)' must be a file name inside the bundle, not a path")
        }
        try checkELF(url.appendingPathComponent(executable), plist: plist)

        let permitted = try fields.optionalStrings("BGTaskSchedulerPermittedIdentifiers") ?? []
        for (index, entry) in permitted.enumerated() {
            let key = "BGTaskSchedulerPermittedIdentifiers[\(index)]"
            let base = entry.hasSuffix(".*") ? String(entry.dropLast(2)) : entry
            guard isReverseDNS(base) else {
                throw BGTaskError(.invalidBundle, file: plist, key: key,
                                  "'\(entry)' is not a reverse-DNS task identifier (a wildcard may only end it, as in com.example.app.export.*)")
            }
        }
        let modes = Set(try fields.optionalStrings("UIBackgroundModes") ?? [])

        var entitlements: [String: Bool] = [:]
        var appGroups: [String] = []
        if let raw = info["Entitlements"] {
            guard let dictionary = raw as? [String: Any] else {
                throw BGTaskError(.invalidBundle, file: plist, key: "Entitlements", "must be a dictionary, found \(typeName(raw))")
            }
            for (name, value) in dictionary.sorted(by: { $0.key < $1.key }) {
                if name == PluginBundle.appGroupsEntitlement {
                    appGroups = try readAppGroups(value, file: plist)
                    continue
                }
                guard isBoolean(value), let flag = value as? Bool else {
                    throw BGTaskError(.invalidBundle, file: plist, key: "Entitlements.\(name)", "must be a boolean, found \(typeName(value))")
                }
                entitlements[name] = flag
            }
        }

        var mapped: [MappedHandler] = []
        if let raw = info["BGTaskHandlers"] {
            guard let dictionary = raw as? [String: Any] else {
                throw BGTaskError(.invalidBundle, file: plist, key: "BGTaskHandlers", "must be a dictionary of task identifier to C signature, found \(typeName(raw))")
            }
            for (taskIdentifier, value) in dictionary.sorted(by: { $0.key < $1.key }) {
                let key = "BGTaskHandlers.\(taskIdentifier)"
                guard let signature = value as? String else {
                    throw BGTaskError(.invalidBundle, file: plist, key: key, "must be a string like \"feed_refresh(identifier, data_directory) -> bool\", found \(typeName(value))")
                }
                guard permitted.contains(where: { PluginBundle.pattern($0, matches: taskIdentifier) }) else {
                    throw BGTaskError(.invalidBundle, file: plist, key: key, "'\(taskIdentifier)' is not in BGTaskSchedulerPermittedIdentifiers")
                }
                do {
                    mapped.append(try HandlerSignature.parse(signature, identifier: taskIdentifier))
                } catch {
                    throw BGTaskError(.invalidBundle, file: plist, key: key, error.description)
                }
            }
        }

        var extensionPoint: String?
        if kind == .extension {
            guard let raw = info["NSExtension"] else {
                throw BGTaskError(.invalidBundle, file: plist, key: "NSExtension", "missing: an extension's Info.plist needs an NSExtension dictionary")
            }
            guard let dictionary = raw as? [String: Any] else {
                throw BGTaskError(.invalidBundle, file: plist, key: "NSExtension", "must be a dictionary, found \(typeName(raw))")
            }
            if let point = dictionary["NSExtensionPointIdentifier"] {
                guard let text = point as? String else {
                    throw BGTaskError(.invalidBundle, file: plist, key: "NSExtension.NSExtensionPointIdentifier", "must be a string, found \(typeName(point))")
                }
                extensionPoint = text
            }
        }

        var extensions: [PluginBundle] = []
        var invalid: [BGTaskError] = []
        if kind == .app {
            let plugIns = url.appendingPathComponent("PlugIns")
            let entries = (try? FileManager.default.contentsOfDirectory(atPath: plugIns.path)) ?? []
            for name in entries.sorted() where name.hasSuffix(".appex") {
                do {
                    extensions.append(try read(plugIns.appendingPathComponent(name), kind: .extension, containingApp: identifier))
                } catch {
                    invalid.append(error)
                }
            }
        }

        return PluginBundle(
            kind: kind, url: url, identifier: identifier, executableName: executable,
            permittedIdentifiers: permitted, backgroundModes: modes, mappedHandlers: mapped,
            entitlements: entitlements, appGroups: appGroups, extensionPoint: extensionPoint,
            extensions: extensions, invalidExtensions: invalid)
    }

    /// The `com.apple.security.application-groups` entitlement: an array of `group.`-prefixed
    /// reverse-DNS identifiers, as Apple requires of iOS app groups.
    static func readAppGroups(_ value: Any, file: String) throws(BGTaskError) -> [String] {
        let key = "Entitlements.\(PluginBundle.appGroupsEntitlement)"
        guard let array = value as? [Any] else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "must be an array of app group identifiers (like group.com.example.feed), found \(typeName(value))")
        }
        var groups: [String] = []
        for (index, element) in array.enumerated() {
            guard let group = element as? String else {
                throw BGTaskError(.invalidBundle, file: file, key: "\(key)[\(index)]", "must be a string, found \(typeName(element))")
            }
            guard group.hasPrefix("group."), isReverseDNS(String(group.dropFirst("group.".count))) else {
                throw BGTaskError(.invalidBundle, file: file, key: "\(key)[\(index)]",
                                  "'\(group)' is not an app group identifier: 'group.' followed by a reverse-DNS name (like group.com.example.feed)")
            }
            if !groups.contains(group) { groups.append(group) }
        }
        return groups
    }

    /// Reverse DNS as Apple's bundle identifiers use it: two or more parts of [A-Za-z0-9-].
    public static func isReverseDNS(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count >= 2 else { return false }
        return parts.allSatisfy { part in
            !part.isEmpty && part.unicodeScalars.allSatisfy {
                ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "-"
            }
        }
    }

    static func checkELF(_ executable: URL, plist: String) throws(BGTaskError) {
        guard let handle = FileHandle(forReadingAtPath: executable.path) else {
            let exists = FileManager.default.fileExists(atPath: executable.path)
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleExecutable",
                              exists ? "'\(executable.lastPathComponent)' cannot be read"
                                     : "names '\(executable.lastPathComponent)', which is not in the bundle")
        }
        defer { try? handle.close() }
        let header = (try? handle.read(upToCount: 18)) ?? Data()
        guard header.count >= 18, header.prefix(4) == Data([0x7f, 0x45, 0x4c, 0x46]) else {
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleExecutable",
                              "'\(executable.lastPathComponent)' is not an ELF shared library")
        }
        // e_type (little-endian on the platforms we run on): 3 is ET_DYN.
        guard header[16] == 3, header[17] == 0 else {
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleExecutable",
                              "'\(executable.lastPathComponent)' is an ELF file but not a shared library (build it as a dynamic library product)")
        }
    }

    private static func describe(_ error: Error) -> String {
        let ns = error as NSError
        if let debug = ns.userInfo["NSDebugDescription"] as? String { return debug }
        return ns.localizedDescription
    }
}

/// True only for <true/> and <false/>. Foundation reads <integer>1</integer> as an NSNumber,
/// which also casts to Bool: it must not grant an entitlement. (Linux's Foundation gives a
/// plist boolean the dynamic type Bool.)
func isBoolean(_ value: Any) -> Bool {
    type(of: value) == Bool.self
}

func typeName(_ value: Any) -> String {
    switch value {
    case is String: "a string"
    case _ where isBoolean(value): "a boolean"
    case is NSNumber, is Int, is Double: "a number"
    case is [Any]: "an array"
    case is [String: Any]: "a dictionary"
    case is Data: "data"
    case is Date: "a date"
    default: "\(type(of: value))"
    }
}

/// Typed access to Info.plist keys with errors that name the key.
private struct Fields {
    let info: [String: Any]
    let file: String

    func string(_ key: String) throws(BGTaskError) -> String {
        guard let raw = info[key] else { throw BGTaskError(.invalidBundle, file: file, key: key, "missing") }
        guard let text = raw as? String else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "must be a string, found \(typeName(raw))")
        }
        guard !text.isEmpty else { throw BGTaskError(.invalidBundle, file: file, key: key, "is empty") }
        return text
    }

    func optionalStrings(_ key: String) throws(BGTaskError) -> [String]? {
        guard let raw = info[key] else { return nil }
        guard let array = raw as? [Any] else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "must be an array of strings, found \(typeName(raw))")
        }
        var strings: [String] = []
        for (index, element) in array.enumerated() {
            guard let text = element as? String, !text.isEmpty else {
                throw BGTaskError(.invalidBundle, file: file, key: "\(key)[\(index)]", "must be a non-empty string, found \(typeName(element))")
            }
            strings.append(text)
        }
        return strings
    }
}

import BGTaskSystem
import BGTaskModel
import Foundation
import Glibc

/// Reads and validates bundles (the layout and keys of DESIGN.md). Every error names the file,
/// the key and what is wrong. Reading never loads plugin code: the executable is only checked
/// to exist and to be an ELF shared object.
///
/// Reading never blocks and never leaves the bundle: Info.plist and the executable must be
/// regular files (a FIFO, device, socket or directory there is an invalid bundle, found without
/// opening it, and opened `O_NONBLOCK | O_NOFOLLOW` in case it changed since), reached directly or
/// through a symlink that stays inside the bundle. What a bundle may declare is bounded
/// (`Limits`), so that no bundle can make the host's answers about it too large to send.
public enum BundleReader {
    /// The most a bundle may declare, each refused by name with the limit.
    public enum Limits {
        public static let infoPlistBytes = 1 << 20
        public static let permittedIdentifiers = 1000
        /// Of CFBundleIdentifier, each permitted identifier, mapped handler and app group.
        public static let identifierBytes = InputLimits.identifierBytes
        public static let backgroundModes = 16
        public static let extensions = 64
        public static let appGroups = 64
    }

    /// Reads the bundle at `url` (`Name.app` or `Name.appex`).
    public static func read(_ url: URL) throws(BGTaskError) -> PluginBundle {
        let kind: PluginBundle.Kind = url.pathExtension == "appex" ? .extension : .app
        return try read(url, kind: kind, containingApp: nil)
    }

    /// Reads and validates an Info.plist as `read` would in a bundle, before there is one: the
    /// app's (or an extension's) declaration next to its sources, for a test that holds the app
    /// to it (BackgroundTasksTestKit). The executable is not looked for; `url` is the file's
    /// directory, and no extension is read.
    public static func read(infoPlist: URL, kind: PluginBundle.Kind = .app) throws(BGTaskError) -> PluginBundle {
        try read(infoPlist.deletingLastPathComponent(), kind: kind, containingApp: nil, infoPlistName: infoPlist.lastPathComponent)
    }

    package static func read(_ url: URL, kind: PluginBundle.Kind, containingApp: String?, infoPlistName: String? = nil) throws(BGTaskError) -> PluginBundle {
        // A declaration read without its bundle (`read(infoPlist:kind:)`) has no executable yet.
        let isBundle = infoPlistName == nil
        let bundlePath = url.path
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: bundlePath, isDirectory: &isDirectory) else {
            throw BGTaskError(.invalidBundle, file: bundlePath, "bundle not found")
        }
        guard isDirectory.boolValue else {
            throw BGTaskError(.invalidBundle, file: bundlePath, "a bundle is a directory holding Info.plist and the library")
        }
        let plistURL = url.appendingPathComponent(infoPlistName ?? "Info.plist")
        let plist = plistURL.path
        let data: Data
        switch openInBundle(plist, bundle: bundlePath) {
        case .missing:
            throw BGTaskError(.invalidBundle, file: plist, "Info.plist is missing")
        case .refused(let problem, let errno):
            throw BGTaskError(.invalidBundle, file: plist, errno: errno, "Info.plist \(problem)")
        case .opened(let fd, let size):
            defer { close(fd) }
            guard size <= Limits.infoPlistBytes else {
                throw BGTaskError(.invalidBundle, file: plist, "is \(size) bytes, over the limit of \(InputLimits.bytes(Limits.infoPlistBytes)) for an Info.plist")
            }
            guard let bytes = readAll(fd, limit: Limits.infoPlistBytes) else {
                throw BGTaskError(.invalidBundle, file: plist, errno: errno, "cannot be read, or grew past \(InputLimits.bytes(Limits.infoPlistBytes)) while it was")
            }
            data = Data(bytes)
        }
        let root: Any
        do {
            root = try PropertyListSerialization.propertyList(from: data, options: [], format: nil)
        } catch {
            // CoreFoundation reads a binary list it cannot parse as XML, and says so in XML's
            // terms ("Unexpected character b at line 1").
            if data.starts(with: Array("bplist".utf8)) {
                throw BGTaskError(.invalidBundle, file: plist, "a binary property list (bplist) that cannot be read: corrupt or truncated (\(data.count) bytes)")
            }
            throw BGTaskError(.invalidBundle, file: plist, "not a valid property list: \(describe(error))")
        }
        guard let info = root as? [String: Any] else {
            throw BGTaskError(.invalidBundle, file: plist, "the top-level object must be a dictionary, found \(typeName(root))")
        }
        let fields = Fields(info: info, file: plist)

        let identifier = try fields.string("CFBundleIdentifier")
        guard identifier.utf8.count <= Limits.identifierBytes else {
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleIdentifier",
                              "is \(identifier.utf8.count) bytes, over the limit of \(Limits.identifierBytes) bytes")
        }
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
        if isBundle { try checkELF(url.appendingPathComponent(executable), bundle: bundlePath, plist: plist) }

        let permitted = try fields.optionalStrings("BGTaskSchedulerPermittedIdentifiers", atMost: Limits.permittedIdentifiers) ?? []
        for (index, entry) in permitted.enumerated() {
            let key = "BGTaskSchedulerPermittedIdentifiers[\(index)]"
            guard entry.utf8.count <= Limits.identifierBytes else {
                throw BGTaskError(.invalidBundle, file: plist, key: key,
                                  "is \(entry.utf8.count) bytes, over the limit of \(Limits.identifierBytes) bytes for a task identifier")
            }
            let base = entry.hasSuffix(".*") ? String(entry.dropLast(2)) : entry
            guard isReverseDNS(base) else {
                throw BGTaskError(.invalidBundle, file: plist, key: key,
                                  "'\(entry)' is not a reverse-DNS task identifier (a wildcard may only end it, as in com.example.app.export.*)")
            }
        }
        let modes = Set(try fields.optionalStrings("UIBackgroundModes", atMost: Limits.backgroundModes) ?? [])

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
        if kind == .app && isBundle {
            let plugIns = url.appendingPathComponent("PlugIns")
            let entries = (try? FileManager.default.contentsOfDirectory(atPath: plugIns.path)) ?? []
            let appexes = entries.sorted().filter { $0.hasSuffix(".appex") }
            guard appexes.count <= Limits.extensions else {
                throw BGTaskError(.invalidBundle, file: plugIns.path,
                                  "holds \(appexes.count) extensions, over the limit of \(Limits.extensions)")
            }
            for name in appexes {
                do {
                    extensions.append(try read(plugIns.appendingPathComponent(name), kind: .extension, containingApp: identifier))
                } catch {
                    invalid.append(error)
                }
            }
        }

        var bundle = PluginBundle(
            kind: kind, url: url, identifier: identifier, executableName: executable,
            permittedIdentifiers: permitted, backgroundModes: modes, mappedHandlers: mapped,
            entitlements: entitlements, appGroups: appGroups, extensionPoint: extensionPoint,
            extensions: extensions, invalidExtensions: invalid)
        bundle.containingApp = containingApp
        // Versions, as MetricKit reports them: strings of at most 64 bytes, else left out.
        func version(_ key: String) -> String? {
            guard let text = info[key] as? String, !text.isEmpty, text.utf8.count <= 64 else { return nil }
            return text
        }
        bundle.shortVersion = version("CFBundleShortVersionString")
        bundle.buildVersion = version("CFBundleVersion")
        return bundle
    }

    /// The `com.apple.security.application-groups` entitlement: an array of `group.`-prefixed
    /// reverse-DNS identifiers, as Apple requires of iOS app groups.
    package static func readAppGroups(_ value: Any, file: String) throws(BGTaskError) -> [String] {
        let key = "Entitlements.\(PluginBundle.appGroupsEntitlement)"
        guard let array = value as? [Any] else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "must be an array of app group identifiers (like group.com.example.feed), found \(typeName(value))")
        }
        guard array.count <= Limits.appGroups else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "has \(array.count) entries, over the limit of \(Limits.appGroups)")
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

    package static func checkELF(_ executable: URL, bundle: String, plist: String) throws(BGTaskError) {
        let fd: Int32
        switch openInBundle(executable.path, bundle: bundle) {
        case .missing:
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleExecutable",
                              "names '\(executable.lastPathComponent)', which is not in the bundle")
        case .refused(let problem, let errno):
            throw BGTaskError(.invalidBundle, file: plist, key: "CFBundleExecutable", errno: errno,
                              "'\(executable.lastPathComponent)' \(problem)")
        case .opened(let opened, _):
            fd = opened
        }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 18)
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 18, 0) }
        let header = Data(bytes.prefix(max(0, count)))
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

    /// What opening a file of the bundle found.
    package enum Opened {
        case missing
        /// Not a file the host reads: what it is, and the errno when a call failed.
        case refused(String, errno: Int32?)
        /// A regular file, open for reading (the caller closes it), and its size.
        case opened(Int32, size: Int)
    }

    /// Opens `path`, a file of the bundle at `bundle`, for reading without ever blocking or
    /// leaving the bundle: its type is checked before it is opened (a FIFO would block open(),
    /// a device may act on it), a symlink is followed only to a file inside the bundle, and the
    /// descriptor is checked again (the entry may have been swapped in between).
    package static func openInBundle(_ path: String, bundle: String) -> Opened {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            return errno == ENOENT ? .missing : .refused("cannot be examined", errno: errno)
        }
        var target = path
        if info.st_mode & S_IFMT == S_IFLNK {
            guard let resolved = realpath(path, nil) else {
                return errno == ENOENT ? .missing : .refused("is a symbolic link that does not resolve", errno: errno)
            }
            target = String(cString: resolved)
            free(resolved)
            var root = bundle
            if let resolvedBundle = realpath(bundle, nil) {
                root = String(cString: resolvedBundle)
                free(resolvedBundle)
            }
            guard target.hasPrefix(root + "/") else {
                return .refused("is a symbolic link to \(target), outside the bundle", errno: nil)
            }
            guard stat(target, &info) == 0 else { return .refused("cannot be examined", errno: errno) }
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            return .refused("is \(fileKind(info.st_mode)), not a regular file", errno: nil)
        }
        let fd = open(target, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else { return .refused("cannot be read", errno: errno) }
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            let kind = fileKind(info.st_mode)
            close(fd)
            return .refused("is \(kind), not a regular file", errno: nil)
        }
        return .opened(fd, size: Int(info.st_size))
    }

    /// "a FIFO", "a directory", ... for a message.
    package static func fileKind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFIFO: "a FIFO"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        case S_IFSOCK: "a socket"
        case S_IFDIR: "a directory"
        case S_IFLNK: "a symbolic link"
        default: "a special file"
        }
    }

    /// All of `fd`, or nil on a read error or when it holds more than `limit` bytes (it may
    /// have grown since its size was checked).
    package static func readAll(_ fd: Int32, limit: Int) -> [UInt8]? {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while bytes.count <= limit {
            let n = retryingEINTR { chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) } }
            if n < 0 { return nil }
            if n == 0 { return bytes }
            bytes += chunk[0..<n]
        }
        return nil
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
package func isBoolean(_ value: Any) -> Bool {
    type(of: value) == Bool.self
}

package func typeName(_ value: Any) -> String {
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

    func optionalStrings(_ key: String, atMost limit: Int) throws(BGTaskError) -> [String]? {
        guard let raw = info[key] else { return nil }
        guard let array = raw as? [Any] else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "must be an array of strings, found \(typeName(raw))")
        }
        guard array.count <= limit else {
            throw BGTaskError(.invalidBundle, file: file, key: key, "has \(array.count) entries, over the limit of \(limit)")
        }
        var strings: [String] = []
        for (index, element) in array.enumerated() {
            guard let text = element as? String else {
                throw BGTaskError(.invalidBundle, file: file, key: "\(key)[\(index)]", "must be a non-empty string, found \(typeName(element))")
            }
            guard !text.isEmpty else {
                throw BGTaskError(.invalidBundle, file: file, key: "\(key)[\(index)]", "is an empty string: name an identifier")
            }
            strings.append(text)
        }
        return strings
    }
}

import BGTaskModel
/// The launch channel's encoding: one message per packet, a format byte, a message tag, then
/// the fields in declaration order — integers little-endian at fixed width, strings as a 32-bit
/// length and UTF-8, optionals behind a presence byte, arrays behind a 32-bit count.
///
/// Why not JSON: a no-op launch exchanges about ten messages, and each one through
/// Foundation's coders cost both processes tens of microseconds and, in a freshly forked child,
/// copy-on-write faults over the coders' code and generic metadata (about a fifth of the
/// runner's CPU in a no-op launch, measured with `perf`; see docs/decisions/binary-channel.md). The channel is
/// private to one build of the host and its runner, so the format needs no versioning beyond
/// the format byte that tells a message from garbage.
public protocol WireMessage: Sendable {
    func write(to writer: inout WireWriter)
    init(from reader: inout WireReader) throws(ChannelError)
}

/// The first byte of every packet (neither `{` nor printable text: garbage and JSON written to
/// the channel by plugin code are told apart at once).
let wireFormat: UInt8 = 0xB1

public struct WireWriter {
    public private(set) var bytes: [UInt8]

    public init() {
        bytes = [wireFormat]
        bytes.reserveCapacity(128)
    }

    public mutating func u8(_ value: UInt8) { bytes.append(value) }
    public mutating func bool(_ value: Bool) { bytes.append(value ? 1 : 0) }
    public mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    public mutating func u64(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
    public mutating func i32(_ value: Int32) { u32(UInt32(bitPattern: value)) }
    public mutating func i64(_ value: Int64) { u64(UInt64(bitPattern: value)) }
    public mutating func double(_ value: Double) { u64(value.bitPattern) }

    public mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { utf8 in
            u32(UInt32(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    public mutating func optional<T>(_ value: T?, _ write: (inout WireWriter, T) -> Void) {
        guard let value else { return bool(false) }
        bool(true)
        write(&self, value)
    }

    public mutating func array<T>(_ values: [T], _ write: (inout WireWriter, T) -> Void) {
        u32(UInt32(values.count))
        for value in values { write(&self, value) }
    }
}

/// Reads what `WireWriter` wrote; every read past the end or out of range throws `.malformed`
/// naming the field, so a garbage frame is reported, never trapped on.
public struct WireReader {
    private let bytes: [UInt8]
    private var offset: Int

    init(_ bytes: [UInt8]) throws(ChannelError) {
        guard bytes.first == wireFormat else {
            throw ChannelError(.malformed, "not a launch channel frame (format byte \(bytes.first.map { "0x" + String($0, radix: 16) } ?? "missing"))")
        }
        self.bytes = bytes
        offset = 1
    }

    /// True when every byte was read (a well-formed frame has no trailing bytes).
    var atEnd: Bool { offset == bytes.count }

    private mutating func take(_ count: Int, _ field: StaticString) throws(ChannelError) -> ArraySlice<UInt8> {
        guard count >= 0, count <= bytes.count - offset else {
            throw ChannelError(.malformed, "frame ends inside \(field) (byte \(offset) of \(bytes.count))")
        }
        defer { offset += count }
        return bytes[offset..<offset + count]
    }

    public mutating func u8(_ field: StaticString) throws(ChannelError) -> UInt8 { try take(1, field).first! }

    public mutating func bool(_ field: StaticString) throws(ChannelError) -> Bool {
        switch try u8(field) {
        case 0: return false
        case 1: return true
        case let other: throw ChannelError(.malformed, "\(field): \(other) is not a boolean")
        }
    }

    public mutating func u32(_ field: StaticString) throws(ChannelError) -> UInt32 {
        try take(4, field).reversed().reduce(0) { $0 << 8 | UInt32($1) }
    }

    public mutating func u64(_ field: StaticString) throws(ChannelError) -> UInt64 {
        try take(8, field).reversed().reduce(0) { $0 << 8 | UInt64($1) }
    }

    public mutating func i32(_ field: StaticString) throws(ChannelError) -> Int32 { Int32(bitPattern: try u32(field)) }
    public mutating func i64(_ field: StaticString) throws(ChannelError) -> Int64 { Int64(bitPattern: try u64(field)) }
    public mutating func double(_ field: StaticString) throws(ChannelError) -> Double { Double(bitPattern: try u64(field)) }

    public mutating func string(_ field: StaticString) throws(ChannelError) -> String {
        let count = Int(try u32(field))
        return String(decoding: try take(count, field), as: UTF8.self)
    }

    public mutating func optional<T>(_ field: StaticString, _ read: (inout WireReader) throws(ChannelError) -> T) throws(ChannelError) -> T? {
        try bool(field) ? try read(&self) : nil
    }

    public mutating func array<T>(_ field: StaticString, _ read: (inout WireReader) throws(ChannelError) -> T) throws(ChannelError) -> [T] {
        let count = Int(try u32(field))
        // Each element takes at least a byte: a count beyond what is left is garbage, not a
        // reason to reserve memory.
        guard count <= bytes.count - offset else {
            throw ChannelError(.malformed, "\(field): \(count) elements in \(bytes.count - offset) bytes")
        }
        var values: [T] = []
        values.reserveCapacity(count)
        for _ in 0..<count { values.append(try read(&self)) }
        return values
    }

    /// A one-byte case number of `T`'s `allCases`.
    public mutating func caseIndex<T: CaseIterable>(_ field: StaticString, of type: T.Type) throws(ChannelError) -> T {
        let index = Int(try u8(field))
        let cases = Array(T.allCases)
        guard index < cases.count else { throw ChannelError(.malformed, "\(field): no case \(index) in \(T.self)") }
        return cases[index]
    }
}

extension CaseIterable where Self: Equatable {
    /// This case's position in `allCases`, as `WireReader.caseIndex` reads it.
    var wireIndex: UInt8 { UInt8(Self.allCases.firstIndex(of: self).map { Self.allCases.distance(from: Self.allCases.startIndex, to: $0) } ?? 0) }
}

// MARK: The structures messages carry

extension TaskAssignment {
    func write(to writer: inout WireWriter) {
        writer.u64(task)
        writer.string(identifier)
        writer.u8(kind.wireIndex)
    }

    init(from reader: inout WireReader) throws(ChannelError) {
        self.init(task: try reader.u64("task"), identifier: try reader.string("identifier"),
                  kind: try reader.caseIndex("kind", of: TaskKind.self))
    }
}

extension MappedHandler {
    func write(to writer: inout WireWriter) {
        writer.string(identifier)
        writer.string(symbol)
        writer.array(arguments) { $0.u8($1.wireIndex) }
        writer.u8(result.wireIndex)
    }

    init(from reader: inout WireReader) throws(ChannelError) {
        self.init(identifier: try reader.string("identifier"), symbol: try reader.string("symbol"),
                  arguments: try reader.array("arguments") { (r: inout WireReader) throws(ChannelError) in try r.caseIndex("argument", of: Argument.self) },
                  result: try reader.caseIndex("result", of: Result.self))
    }
}

extension LaunchAssignment {
    func write(to writer: inout WireWriter) {
        writer.string(launchID)
        writer.u8(role.wireIndex)
        writer.string(bundleIdentifier)
        writer.string(bundlePath)
        writer.string(executablePath)
        writer.string(dataDirectory)
        writer.array(permittedIdentifiers) { $0.string($1) }
        writer.array(tasks) { $1.write(to: &$0) }
        writer.array(mappedHandlers) { $1.write(to: &$0) }
        writer.optional(eventJSON) { $0.string($1) }
        writer.u32(supportedResources)
        writer.optional(memoryBackstopBytes) { $0.u64($1) }
        writer.array(appGroups) {
            $0.string($1.identifier)
            $0.string($1.directory)
        }
        writer.bool(confine)
        writer.optional(identity) {
            $0.u32($1.uid)
            $0.u32($1.gid)
            $0.array($1.groups) { $0.u32($1) }
        }
        writer.optional(processLimit) { $0.u32($1) }
        writer.u64(expiresAtNs)
        writer.u32(backgroundRefreshStatus)
        writer.string(reason)
        writer.bool(suspendable)
        writer.u32(thermalState)
        writer.bool(lowPowerMode)
        writer.optional(metricsJSON) { $0.string($1) }
    }

    init(from reader: inout WireReader) throws(ChannelError) {
        self.init(
            launchID: try reader.string("launchID"), role: try reader.caseIndex("role", of: LaunchRole.self),
            bundleIdentifier: try reader.string("bundleIdentifier"), bundlePath: try reader.string("bundlePath"),
            executablePath: try reader.string("executablePath"), dataDirectory: try reader.string("dataDirectory"),
            permittedIdentifiers: try reader.array("permittedIdentifiers") { (r: inout WireReader) throws(ChannelError) in try r.string("permittedIdentifier") },
            tasks: try reader.array("tasks") { (r: inout WireReader) throws(ChannelError) in try TaskAssignment(from: &r) },
            mappedHandlers: try reader.array("mappedHandlers") { (r: inout WireReader) throws(ChannelError) in try MappedHandler(from: &r) },
            eventJSON: try reader.optional("eventJSON") { (r: inout WireReader) throws(ChannelError) in try r.string("eventJSON") },
            supportedResources: try reader.u32("supportedResources"),
            memoryBackstopBytes: try reader.optional("memoryBackstopBytes") { (r: inout WireReader) throws(ChannelError) in try r.u64("memoryBackstopBytes") },
            appGroups: try reader.array("appGroups") { (r: inout WireReader) throws(ChannelError) in
                AppGroup(identifier: try r.string("appGroup.identifier"), directory: try r.string("appGroup.directory"))
            })
        confine = try reader.bool("confine")
        identity = try reader.optional("identity") { (r: inout WireReader) throws(ChannelError) in
            LaunchIdentity(uid: try r.u32("identity.uid"), gid: try r.u32("identity.gid"),
                           groups: try r.array("identity.groups") { (g: inout WireReader) throws(ChannelError) in try g.u32("identity.group") })
        }
        processLimit = try reader.optional("processLimit") { (r: inout WireReader) throws(ChannelError) in try r.u32("processLimit") }
        expiresAtNs = try reader.u64("expiresAtNs")
        backgroundRefreshStatus = try reader.u32("backgroundRefreshStatus")
        reason = try reader.string("reason")
        suspendable = try reader.bool("suspendable")
        thermalState = try reader.u32("thermalState")
        lowPowerMode = try reader.bool("lowPowerMode")
        metricsJSON = try reader.optional("metricsJSON") { (r: inout WireReader) throws(ChannelError) in try r.string("metricsJSON") }
    }
}

extension TaskRequest {
    func write(to writer: inout WireWriter) {
        writer.u8(kind.wireIndex)
        writer.string(identifier)
        writer.optional(earliestBeginDate) { $0.double($1) }
        writer.bool(requiresNetworkConnectivity)
        writer.bool(requiresExternalPower)
        writer.i32(protectionType)
        writer.optional(title) { $0.string($1) }
        writer.optional(subtitle) { $0.string($1) }
        writer.bool(strategyFail)
        writer.u32(requiredResources)
    }

    init(from reader: inout WireReader) throws(ChannelError) {
        self.init(
            kind: try reader.caseIndex("kind", of: TaskKind.self), identifier: try reader.string("identifier"),
            earliestBeginDate: try reader.optional("earliestBeginDate") { (r: inout WireReader) throws(ChannelError) in try r.double("earliestBeginDate") },
            requiresNetworkConnectivity: try reader.bool("requiresNetworkConnectivity"),
            requiresExternalPower: try reader.bool("requiresExternalPower"),
            protectionType: try reader.i32("protectionType"),
            title: try reader.optional("title") { (r: inout WireReader) throws(ChannelError) in try r.string("title") },
            subtitle: try reader.optional("subtitle") { (r: inout WireReader) throws(ChannelError) in try r.string("subtitle") },
            strategyFail: try reader.bool("strategyFail"), requiredResources: try reader.u32("requiredResources"))
    }
}

// MARK: Notifications

extension JSONValue {
    /// Deeper values are refused when read (a frame of nested arrays must not exhaust the
    /// reader's stack); a request's `userInfo` is checked far below this before it is sent.
    static let wireDepth = 64

    func write(to writer: inout WireWriter) {
        switch self {
        case .null: writer.u8(0)
        case let .bool(value): writer.u8(1); writer.bool(value)
        case let .int(value): writer.u8(2); writer.i64(value)
        case let .double(value): writer.u8(3); writer.double(value)
        case let .string(value): writer.u8(4); writer.string(value)
        case let .array(values): writer.u8(5); writer.array(values) { $1.write(to: &$0) }
        case let .object(values):
            writer.u8(6)
            writer.array(values.sorted { $0.key < $1.key }) {
                $0.string($1.key)
                $1.value.write(to: &$0)
            }
        }
    }

    init(from reader: inout WireReader, depth: Int = 0) throws(ChannelError) {
        guard depth < Self.wireDepth else { throw ChannelError(.malformed, "user_info: nested deeper than \(Self.wireDepth) levels") }
        switch try reader.u8("user_info value") {
        case 0: self = .null
        case 1: self = .bool(try reader.bool("user_info value"))
        case 2: self = .int(try reader.i64("user_info value"))
        case 3: self = .double(try reader.double("user_info value"))
        case 4: self = .string(try reader.string("user_info value"))
        case 5: self = .array(try reader.array("user_info array") { (r: inout WireReader) throws(ChannelError) in try JSONValue(from: &r, depth: depth + 1) })
        case 6:
            let pairs = try reader.array("user_info object") { (r: inout WireReader) throws(ChannelError) in
                (try r.string("user_info key"), try JSONValue(from: &r, depth: depth + 1))
            }
            self = .object(Dictionary(pairs) { _, last in last })
        case let tag: throw ChannelError(.malformed, "user_info value: no JSON value has tag \(tag)")
        }
    }
}

extension NotificationRequest {
    func write(to writer: inout WireWriter) {
        writer.string(identifier)
        writer.string(content.title)
        writer.string(content.subtitle)
        writer.string(content.body)
        writer.optional(content.badge) { $0.i64($1) }
        writer.optional(content.sound) { $0.string($1) }
        JSONValue.object(content.userInfo).write(to: &writer)
        writer.string(content.threadIdentifier)
        writer.string(content.categoryIdentifier)
        switch trigger {
        case nil: writer.u8(0)
        case let .timeInterval(interval, repeats): writer.u8(1); writer.double(interval); writer.bool(repeats)
        case let .calendar(match, repeats):
            writer.u8(2)
            writer.array(match.fields) { $0.optional($1.value) { $0.i64(Int64($1)) } }
            writer.optional(match.calendar) { $0.string($1) }
            writer.optional(match.timeZone) { $0.string($1) }
            writer.bool(repeats)
        }
    }

    init(from reader: inout WireReader) throws(ChannelError) {
        let identifier = try reader.string("identifier")
        var content = NotificationContent(
            title: try reader.string("content.title"), subtitle: try reader.string("content.subtitle"), body: try reader.string("content.body"),
            badge: try reader.optional("content.badge") { (r: inout WireReader) throws(ChannelError) in try r.i64("content.badge") },
            sound: try reader.optional("content.sound") { (r: inout WireReader) throws(ChannelError) in try r.string("content.sound") })
        guard case let .object(userInfo) = try JSONValue(from: &reader) else { throw ChannelError(.malformed, "content.user_info: not an object") }
        content.userInfo = userInfo
        content.threadIdentifier = try reader.string("content.thread_identifier")
        content.categoryIdentifier = try reader.string("content.category_identifier")
        let trigger: NotificationTrigger?
        switch try reader.u8("trigger") {
        case 0: trigger = nil
        case 1: trigger = .timeInterval(try reader.double("trigger.time_interval"), repeats: try reader.bool("trigger.repeats"))
        case 2:
            var match = DateMatch()
            let values = try reader.array("trigger.date_components") { (r: inout WireReader) throws(ChannelError) -> Int? in
                try r.optional("trigger.date_component") { (c: inout WireReader) throws(ChannelError) in Int(truncatingIfNeeded: try c.i64("trigger.date_component")) }
            }
            guard values.count == 14 else { throw ChannelError(.malformed, "trigger.date_components: \(values.count) fields, not 14") }
            match.setFields(values)
            match.calendar = try reader.optional("trigger.calendar") { (r: inout WireReader) throws(ChannelError) in try r.string("trigger.calendar") }
            match.timeZone = try reader.optional("trigger.time_zone") { (r: inout WireReader) throws(ChannelError) in try r.string("trigger.time_zone") }
            trigger = .calendar(match, repeats: try reader.bool("trigger.repeats"))
        case let tag: throw ChannelError(.malformed, "trigger: no trigger has tag \(tag)")
        }
        self.init(identifier: identifier, content: content, trigger: trigger)
    }
}

extension NotificationEntry {
    func write(to writer: inout WireWriter) {
        request.write(to: &writer)
        writer.optional(date) { $0.double($1) }
    }

    init(from reader: inout WireReader) throws(ChannelError) {
        self.init(request: try NotificationRequest(from: &reader),
                  date: try reader.optional("date") { (r: inout WireReader) throws(ChannelError) in try r.double("date") })
    }
}

// MARK: The messages

extension ChildMessage: WireMessage {
    public func write(to writer: inout WireWriter) {
        switch self {
        case let .loading(path, at): writer.u8(1); writer.string(path); writer.u64(at)
        case let .registered(identifier, at): writer.u8(2); writer.string(identifier); writer.u64(at)
        case let .registerRefused(identifier, reason): writer.u8(3); writer.string(identifier); writer.string(reason)
        case let .launched(at): writer.u8(4); writer.u64(at)
        case let .launchFailed(error): writer.u8(5); writer.string(error)
        case let .taskBegan(task, at): writer.u8(6); writer.u64(task); writer.u64(at)
        case let .taskNotRegistered(task): writer.u8(7); writer.u64(task)
        case let .expirationDelivered(task, at, toApp): writer.u8(8); writer.u64(task); writer.u64(at); writer.bool(toApp)
        case let .taskCompleted(task, success, at): writer.u8(9); writer.u64(task); writer.bool(success); writer.u64(at)
        case let .fatal(error): writer.u8(10); writer.string(error)
        case let .log(level, message): writer.u8(11); writer.i32(level); writer.string(message)
        case let .submit(seq, request): writer.u8(12); writer.u64(seq); request.write(to: &writer)
        case let .cancel(seq, identifier): writer.u8(13); writer.u64(seq); writer.optional(identifier) { $0.string($1) }
        case let .pending(seq): writer.u8(14); writer.u64(seq)
        case let .progress(task, completed, total): writer.u8(15); writer.u64(task); writer.i64(completed); writer.i64(total)
        case let .title(task, title, subtitle): writer.u8(16); writer.u64(task); writer.string(title); writer.optional(subtitle) { $0.string($1) }
        case let .finished(at, descendants, peak): writer.u8(17); writer.u64(at); writer.bool(descendants); writer.u64(peak)
        case let .children(has): writer.u8(18); writer.bool(has)
        case let .idle(at, peak, cpu, hears, wakeups): writer.u8(25); writer.u64(at); writer.u64(peak); writer.u64(cpu); writer.bool(hears); writer.u64(wakeups)
        case let .sandbox(layers):
            writer.u8(19)
            writer.array(layers.sorted { $0.key < $1.key }) {
                $0.string($1.key)
                $0.bool($1.value.applied)
                $0.string($1.value.detail)
            }
        case let .backgroundTimeBegan(id, name, at): writer.u8(20); writer.u64(id); writer.optional(name) { $0.string($1) }; writer.u64(at)
        case let .backgroundTimeEnded(id, at): writer.u8(21); writer.u64(id); writer.u64(at)
        case let .backgroundTimeExpired(id, at, toApp): writer.u8(22); writer.u64(id); writer.u64(at); writer.bool(toApp)
        case let .deviceToken(seq): writer.u8(23); writer.u64(seq)
        case let .remoteNotificationCompleted(result, at): writer.u8(24); writer.u32(result); writer.u64(at)
        case let .notificationAuthorization(seq, options, request): writer.u8(30); writer.u64(seq); writer.u32(options); writer.bool(request)
        case let .notificationAdd(seq, request): writer.u8(31); writer.u64(seq); request.write(to: &writer)
        case let .notificationList(seq, delivered): writer.u8(32); writer.u64(seq); writer.bool(delivered)
        case let .notificationRemove(seq, delivered, identifiers):
            writer.u8(33); writer.u64(seq); writer.bool(delivered); writer.optional(identifiers) { $0.array($1) { $0.string($1) } }
        case let .transferCall(seq, json): writer.u8(40); writer.u64(seq); writer.string(json)
        case let .notificationPresented(identifier, options): writer.u8(34); writer.string(identifier); writer.u32(options)
        case .metricsTaken: writer.u8(35)
        }
    }

    public init(from reader: inout WireReader) throws(ChannelError) {
        switch try reader.u8("message") {
        case 1: self = .loading(path: try reader.string("path"), at: try reader.u64("at"))
        case 2: self = .registered(identifier: try reader.string("identifier"), at: try reader.u64("at"))
        case 3: self = .registerRefused(identifier: try reader.string("identifier"), reason: try reader.string("reason"))
        case 4: self = .launched(at: try reader.u64("at"))
        case 5: self = .launchFailed(error: try reader.string("error"))
        case 6: self = .taskBegan(task: try reader.u64("task"), at: try reader.u64("at"))
        case 7: self = .taskNotRegistered(task: try reader.u64("task"))
        case 8: self = .expirationDelivered(task: try reader.u64("task"), at: try reader.u64("at"), toApp: try reader.bool("toApp"))
        case 9: self = .taskCompleted(task: try reader.u64("task"), success: try reader.bool("success"), at: try reader.u64("at"))
        case 10: self = .fatal(error: try reader.string("error"))
        case 11: self = .log(level: try reader.i32("level"), message: try reader.string("message"))
        case 12: self = .submit(seq: try reader.u64("seq"), request: try TaskRequest(from: &reader))
        case 13: self = .cancel(seq: try reader.u64("seq"), identifier: try reader.optional("identifier") { (r: inout WireReader) throws(ChannelError) in try r.string("identifier") })
        case 14: self = .pending(seq: try reader.u64("seq"))
        case 15: self = .progress(task: try reader.u64("task"), completed: try reader.i64("completed"), total: try reader.i64("total"))
        case 16: self = .title(task: try reader.u64("task"), title: try reader.string("title"),
                               subtitle: try reader.optional("subtitle") { (r: inout WireReader) throws(ChannelError) in try r.string("subtitle") })
        case 17: self = .finished(at: try reader.u64("at"), descendants: try reader.bool("descendants"), peakResidentBytes: try reader.u64("peakResidentBytes"))
        case 18: self = .children(try reader.bool("children"))
        case 25: self = .idle(at: try reader.u64("at"), peakResidentBytes: try reader.u64("peakResidentBytes"), cpuNanoseconds: try reader.u64("cpuNanoseconds"),
                              hearsResumes: try reader.bool("hearsResumes"), wakeups: try reader.u64("wakeups"))
        case 19:
            let layers = try reader.array("layers") { (r: inout WireReader) throws(ChannelError) in
                (try r.string("layer"), SandboxLayer(applied: try r.bool("applied"), detail: try r.string("detail")))
            }
            self = .sandbox(Dictionary(layers) { _, last in last })
        case 20: self = .backgroundTimeBegan(id: try reader.u64("id"), name: try reader.optional("name") { (r: inout WireReader) throws(ChannelError) in try r.string("name") },
                                             at: try reader.u64("at"))
        case 21: self = .backgroundTimeEnded(id: try reader.u64("id"), at: try reader.u64("at"))
        case 22: self = .backgroundTimeExpired(id: try reader.u64("id"), at: try reader.u64("at"), toApp: try reader.bool("toApp"))
        case 23: self = .deviceToken(seq: try reader.u64("seq"))
        case 24: self = .remoteNotificationCompleted(result: try reader.u32("result"), at: try reader.u64("at"))
        case 30: self = .notificationAuthorization(seq: try reader.u64("seq"), options: try reader.u32("options"), request: try reader.bool("request"))
        case 31: self = .notificationAdd(seq: try reader.u64("seq"), request: try NotificationRequest(from: &reader))
        case 32: self = .notificationList(seq: try reader.u64("seq"), delivered: try reader.bool("delivered"))
        case 33: self = .notificationRemove(seq: try reader.u64("seq"), delivered: try reader.bool("delivered"),
                                            identifiers: try reader.optional("identifiers") { (r: inout WireReader) throws(ChannelError) in
                                                try r.array("identifiers") { (e: inout WireReader) throws(ChannelError) in try e.string("identifier") }
                                            })
        case 40: self = .transferCall(seq: try reader.u64("seq"), json: try reader.string("json"))
        case 34: self = .notificationPresented(identifier: try reader.string("identifier"), options: try reader.u32("options"))
        case 35: self = .metricsTaken
        case let tag: throw ChannelError(.malformed, "no child message has tag \(tag)")
        }
    }
}

extension ParentMessage: WireMessage {
    public func write(to writer: inout WireWriter) {
        switch self {
        case let .start(assignment): writer.u8(0); assignment.write(to: &writer)
        case let .resume(assignment): writer.u8(7); assignment.write(to: &writer)
        case let .expire(task, reason): writer.u8(1); writer.optional(task) { $0.u64($1) }; writer.string(reason)
        case let .reply(seq, status, message, requests):
            writer.u8(2)
            writer.u64(seq)
            writer.i32(status)
            writer.optional(message) { $0.string($1) }
            writer.optional(requests) { $0.array($1) { $1.write(to: &$0) } }
        case let .startTask(task): writer.u8(3); task.write(to: &writer)
        case .close: writer.u8(4)
        case .probeChildren: writer.u8(5)
        case let .deadline(expiresAtNs): writer.u8(6); writer.u64(expiresAtNs)
        case let .device(thermalState, lowPowerMode): writer.u8(8); writer.u32(thermalState); writer.bool(lowPowerMode)
        case let .notificationDelivered(entry): writer.u8(11); entry.write(to: &writer)
        case let .notificationReply(seq, status, message, authorization, notifications):
            writer.u8(10)
            writer.u64(seq)
            writer.i32(status)
            writer.optional(message) { $0.string($1) }
            writer.u32(authorization)
            writer.array(notifications) { $1.write(to: &$0) }
        case let .transferReply(seq, status, message, json):
            writer.u8(40)
            writer.u64(seq)
            writer.i32(status)
            writer.optional(message) { $0.string($1) }
            writer.optional(json) { $0.string($1) }
        case let .transferEvent(json): writer.u8(41); writer.string(json)
        }
    }

    public init(from reader: inout WireReader) throws(ChannelError) {
        switch try reader.u8("message") {
        case 0: self = .start(try LaunchAssignment(from: &reader))
        case 7: self = .resume(try LaunchAssignment(from: &reader))
        case 1: self = .expire(task: try reader.optional("task") { (r: inout WireReader) throws(ChannelError) in try r.u64("task") },
                               reason: try reader.string("reason"))
        case 2:
            self = .reply(
                seq: try reader.u64("seq"), status: try reader.i32("status"),
                message: try reader.optional("message") { (r: inout WireReader) throws(ChannelError) in try r.string("message") },
                requests: try reader.optional("requests") { (r: inout WireReader) throws(ChannelError) in
                    try r.array("requests") { (e: inout WireReader) throws(ChannelError) in try TaskRequest(from: &e) }
                })
        case 3: self = .startTask(try TaskAssignment(from: &reader))
        case 4: self = .close
        case 5: self = .probeChildren
        case 6: self = .deadline(expiresAtNs: try reader.u64("expiresAtNs"))
        case 8: self = .device(thermalState: try reader.u32("thermalState"), lowPowerMode: try reader.bool("lowPowerMode"))
        case 11: self = .notificationDelivered(try NotificationEntry(from: &reader))
        case 10:
            self = .notificationReply(
                seq: try reader.u64("seq"), status: try reader.i32("status"),
                message: try reader.optional("message") { (r: inout WireReader) throws(ChannelError) in try r.string("message") },
                authorization: try reader.u32("authorization"),
                notifications: try reader.array("notifications") { (r: inout WireReader) throws(ChannelError) in try NotificationEntry(from: &r) })
        case 40:
            self = .transferReply(
                seq: try reader.u64("seq"), status: try reader.i32("status"),
                message: try reader.optional("message") { (r: inout WireReader) throws(ChannelError) in try r.string("message") },
                json: try reader.optional("json") { (r: inout WireReader) throws(ChannelError) in try r.string("json") })
        case 41: self = .transferEvent(json: try reader.string("json"))
        case let tag: throw ChannelError(.malformed, "no parent message has tag \(tag)")
        }
    }
}

import BGTaskModel
import Foundation

/// The JSON the store writes at every launch's begin and end (the run record, the launch's task
/// list, the app's registered identifiers), written directly: the same bytes as `JSONEncoder`
/// with `.sortedKeys` (RecordJSONTests compares them, for a record with every field set).
///
/// `JSONEncoder` walks a record through Codable's generic containers into a tree of its own,
/// sorts each object's keys and then writes the tree: 45 µs of the host's CPU per launch (5 % of
/// it, in a drain of no-op launches), spent between a launch's reap and the next launch in its
/// slot. This writes a record in a few µs. A value it cannot write exactly as the encoder would
/// (a non-finite number, which the encoder refuses) makes it give up (nil), and the caller uses
/// the encoder, which then says what is wrong.
package struct RecordJSON {
    package private(set) var bytes: [UInt8] = []
    /// A number the encoder would refuse was met.
    package private(set) var failed = false
    private var needsComma = false

    package init(capacity: Int = 1024) { bytes.reserveCapacity(capacity) }

    package var text: String? { failed ? nil : String(decoding: bytes, as: UTF8.self) }

    // MARK: Structure

    package mutating func object(_ body: (inout RecordJSON) -> Void) {
        separate()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
        body(&self)
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    package mutating func array<S: Sequence>(_ elements: S, _ element: (inout RecordJSON, S.Element) -> Void) {
        separate()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
        for value in elements { element(&self, value) }
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    /// A key of the object being written; its value follows. Keys must come in `JSONEncoder`'s
    /// sorted order (byte order, for these ASCII keys).
    package mutating func key(_ name: StaticString) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        raw(name)
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// A key that is data (a dictionary's).
    package mutating func key(_ name: String) {
        string(name)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Literal text, as it is (no allocation, unlike `Array(text.utf8)`).
    private mutating func raw(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
        needsComma = true
    }

    // MARK: Values

    package mutating func string(_ value: String) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes.append(UInt8(ascii: "\\")); bytes.append(byte)
            case UInt8(ascii: "\\"): bytes.append(UInt8(ascii: "\\")); bytes.append(byte)
            // The encoder escapes the solidus unless told not to (`.withoutEscapingSlashes`).
            case UInt8(ascii: "/"): bytes.append(UInt8(ascii: "\\")); bytes.append(byte)
            case 0x08: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "b"))
            case 0x0C: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "f"))
            case 0x0A: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "n"))
            case 0x0D: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "r"))
            case 0x09: bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "t"))
            case 0x00..<0x20:
                raw("\\u00")
                bytes.append(Self.hex[Int(byte >> 4)])
                bytes.append(Self.hex[Int(byte & 0x0F)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private static let hex = Array("0123456789abcdef".utf8)

    package mutating func bool(_ value: Bool) {
        separate()
        if value { raw("true") } else { raw("false") }
    }

    package mutating func integer<I: BinaryInteger>(_ value: I) {
        separate()
        bytes.append(contentsOf: String(value).utf8)
    }

    /// As the encoder writes a Double: its shortest round-trip text, without a trailing ".0".
    package mutating func number(_ value: Double) {
        guard value.isFinite else {
            failed = true
            return
        }
        separate()
        var text = value.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        bytes.append(contentsOf: text.utf8)
    }

    package mutating func date(_ value: Date) { string(RunRecord.iso8601(value)) }

    /// A value already written as JSON (by `JSONEncoder`), as it is.
    package mutating func json<Bytes: Sequence<UInt8>>(_ encoded: Bytes) {
        separate()
        bytes.append(contentsOf: encoded)
    }

    // MARK: Optional fields (omitted when nil, as the synthesized `encodeIfPresent`)

    package mutating func field(_ name: StaticString, _ value: String?) { if let value { key(name); string(value) } }
    package mutating func field(_ name: StaticString, _ value: Double?) { if let value { key(name); number(value) } }
    package mutating func field(_ name: StaticString, _ value: Bool?) { if let value { key(name); bool(value) } }
    package mutating func field<I: BinaryInteger>(_ name: StaticString, _ value: I?) { if let value { key(name); integer(value) } }
    package mutating func field(_ name: StaticString, _ value: [String]?) { if let value { key(name); strings(value) } }

    package mutating func strings(_ values: [String]) { array(values) { $0.string($1) } }
}

extension RecordJSON {
    /// `[String]` as `JSONEncoder` writes it (an app's registered identifiers).
    package static func strings(_ values: [String]) -> String {
        var json = RecordJSON(capacity: 64)
        json.strings(values)
        return json.text!
    }

    /// A launch's task list as `JSONEncoder` with `.sortedKeys` writes it.
    package static func tasks(_ tasks: [TaskAssignment]) -> String {
        var json = RecordJSON(capacity: 64 * tasks.count + 2)
        json.array(tasks) { json, task in
            json.object { json in
                json.key("identifier"); json.string(task.identifier)
                json.key("kind"); json.string(task.kind.rawValue)
                json.key("task"); json.integer(task.task)
            }
        }
        return json.text!
    }

    /// A run record as `RunRecord.jsonData()` writes it; nil when a value is one the encoder
    /// would refuse (then ask it, for its error).
    package static func record(_ record: RunRecord) -> String? {
        var json = RecordJSON()
        json.object { json in
            json.key("app"); json.string(record.app)
            if let refused = record.appGroupsRefused {
                json.key("app_groups_refused"); json.texts(refused)
            }
            if let time = record.backgroundTime {
                json.key("background_time")
                json.array(time) { json, assertion in
                    json.object { json in
                        json.key("began_ms"); json.number(assertion.beganMs)
                        json.field("ended_ms", assertion.endedMs)
                        json.field("expiration_handled", assertion.expirationHandled)
                        json.field("expired_ms", assertion.expiredMs)
                        json.key("id"); json.integer(assertion.id)
                        json.field("name", assertion.name)
                        json.key("outcome"); json.string(assertion.outcome.rawValue)
                    }
                }
            }
            json.key("budget_ms"); json.number(record.budgetMs)
            json.key("bundle_path"); json.string(record.bundlePath)
            json.key("cpu_ms"); json.number(record.cpuMs)
            if let disk = record.disk {
                json.key("disk")
                json.object { json in
                    json.field("bytes", disk.bytes)
                    json.field("enforcement", disk.enforcement)
                    json.field("exceeded", disk.exceeded)
                    json.field("inodes", disk.inodes)
                    json.field("log_error", disk.logError)
                    json.key("quota_bytes"); json.integer(disk.quotaBytes)
                    json.key("quota_inodes"); json.integer(disk.quotaInodes)
                }
            }
            if let energy = record.energy {
                json.key("energy")
                json.object { json in
                    json.field("cpu_limit", energy.cpuLimit)
                    json.key("disk_read_bytes"); json.integer(energy.diskReadBytes)
                    json.key("disk_written_bytes"); json.integer(energy.diskWrittenBytes)
                    if let bytes = energy.networkReceivedBytes { json.key("network_received_bytes"); json.integer(bytes) }
                    if let bytes = energy.networkSentBytes { json.key("network_sent_bytes"); json.integer(bytes) }
                    json.key("wakeups"); json.integer(energy.wakeups)
                }
            }
            json.field("error", record.error)
            json.field("exit_status", record.exitStatus)
            json.field("expiration_reason", record.expirationReason)
            json.field("expired_at_ms", record.expiredAtMs)
            json.key("grace_ms"); json.number(record.graceMs)
            json.key("launch_id"); json.string(record.launchID)
            json.field("launcher", record.launcher)
            if let omitted = record.listEntriesOmitted { json.key("list_entries_omitted"); json.counts(omitted) }
            json.field("log", record.log)
            json.field("log_bytes_dropped", record.logBytesDropped)
            json.field("log_truncated", record.logTruncated)
            json.key("memory_limit_bytes"); json.integer(record.memoryLimitBytes)
            json.key("memory_mechanism"); json.string(record.memoryMechanism)
            if let refused = record.messagesRefused { json.key("messages_refused"); json.counts(refused) }
            json.field("metrics_delivered", record.metricsDelivered)
            json.field("notifications_added", record.notificationsAdded)
            if let presented = record.notificationsPresented {
                json.key("notifications_presented"); json.texts(presented)
            }
            json.key("peak_rss_bytes"); json.integer(record.peakRSSBytes)
            json.key("pid"); json.integer(record.pid)
            json.field("previous_process", record.previousProcess)
            json.field("process_launches", record.processLaunches)
            json.field("process_limit", record.processLimit)
            if let push = record.push {
                json.key("push")
                json.object { json in
                    json.field("completed_ms", push.completedMs)
                    json.key("delivered_after_ms"); json.number(push.deliveredAfterMs)
                    json.key("id"); json.string(push.id)
                    json.key("received_at"); json.date(push.receivedAt)
                    json.field("result", push.result)
                }
            }
            json.key("reason"); json.string(record.reason)
            json.key("refused_registrations"); json.strings(record.refusedRegistrations)
            json.field("refused_registrations_omitted", record.refusedRegistrationsOmitted)
            json.key("registered"); json.strings(record.registered)
            json.field("resumed", record.resumed)
            if let sandbox = record.sandbox {
                json.key("sandbox")
                // A dictionary's keys, sorted as the encoder sorts them.
                json.object { json in
                    for name in sandbox.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
                        let layer = sandbox[name]!
                        json.key(name)
                        json.object { json in
                            json.key("applied"); json.bool(layer.applied)
                            json.key("detail"); json.string(layer.detail)
                        }
                    }
                }
            }
            json.field("signal", record.signal)
            json.key("started_at"); json.date(record.startedAt)
            json.key("submitted")
            json.array(record.submitted) { json, request in json.request(request) }
            json.field("submitted_omitted", record.submittedOmitted)
            json.field("suspended_ms", record.suspendedMs)
            json.key("tasks")
            json.array(record.tasks) { json, task in
                json.object { json in
                    json.field("completed_ms", task.completedMs)
                    json.field("expiration_handled", task.expirationHandled)
                    json.field("expired_ms", task.expiredMs)
                    json.key("identifier"); json.string(task.identifier)
                    json.key("outcome"); json.string(task.outcome.rawValue)
                    json.field("started_ms", task.startedMs)
                    json.field("success", task.success)
                    json.key("type"); json.string(task.type.rawValue)
                }
            }
            json.key("termination"); json.string(record.termination.rawValue)
            if let transfers = record.transfers {
                json.key("transfers")
                json.object { json in
                    json.key("delivered"); json.strings(transfers.delivered)
                    json.field("sessions", transfers.sessions)
                }
            }
            json.key("wall_ms"); json.number(record.wallMs)
        }
        return json.text
    }

    /// `[String: String]` as the encoder writes it: keys sorted by their UTF-8 bytes.
    private mutating func texts(_ texts: [String: String]) {
        object { json in
            for key in texts.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
                json.key(key); json.string(texts[key]!)
            }
        }
    }

    /// `[String: Int]` as the encoder writes it: keys sorted by their UTF-8 bytes.
    private mutating func counts(_ counts: [String: Int]) {
        object { json in
            for key in counts.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
                json.key(key); json.integer(counts[key]!)
            }
        }
    }

    /// A submitted request as `TaskRequest.encode` writes it for a record (what its kind does
    /// not have left out: `TaskRequest.omitsInapplicableFields`).
    private mutating func request(_ request: TaskRequest) {
        object { json in
            json.field("earliestBeginDate", request.earliestBeginDate)
            json.key("identifier"); json.string(request.identifier)
            json.key("kind"); json.string(request.kind.rawValue)
            if request.kind == .healthResearch {
                json.key("protectionType"); json.integer(request.protectionType)
            }
            if request.kind == .continuedProcessing {
                json.key("requiredResources"); json.integer(request.requiredResources)
            }
            if request.kind.isProcessing {
                json.key("requiresExternalPower"); json.bool(request.requiresExternalPower)
                json.key("requiresNetworkConnectivity"); json.bool(request.requiresNetworkConnectivity)
            }
            if request.kind == .continuedProcessing {
                json.key("strategyFail"); json.bool(request.strategyFail)
                json.field("subtitle", request.subtitle)
                json.field("title", request.title)
            }
        }
    }
}

import BGTaskModel
/// The zygote's protocol (`bgtask-runner --zygote` and the host, on a SOCK_SEQPACKET pair), in
/// the launch channel's encoding: one message per packet. The zygote answers `ready` once, at
/// start, with its first spare. The host hands a launch (a `ZygoteRequest` with three
/// descriptors, SCM_RIGHTS: the launch channel, stdin, the log) to the spare it holds, straight
/// through the spare's socket, and then sends the zygote a `ZygoteSpareRequest`, answered by
/// `spare`; without a spare it sends the launch to the zygote, answered by `launched` (or
/// `failed`). Every answer that names a spare comes with that spare's socket (SCM_RIGHTS): the
/// zygote keeps none.
public struct ZygoteRequest: WireMessage, Equatable {
    /// Variables the launch's environment sets over the zygote's own.
    public var environment: [String: String]

    public init(environment: [String: String]) { self.environment = environment }

    public func write(to writer: inout WireWriter) {
        writer.u8(0)
        writer.array(environment.sorted { $0.key < $1.key }) { writer, entry in
            writer.string(entry.key)
            writer.string(entry.value)
        }
    }

    public init(from reader: inout WireReader) throws(ChannelError) {
        guard try reader.u8("message") == 0 else { throw ChannelError(.malformed, "not a zygote request") }
        let pairs = try reader.array("environment") { (r: inout WireReader) throws(ChannelError) in
            (try r.string("key"), try r.string("value"))
        }
        environment = Dictionary(pairs) { _, last in last }
    }
}

/// The host took the spare: the zygote forks the next one and answers `spare` with its socket.
public struct ZygoteSpareRequest: WireMessage, Equatable {
    /// This request's message tag (a launch's is 0).
    public static let tag: UInt8 = 1

    public init() {}

    public func write(to writer: inout WireWriter) { writer.u8(Self.tag) }

    public init(from reader: inout WireReader) throws(ChannelError) {
        guard try reader.u8("message") == Self.tag else { throw ChannelError(.malformed, "not a zygote spare request") }
    }
}

public enum ZygoteAnswer: WireMessage, Equatable {
    /// The zygote started: its thread count (the host requires 1: forking it must be safe) and
    /// its first spare's pid (0: none).
    case ready(threads: Int32, spare: Int32)
    /// A request's launch: its process (the host's child), and the spare the zygote made next
    /// (0: none; the host reaps spares that die unused).
    case launched(pid: Int32, spare: Int32)
    /// A request that could not be served, and why.
    case failed(String)
    /// A `ZygoteSpareRequest`'s spare (0: none could be forked).
    case spare(pid: Int32)

    public func write(to writer: inout WireWriter) {
        switch self {
        case let .ready(threads, spare): writer.u8(0); writer.i32(threads); writer.i32(spare)
        case let .launched(pid, spare): writer.u8(1); writer.i32(pid); writer.i32(spare)
        case let .failed(reason): writer.u8(2); writer.string(reason)
        case let .spare(pid): writer.u8(3); writer.i32(pid)
        }
    }

    public init(from reader: inout WireReader) throws(ChannelError) {
        switch try reader.u8("message") {
        case 0: self = .ready(threads: try reader.i32("threads"), spare: try reader.i32("spare"))
        case 1: self = .launched(pid: try reader.i32("pid"), spare: try reader.i32("spare"))
        case 2: self = .failed(try reader.string("reason"))
        case 3: self = .spare(pid: try reader.i32("pid"))
        case let tag: throw ChannelError(.malformed, "no zygote answer has tag \(tag)")
        }
    }
}

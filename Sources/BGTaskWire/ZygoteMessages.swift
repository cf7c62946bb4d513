import BGTaskModel
/// The zygote's protocol (`bgtask-runner --zygote` and the host, on a SOCK_SEQPACKET pair), in
/// the launch channel's encoding: one message per packet. The host sends a `ZygoteRequest`,
/// with three descriptors (SCM_RIGHTS: the launch channel, stdin, the log); the zygote answers
/// `ready` once, at start, then `launched` (or `failed`) for each request.
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

public enum ZygoteAnswer: WireMessage, Equatable {
    /// The zygote started: its thread count (the host requires 1: forking it must be safe) and
    /// its first spare's pid (0: none).
    case ready(threads: Int32, spare: Int32)
    /// A request's launch: its process (the host's child), and the spare the zygote made next
    /// (0: none; the host reaps spares that die unused).
    case launched(pid: Int32, spare: Int32)
    /// A request that could not be served, and why.
    case failed(String)

    public func write(to writer: inout WireWriter) {
        switch self {
        case let .ready(threads, spare): writer.u8(0); writer.i32(threads); writer.i32(spare)
        case let .launched(pid, spare): writer.u8(1); writer.i32(pid); writer.i32(spare)
        case let .failed(reason): writer.u8(2); writer.string(reason)
        }
    }

    public init(from reader: inout WireReader) throws(ChannelError) {
        switch try reader.u8("message") {
        case 0: self = .ready(threads: try reader.i32("threads"), spare: try reader.i32("spare"))
        case 1: self = .launched(pid: try reader.i32("pid"), spare: try reader.i32("spare"))
        case 2: self = .failed(try reader.string("reason"))
        case let tag: throw ChannelError(.malformed, "no zygote answer has tag \(tag)")
        }
    }
}

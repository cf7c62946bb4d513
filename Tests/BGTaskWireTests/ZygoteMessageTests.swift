import BGTaskModel
import BGTaskWire
import Testing

/// The zygote's protocol: every message survives its encoding, and bytes that are not one are
/// refused with an error, never trapped on.
struct ZygoteMessageTests {
    func roundTrip<M: WireMessage & Equatable>(_ message: M) throws -> M {
        var writer = WireWriter()
        message.write(to: &writer)
        return try LaunchChannel.decode(M.self, from: writer.bytes)
    }

    @Test func requestsAndAnswersRoundTrip() throws {
        let request = ZygoteRequest(environment: ["HOME": "/state/containers/a", "BGTASK_LAUNCH_ID": "x", "EMPTY": "", "ÜNÏ": "✓=="])
        #expect(try roundTrip(request) == request)
        for answer in [ZygoteAnswer.ready(threads: 1, spare: 4242), .launched(pid: 17, spare: 0), .failed("clone: Resource temporarily unavailable"), .spare(pid: 99)] {
            #expect(try roundTrip(answer) == answer)
        }
    }

    @Test func garbageIsRefusedByName() throws {
        var writer = WireWriter()
        ZygoteAnswer.launched(pid: 1, spare: 2).write(to: &writer)
        let truncated = Array(writer.bytes.dropLast())
        #expect(throws: ChannelError.self) { try LaunchChannel.decode(ZygoteAnswer.self, from: truncated) }
        #expect(throws: ChannelError.self) { try LaunchChannel.decode(ZygoteAnswer.self, from: Array("pid 12 spare 13".utf8)) }
        var unknown = WireWriter()
        unknown.u8(9)
        do {
            _ = try LaunchChannel.decode(ZygoteAnswer.self, from: unknown.bytes)
            Issue.record("tag 9 was accepted")
        } catch {
            #expect(error.detail.contains("no zygote answer has tag 9"), "\(error.detail)")
        }
        // A request is never mistaken for an answer's tags beyond its own.
        var answer = WireWriter()
        ZygoteAnswer.failed("x").write(to: &answer)
        #expect(throws: ChannelError.self) { try LaunchChannel.decode(ZygoteRequest.self, from: answer.bytes) }
        // A spare request is neither a launch's request nor an answer.
        var spare = WireWriter()
        ZygoteSpareRequest().write(to: &spare)
        #expect(try LaunchChannel.decode(ZygoteSpareRequest.self, from: spare.bytes) == ZygoteSpareRequest())
        #expect(throws: ChannelError.self) { try LaunchChannel.decode(ZygoteRequest.self, from: spare.bytes) }
        var launch = WireWriter()
        ZygoteRequest(environment: [:]).write(to: &launch)
        #expect(throws: ChannelError.self) { try LaunchChannel.decode(ZygoteSpareRequest.self, from: launch.bytes) }
    }
}

@testable import BGTaskHost
import BGTaskControl
import BGTaskStore
import BGTaskModel
import BGTaskWire
import Foundation
import Testing

/// One model, several encodings: a task request crosses the launch channel (binary), the control
/// socket (JSON, read by the control server's fast reader) and the store (an SQL row). Each
/// encoding must carry every field. The field list below is the model's as this test knows it:
/// a field added to `TaskRequest` fails the first expectation until it is added here, and then
/// the round trips fail until every encoding carries it.
@Suite struct TaskRequestEncodingTests {
    /// Every field set to something other than its default.
    static let sample = TaskRequest(
        kind: .healthResearch, identifier: "com.example.study.upload", earliestBeginDate: 1_900_000_000.5,
        requiresNetworkConnectivity: true, requiresExternalPower: true, protectionType: 3,
        title: "Uploading", subtitle: "2 of 7 ✓", strategyFail: true, requiredResources: 1)

    @Test func theModelsFieldsAreTheOnesTheEncodingsCarry() {
        let fields = Mirror(reflecting: Self.sample).children.compactMap(\.label)
        #expect(fields == ["kind", "identifier", "earliestBeginDate", "requiresNetworkConnectivity", "requiresExternalPower",
                           "protectionType", "title", "subtitle", "strategyFail", "requiredResources"],
                "TaskRequest changed: add the new field to this list, then to every encoding below")
        // Not one is at its default in the sample (a default would round-trip by accident).
        let bare = TaskRequest(kind: .refresh, identifier: "")
        for (field, bareField) in zip(Mirror(reflecting: Self.sample).children, Mirror(reflecting: bare).children) {
            #expect("\(field.value)" != "\(bareField.value)", "\(field.label ?? "?") is at its default in the sample")
        }
    }

    @Test func theLaunchChannelCarriesEveryField() throws {
        var writer = WireWriter()
        ParentMessage.reply(seq: 1, status: 0, message: nil, requests: [Self.sample]).write(to: &writer)
        let decoded = try LaunchChannel.decode(ParentMessage.self, from: writer.bytes)
        #expect(decoded == .reply(seq: 1, status: 0, message: nil, requests: [Self.sample]))
    }

    @Test func theControlProtocolCarriesEveryFieldThroughBothReaders() throws {
        let data = try ControlCodec.encode(.submit(app: "com.example.study", request: Self.sample))
        // The control server's fast reader, and the JSON decoder it falls back to.
        #expect(ControlRequestParser.parse(data)?.request == Self.sample)
        #expect(try JSONDecoder.control.decode(ControlRequest.self, from: data).request == Self.sample)
    }

    @Test func theStoreCarriesEveryField() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-encoding-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try PendingRequestStore(directory: directory)
        #expect(try store.submit(app: "com.example.study", request: Self.sample, at: Date(), rules: nil) == nil)
        #expect(try store.pending(app: "com.example.study").map(\.request) == [Self.sample])
        // And again from the file, as a restarted host reads it.
        let reopened = try PendingRequestStore(directory: directory)
        #expect(try reopened.pending(app: "com.example.study").map(\.request) == [Self.sample])
    }
}

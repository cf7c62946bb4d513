@testable import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Testing

/// `TaskRequest`'s JSON: whole on the control protocol (the control server's fast reader
/// needs every key), without the fields a request's kind does not have where people read it.
@Suite struct TaskRequestJSONTests {
    /// Every field set, including the ones the request's kind does not have.
    static func request(_ kind: TaskKind) -> TaskRequest {
        TaskRequest(
            kind: kind, identifier: "com.example.a.\(kind.rawValue)", earliestBeginDate: 1_000_000,
            requiresNetworkConnectivity: true, requiresExternalPower: true, protectionType: 1,
            title: "Export", subtitle: "3 files", strategyFail: true, requiredResources: 1)
    }

    static func keys(_ data: Data) throws -> [String] {
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        return object.keys.sorted()
    }

    static func compact(_ request: TaskRequest) throws -> Data {
        let encoder = JSONEncoder()
        encoder.userInfo[TaskRequest.omitsInapplicableFields] = true
        return try encoder.encode(request)
    }

    @Test(arguments: [
        (TaskKind.refresh, ["earliestBeginDate", "identifier", "kind"]),
        (.processing, ["earliestBeginDate", "identifier", "kind", "requiresExternalPower", "requiresNetworkConnectivity"]),
        (.healthResearch, ["earliestBeginDate", "identifier", "kind", "protectionType", "requiresExternalPower",
                           "requiresNetworkConnectivity"]),
        (.continuedProcessing, ["earliestBeginDate", "identifier", "kind", "requiredResources", "strategyFail", "subtitle", "title"]),
    ])
    func peopleSeeOnlyTheFieldsOfTheKind(kind: TaskKind, expected: [String]) throws {
        #expect(try Self.keys(Self.compact(Self.request(kind))) == expected)
    }

    @Test func theCompactFormDecodesWithDefaultsForWhatItLeftOut() throws {
        for kind in TaskKind.allCases {
            let full = Self.request(kind)
            var expected = TaskRequest(kind: kind, identifier: full.identifier, earliestBeginDate: full.earliestBeginDate)
            switch kind {
            case .refresh: break
            case .processing, .healthResearch:
                expected.requiresNetworkConnectivity = true
                expected.requiresExternalPower = true
                if kind == .healthResearch { expected.protectionType = 1 }
            case .continuedProcessing:
                (expected.title, expected.subtitle, expected.strategyFail, expected.requiredResources) = ("Export", "3 files", true, 1)
            }
            #expect(try JSONDecoder().decode(TaskRequest.self, from: Self.compact(full)) == expected, "\(kind)")
        }
        let bare = try JSONDecoder().decode(TaskRequest.self, from: Data(#"{"kind":"refresh","identifier":"a.b.c"}"#.utf8))
        #expect(bare == TaskRequest(kind: .refresh, identifier: "a.b.c"))
    }

    @Test func theControlProtocolCarriesEveryFieldAndItsFastReaderAcceptsIt() throws {
        let every = ["earliestBeginDate", "identifier", "kind", "protectionType", "requiredResources", "requiresExternalPower",
                     "requiresNetworkConnectivity", "strategyFail", "subtitle", "title"]
        for kind in TaskKind.allCases {
            let request = Self.request(kind)
            #expect(try Self.keys(JSONEncoder().encode(request)) == every)
            #expect(try JSONDecoder().decode(TaskRequest.self, from: JSONEncoder().encode(request)) == request)
            let control = ControlCommand.submit(app: "com.example.a", request: TaskRequest(kind: kind, identifier: "a.b.c")).wire
            #expect(ControlRequestParser.parse(try JSONEncoder.control.encode(control)) == control, "\(kind)")
        }
    }

    @Test func aRequestWithoutKindOrIdentifierOrWithAWrongTypeIsAnError() {
        for json in [#"{"identifier":"a.b.c"}"#, #"{"kind":"refresh"}"#, #"{"kind":"refresh","identifier":"a","strategyFail":null}"#,
                     #"{"kind":"refresh","identifier":"a","requiredResources":-1}"#, #"{"kind":"sometimes","identifier":"a"}"#] {
            #expect(throws: DecodingError.self, "\(json)") { try JSONDecoder().decode(TaskRequest.self, from: Data(json.utf8)) }
        }
    }
}

import BGTaskModel
import BGTaskWire
import CBGTaskPluginABI
import Testing

/// A task request's C form (`bgtask_request`): every field its kind has survives the trip to C
/// and back (what `pending` lends a plugin, and what the runner reads when a plugin submits).
/// The expected field list is the model's (TaskRequestEncodingTests pins it): a field added to
/// the model and not to the C form fails here.
struct TaskRequestABITests {
    /// Every field its kind has set to something other than its default; what it does not have
    /// at the default (the C form does not carry it, and the model's default comes back).
    static func sample(_ kind: TaskKind) -> TaskRequest {
        var request = TaskRequest(kind: kind, identifier: "com.example.app.\(kind.rawValue)", earliestBeginDate: 1_900_000_000.25)
        switch kind {
        case .refresh:
            break
        case .processing:
            request.requiresNetworkConnectivity = true
            request.requiresExternalPower = true
        case .healthResearch:
            request.requiresNetworkConnectivity = true
            request.requiresExternalPower = true
            request.protectionType = 3
        case .continuedProcessing:
            request.title = "Exporting"
            request.subtitle = "2 of 7 ✓"
            request.strategyFail = true
            request.requiredResources = 1
        }
        return request
    }

    @Test(arguments: TaskKind.allCases)
    func everyFieldOfTheKindCrossesToCAndBack(kind: TaskKind) throws {
        let request = Self.sample(kind)
        var back: TaskRequest?
        request.withABI { pointer in
            #expect(pointer.pointee.size == UInt32(MemoryLayout<bgtask_request>.size))
            back = TaskRequest(abi: pointer.pointee)
        }
        #expect(back == request)
    }

    @Test func aRequestWithNoDateOrIdentifierOrAnUnknownKind() {
        var request = Self.sample(.refresh)
        request.earliestBeginDate = nil
        var back: TaskRequest?
        request.withABI { back = TaskRequest(abi: $0.pointee) }
        #expect(back?.earliestBeginDate == nil, "NaN in C is no date")
        var raw = bgtask_request()
        raw.size = UInt32(MemoryLayout<bgtask_request>.size)
        raw.type = 1
        #expect(TaskRequest(abi: raw) == nil, "no identifier")
        "com.example.x".withCString { identifier in
            raw.identifier = identifier
            raw.type = 99
            #expect(TaskRequest(abi: raw) == nil, "an unknown kind")
        }
    }
}

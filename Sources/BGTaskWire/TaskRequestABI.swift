import BGTaskModel
import CBGTaskPluginABI

/// A task request's C form (`bgtask_request` in bgtask/plugin.h), the one place it is made and
/// read: the runner reads what a plugin submits, and lends what `pending` returns. Fields a
/// request's kind does not have are not lent (a title only for continued processing).
extension TaskRequest {
    public init?(abi request: bgtask_request) {
        guard let identifier = request.identifier,
              let kind = TaskKind(abiValue: Int32(bitPattern: request.type)) else { return nil }
        self.init(
            kind: kind,
            identifier: String(cString: identifier),
            earliestBeginDate: request.earliest_begin_date.isNaN ? nil : request.earliest_begin_date,
            requiresNetworkConnectivity: request.requires_network,
            requiresExternalPower: request.requires_external_power,
            protectionType: request.protection_type,
            title: request.title.map { String(cString: $0) },
            subtitle: request.subtitle.map { String(cString: $0) },
            strategyFail: request.strategy == BGTASK_STRATEGY_FAIL.rawValue,
            requiredResources: request.required_resources)
    }

    /// Lends a C view of this request for the duration of `body`.
    public func withABI(_ body: (UnsafePointer<bgtask_request>) -> Void) {
        identifier.withCString { identifier in
            (title ?? "").withCString { title in
                (subtitle ?? "").withCString { subtitle in
                    var request = bgtask_request()
                    request.size = UInt32(MemoryLayout<bgtask_request>.size)
                    request.type = bgtask_task_type(kind.abiValue)
                    request.identifier = identifier
                    request.earliest_begin_date = earliestBeginDate ?? .nan
                    request.requires_network = requiresNetworkConnectivity
                    request.requires_external_power = requiresExternalPower
                    request.protection_type = protectionType
                    if kind == .continuedProcessing {
                        request.title = title
                        request.subtitle = subtitle
                    }
                    request.strategy = (strategyFail ? BGTASK_STRATEGY_FAIL : BGTASK_STRATEGY_QUEUE).rawValue
                    request.required_resources = requiredResources
                    body(&request)
                }
            }
        }
    }
}

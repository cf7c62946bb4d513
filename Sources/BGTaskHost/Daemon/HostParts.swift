import BGTaskControl
import BGTaskTransfers
import BGTaskStore
import BGTaskModel
import Dispatch
import Foundation
import Logging

/// What the parts of a host share: its configuration, its durable state and clock, its log, and
/// the serial queue that confines every part's mutable state. Control connections and launch
/// threads hop onto `queue`; the store and the clock are thread-safe on their own.
struct HostCore: @unchecked Sendable {
    let configuration: TaskHost.Configuration
    let store: PendingRequestStore
    let clock: HostClock
    let logger: Logger
    let queue: DispatchQueue
}

/// A part of the host started and stopped with it. `HostParts` starts them in order and stops
/// them in reverse, so that each part's dependencies (the parts before it) outlive it.
///
/// swift-service-lifecycle's `ServiceGroup` is the model. It is not used: its services are
/// `async` tasks running until cancelled, and every part here lives on one serial dispatch queue
/// (the store's group commit and the launch threads are synchronous by design); adopting it
/// would mean an async shell around each part for the same ordered start and reverse stop. It is
/// worth its build when the host gains async parts (the push endpoint, background transfers).
@HostActor
protocol HostPart: AnyObject {
    /// A name for the log.
    var partName: String { get }
    func start() throws(BGTaskError)
    func stop()
}

/// Parts started in order and stopped in reverse; a part that fails to start stops the ones
/// started before it.
@HostActor
final class HostParts {
    private let parts: [HostPart]
    private var started: [HostPart] = []
    private let logger: Logger

    init(_ parts: [HostPart], logger: Logger) {
        self.parts = parts
        self.logger = logger
    }

    func start() throws(BGTaskError) {
        for part in parts {
            do {
                try part.start()
            } catch {
                logger.error("a part of the host failed to start; stopping the others", metadata: ["part": "\(part.partName)", "error": "\(error)"])
                stop()
                throw error
            }
            started.append(part)
        }
    }

    func stop() {
        while let part = started.popLast() { part.stop() }
    }
}

extension ControlServer: HostPart {
    var partName: String { "control server" }
}

extension BackgroundTransfers: HostPart {}

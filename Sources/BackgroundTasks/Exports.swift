// Apple's BackgroundTasks module brings Foundation (and with it Dispatch) into scope; app code
// relies on that, so this one does too.
@_exported import Foundation
@_exported import Dispatch

/// Apple's Dispatch overlay names the queue type `dispatch_queue_t` too; Linux's does not.
public typealias dispatch_queue_t = DispatchQueue

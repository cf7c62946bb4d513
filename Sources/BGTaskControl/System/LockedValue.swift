import Foundation

/// A value behind a lock.
package final class LockedValue<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value
    package init(_ value: Value) { self.value = value }
    package func withLock<T>(_ body: (inout Value) -> T) -> T { lock.withLock { body(&value) } }
}

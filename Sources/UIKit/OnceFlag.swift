import Foundation

/// The first call of a completion handler (later ones are ignored, as iOS ignores them).
final class OnceFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var called = false
    func first() -> Bool { lock.withLock { defer { called = true }; return !called } }
}

import BGTaskSystem
import Foundation
#if canImport(Glibc)
import Glibc
#endif

extension BGTaskError {
    /// A failed system call, in the host's terms.
    package init(_ error: SystemError, _ detail: String? = nil) {
        self.init(.system, file: error.path, errno: error.errno, detail ?? "\(error.operation) failed")
    }
}

/// `valueOrErrno` for the host: a failed call is a `BGTaskError` naming it.
@discardableResult
package func syscall<T: FixedWidthInteger>(_ name: String, _ body: () -> T) throws(BGTaskError) -> T {
    do { return try valueOrErrno(name, body) } catch { throw BGTaskError(error) }
}

/// `Directories.make` for the host (mode 0755).
package func makeDirectories(_ path: String) throws(BGTaskError) {
    do { try Directories.make(path) } catch {
        throw BGTaskError(error, error.errno == ENOTDIR ? "exists and is not a directory" : "cannot create the directory")
    }
}

extension Duration {
    package var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
    package var milliseconds: Double { Double(nanoseconds) / 1_000_000 }
    /// In seconds, for Date and Dispatch arithmetic.
    public var timeInterval: TimeInterval { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

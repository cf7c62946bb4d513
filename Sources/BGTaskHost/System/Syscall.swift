import BGTaskSystem
#if canImport(Glibc)
import Glibc
#endif

extension BGTaskError {
    /// A failed system call, in the host's terms.
    init(_ error: SystemError, _ detail: String? = nil) {
        self.init(.system, file: error.path, errno: error.errno, detail ?? "\(error.operation) failed")
    }
}

/// `valueOrErrno` for the host: a failed call is a `BGTaskError` naming it.
@discardableResult
func syscall<T: FixedWidthInteger>(_ name: String, _ body: () -> T) throws(BGTaskError) -> T {
    do { return try valueOrErrno(name, body) } catch { throw BGTaskError(error) }
}

/// `Directories.make` for the host (mode 0755).
func makeDirectories(_ path: String) throws(BGTaskError) {
    do { try Directories.make(path) } catch {
        throw BGTaskError(error, error.errno == ENOTDIR ? "exists and is not a directory" : "cannot create the directory")
    }
}

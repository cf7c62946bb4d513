import Glibc

/// The host's descriptors.
package enum Descriptors {
    /// The host's descriptor limit now (RLIMIT_NOFILE's soft limit; 1,024 when it cannot be
    /// read), asked each time: an operator's `prlimit` on the running host counts at once.
    package static func limit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        return Int(min(UInt64(limit.rlim_cur), UInt64(Int32.max)))
    }
}

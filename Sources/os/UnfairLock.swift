#if canImport(Glibc)
// Apple's `os` module brings Darwin into scope; this one brings its Linux counterpart, which
// code written under `#if canImport(os)` also expects (swift-argument-parser's Mutex calls
// pthread_mutex_destroy there).
@_exported import Glibc

// Packages that build next to this module see it (SwiftPM gives every target the same module
// directory), and some choose their lock with `#if canImport(os)` (swift-argument-parser's
// Mutex does): for them, Apple's os_unfair_lock names over a pthread mutex. A zeroed
// pthread_mutex_t is an initialized one on glibc, as a zeroed os_unfair_lock is. Always
// emitted into the client, so that such a package never needs this module's symbols.
public typealias os_unfair_lock = pthread_mutex_t
public typealias os_unfair_lock_s = pthread_mutex_t
public typealias os_unfair_lock_t = UnsafeMutablePointer<os_unfair_lock>

@_alwaysEmitIntoClient
public func os_unfair_lock_lock(_ lock: os_unfair_lock_t) { pthread_mutex_lock(lock) }

@_alwaysEmitIntoClient
public func os_unfair_lock_unlock(_ lock: os_unfair_lock_t) { pthread_mutex_unlock(lock) }

@_alwaysEmitIntoClient
public func os_unfair_lock_trylock(_ lock: os_unfair_lock_t) -> Bool { pthread_mutex_trylock(lock) == 0 }
#endif

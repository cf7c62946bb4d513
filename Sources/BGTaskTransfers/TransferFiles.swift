import BGTaskLaunch
import BGTaskModel
import Foundation
import Glibc

/// Why an app's upload body file is refused.
package struct BodyFileRefusal: Error, Equatable {
    package var message: String

    /// The memberwise initializer, for the modules above this one.
    package init(message: String) {
        self.message = message
    }
}

/// An upload's body file, named by the app: hostile until proven otherwise. It must be a
/// regular file inside the calling bundle's container (or one of its app groups), reached
/// without following any symbolic link: each component is opened from its parent's descriptor
/// with O_NOFOLLOW (what openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS does in one call), and
/// `..` is refused. A root host also requires the file to be the app's own (a hard link to a
/// file the app could not read is not), and reads it from the descriptor it checked.
package enum UploadBodyFile {
    package static func open(_ path: String, roots: [String], owner: UInt32?) -> Result<(fd: Int32, size: Int64), BodyFileRefusal> {
        func refuse(_ why: String) -> Result<(fd: Int32, size: Int64), BodyFileRefusal> { .failure(BodyFileRefusal(message: "'\(path.prefix(300))' \(why)")) }
        guard path.hasPrefix("/"), !path.utf8.contains(0) else { return refuse("is not an absolute path") }
        guard let root = roots.first(where: { path.hasPrefix($0 + "/") }) else {
            return refuse("is outside the app's container (\(roots.first ?? "none")): an upload's body must be a file the app owns there")
        }
        let components = path.dropFirst(root.count + 1).split(separator: "/").map(String.init).filter { $0 != "." }
        guard !components.isEmpty else { return refuse("names a directory, not a file") }
        if components.contains("..") { return refuse("holds '..': a body file is named without leaving the container") }
        var directory = Glibc.open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard directory >= 0 else { return refuse("cannot be opened: the container \(root) is missing (\(String(cString: strerror(errno))))") }
        defer { close(directory) }
        for component in components.dropLast() {
            let next = openat(directory, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard next >= 0 else {
                let code = errno
                return refuse(code == ELOOP || code == ENOTDIR
                    ? "passes through '\(component)', which is a symbolic link or not a directory: links are not followed out of the container"
                    : "cannot be opened at '\(component)': \(String(cString: strerror(code)))")
            }
            close(directory)
            directory = next
        }
        let fd = openat(directory, components.last!, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            return refuse(code == ELOOP ? "is a symbolic link: links are not followed out of the container" : "cannot be opened: \(String(cString: strerror(code)))")
        }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            close(fd)
            return refuse("is not a regular file")
        }
        if let owner, info.st_uid != owner {
            close(fd)
            return refuse("is not the app's own file (owner uid \(info.st_uid), the app runs as \(owner))")
        }
        return .success((fd, Int64(info.st_size)))
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (Glibc's module leaves them out: they need _GNU_SOURCE).
    package static let seekData: Int32 = 3
    package static let seekHole: Int32 = 4

    /// The file's data ranges in [0, `size`), holes left out: its extents as the filesystem
    /// tells them (SEEK_DATA/SEEK_HOLE); the whole file when the filesystem cannot tell.
    package static func dataRanges(_ fd: Int32, size: Int64) -> [Range<Int64>] {
        var ranges: [Range<Int64>] = []
        var position: Int64 = 0
        while position < size {
            let start = Int64(lseek(fd, off_t(position), seekData))
            if start < 0 {
                // ENXIO: no data past `position`; anything else (EINVAL): no extents here.
                if errno == ENXIO { break }
                return ranges + [position..<size]
            }
            guard start < size else { break }
            var end = Int64(lseek(fd, off_t(start), seekHole))
            if end < 0 || end > size { end = size }
            guard end > start else { break }
            ranges.append(start..<end)
            position = end
        }
        return ranges
    }

    /// Bytes of data in the file's first `size` bytes (its holes not counted): what staging it
    /// costs.
    package static func dataBytes(_ fd: Int32, size: Int64) -> Int64 {
        dataRanges(fd, size: size).reduce(0) { $0 + ($1.upperBound - $1.lowerBound) }
    }

    /// Copies the first `size` bytes of `fd` into `spool` (through `spool.tmp`, renamed when
    /// synced: a spool file that exists is whole). Only its data is copied, holes stay holes
    /// (a 1 GiB sparse file is not 1 GiB of zeros in staging). Before each part is written,
    /// `admit(copied, adding)` is asked (the app's staging cap, the host's disk reserve): a
    /// refusal stops the copy, the temporary file removed.
    package static func copy(_ fd: Int32, size: Int64, to spool: String,
                     admit: (_ copied: Int64, _ adding: Int64) -> StagingRefusal? = { _, _ in nil }) -> Result<Void, TransferFileError> {
        let temporary = spool + ".tmp"
        let out = Glibc.open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard out >= 0 else { return .failure(TransferFileError(path: temporary, errno: errno, action: "create the upload's spool file")) }
        defer { close(out) }
        func fail(_ error: TransferFileError) -> Result<Void, TransferFileError> {
            unlink(temporary)
            return .failure(error)
        }
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        var copied: Int64 = 0
        for range in dataRanges(fd, size: size) {
            var at = range.lowerBound
            while at < range.upperBound {
                let want = Int(min(Int64(buffer.count), range.upperBound - at))
                if let refusal = admit(copied, Int64(want)) {
                    return fail(TransferFileError(path: spool, errno: nil, action: "stage the upload's body", refusal: refusal))
                }
                let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(at)) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else {
                    return fail(TransferFileError(path: spool, errno: n < 0 ? errno : nil, action: "copy the upload's body (the app's file shrank or could not be read)"))
                }
                var written = 0
                while written < n {
                    let w = buffer.withUnsafeBytes { pwrite(out, $0.baseAddress! + written, n - written, off_t(at) + off_t(written)) }
                    if w < 0 && errno == EINTR { continue }
                    guard w > 0 else {
                        return fail(TransferFileError(path: temporary, errno: errno, action: "write the upload's spool file"))
                    }
                    written += w
                }
                at += Int64(n)
                copied += Int64(n)
            }
        }
        // The length, holes and all (a trailing hole is no data to copy).
        guard ftruncate(out, off_t(size)) == 0 else {
            return fail(TransferFileError(path: temporary, errno: errno, action: "size the upload's spool file"))
        }
        guard fsync(out) == 0, rename(temporary, spool) == 0 else {
            return fail(TransferFileError(path: spool, errno: errno, action: "keep the upload's spool file"))
        }
        return .success(())
    }
}

/// A finished download's file, moved from the host's spool into the app's container where
/// iOS's nsurlsessiond puts it: `Library/Caches/com.apple.nsurlsessiond/Downloads/BUNDLE_ID/
/// CFNetworkDownload_XXXXXX.tmp`, mode 0600, the app's own when it runs as its own uid. The
/// directories are reached and made without following a link (the container is the app's, and
/// the host may be root).
package enum DownloadDelivery {
    package static func relativeDirectory(app: String) -> [String] {
        ["Library", "Caches", "com.apple.nsurlsessiond", "Downloads", app]
    }

    package static func directory(app: String, stateDirectory: URL) -> String {
        stateDirectory.appendingPathComponent("containers/\(app)").path + "/" + relativeDirectory(app: app).joined(separator: "/")
    }

    /// Opens (making it, when `create`) the app's downloads directory: its descriptor, or -1.
    private static func openDirectory(app: String, stateDirectory: URL, create: Bool, uid: UInt32?) -> (fd: Int32, errno: Int32) {
        let container = stateDirectory.appendingPathComponent("containers/\(app)").path
        // An app that never ran has no container yet (nor, on a new host, any container).
        if create { mkdir(stateDirectory.appendingPathComponent("containers").path, 0o755) }
        if create, mkdir(container, 0o755) == 0, let uid { chown(container, uid, uid) }
        var directory = open(container, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard directory >= 0 else { return (-1, errno) }
        for component in relativeDirectory(app: app) {
            if create, mkdirat(directory, component, 0o755) == 0, let uid {
                let made = openat(directory, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                if made >= 0 { fchown(made, uid, uid); close(made) }
            }
            let next = openat(directory, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            let code = errno
            close(directory)
            guard next >= 0 else { return (-1, code) }
            directory = next
        }
        return (directory, 0)
    }

    /// Moves `spool` into the app's downloads directory (renamed, or copied from another file
    /// system): the file's path.
    package static func deliver(_ spool: String, app: String, stateDirectory: URL, identities: AppIdentities?) -> Result<String, TransferFileError> {
        let uid = try? identities?.uid(forApp: app)
        let target = directory(app: app, stateDirectory: stateDirectory)
        let (directory, code) = openDirectory(app: app, stateDirectory: stateDirectory, create: true, uid: uid ?? nil)
        guard directory >= 0 else { return .failure(TransferFileError(path: target, errno: code, action: "make the app's downloads directory (a symbolic link is refused)")) }
        defer { close(directory) }
        let source = open(spool, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard source >= 0 else { return .failure(TransferFileError(path: spool, errno: errno, action: "open the finished download")) }
        defer { close(source) }
        if let uid = uid ?? nil { fchown(source, uid, uid) }
        fchmod(source, 0o600)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
        for _ in 0..<8 {
            let name = "CFNetworkDownload_" + String((0..<6).map { _ in alphabet.randomElement()! }) + ".tmp"
            if faccessat(directory, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0 { continue }
            if renameat(AT_FDCWD, spool, directory, name) == 0 { return .success(target + "/" + name) }
            guard errno == EXDEV else { return .failure(TransferFileError(path: target + "/" + name, errno: errno, action: "move the download into the app's container")) }
            // Another file system: copied, then the spool removed.
            let out = openat(directory, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard out >= 0 else { return .failure(TransferFileError(path: target + "/" + name, errno: errno, action: "create the download in the app's container")) }
            defer { close(out) }
            var info = stat()
            fstat(source, &info)
            var offset: off_t = 0
            while offset < info.st_size {
                let n = sendfile(out, source, &offset, Int(min(Int64(info.st_size - offset), 1 << 30)))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else {
                    unlinkat(directory, name, 0)
                    return .failure(TransferFileError(path: target + "/" + name, errno: errno, action: "copy the download into the app's container"))
                }
            }
            if let uid = uid ?? nil { fchown(out, uid, uid) }
            fsync(out)
            unlink(spool)
            return .success(target + "/" + name)
        }
        return .failure(TransferFileError(path: target, errno: nil, action: "find a free name for the download"))
    }

    /// Removes a delivered download the app left where it was put (only a file in the app's
    /// downloads directory, reached without following links).
    package static func remove(_ file: String, app: String, stateDirectory: URL) {
        let target = directory(app: app, stateDirectory: stateDirectory) + "/"
        guard file.hasPrefix(target) else { return }
        let name = String(file.dropFirst(target.count))
        guard !name.isEmpty, !name.contains("/") else { return }
        let (directory, _) = openDirectory(app: app, stateDirectory: stateDirectory, create: false, uid: nil)
        guard directory >= 0 else { return }
        unlinkat(directory, name, 0)
        close(directory)
    }
}

import BGTaskSystem
import Foundation
import Glibc
import _BGTaskSystemShims

public struct PeerCredentials: Sendable, Equatable {
    public var pid: pid_t
    public var uid: uid_t
    public var gid: gid_t

    /// The memberwise initializer, for the modules above this one.
    package init(pid: pid_t, uid: uid_t, gid: gid_t) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}

public struct ControlClient: Sendable {
    public var path: String

    public init(stateDirectory: URL) {
        path = stateDirectory.appendingPathComponent("control.sock").path
    }

    public func send(_ command: ControlCommand) throws(BGTaskError) -> ControlResponse {
        try send([command])[0]
    }

    /// Sends `requests` on one connection, pipelined: `window` frames are written at once and
    /// their answers read after, so the host can handle them together (consecutive submissions
    /// share one commit). One response each, in order.
    public func send(_ commands: [ControlCommand], window: Int = 256) throws(BGTaskError) -> [ControlResponse] {
        let payloads: [Data]
        do { payloads = try commands.map(ControlCodec.encode) } catch {
            throw BGTaskError(.invalidRequest, file: path, "control socket: cannot encode the request: \(error)")
        }
        return try send(payloads: payloads, window: window)
    }

    /// Sends requests as they are on the wire, whatever they hold: for tests of what the host
    /// does with requests no client of this package sends.
    package func send(wire requests: [ControlRequest]) throws(BGTaskError) -> [ControlResponse] {
        let payloads: [Data]
        do { payloads = try requests.map { try JSONEncoder.control.encode($0) } } catch {
            throw BGTaskError(.invalidRequest, file: path, "control socket: cannot encode the request: \(error)")
        }
        return try send(payloads: payloads, window: 256)
    }

    private func send(payloads all: [Data], window: Int) throws(BGTaskError) -> [ControlResponse] {
        var address = try unixAddress(path)
        let fd = try syscall("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        defer { close(fd) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let error = errno
            if error == EACCES || error == EPERM {
                throw BGTaskError(.system, file: path, errno: error, "the control socket belongs to another user; only the host's user may control it")
            }
            throw BGTaskError(.system, file: path, errno: error,
                              "no bgtask host is listening (start one with `bgtask host --state \(URL(fileURLWithPath: path).deletingLastPathComponent().path)`)")
        }
        do {
            let decoder = JSONDecoder.control
            var reader = ControlFrameReader(fd: fd)
            var responses: [ControlResponse] = []
            responses.reserveCapacity(all.count)
            var start = all.startIndex
            while start < all.endIndex {
                let chunk = all[start..<min(all.endIndex, start + max(1, window))]
                do {
                    try ControlFrame.write(payloads: Array(chunk), to: fd)
                } catch {
                    // The host may have answered before reading (a refused peer): read that answer.
                    guard error.code == .closed, let payload = try? reader.next() else { throw error }
                    let refusal = try decoder.decode(ControlResponse.self, from: payload)
                    return responses + all[start...].map { _ in refusal }
                }
                for _ in chunk {
                    guard let payload = try reader.next() else {
                        throw BGTaskError(.system, file: path, "the host closed the connection without answering")
                    }
                    responses.append(payload == ControlFrame.bareOK ? ControlResponse() : try decoder.decode(ControlResponse.self, from: payload))
                }
                start = chunk.endIndex
            }
            return responses
        } catch let error as BGTaskError {
            throw error
        } catch {
            throw BGTaskError(.system, file: path, "control socket: \(error)")
        }
    }
}

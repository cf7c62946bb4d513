// Network use of its own (issue 30, energy accounting): `connect` opens a TCP connection to the
// loopback port written in the bundle's `connect-port` file, sends 256 KiB, reads the 128 KiB
// answer, and keeps the connection open (as URLSession keeps its connections) when it completes:
// the host counts the bytes per socket, and EnergyTests checks the record and the day.
import BackgroundTasks
import Foundation
#if canImport(Glibc)
import Glibc
#endif

nonisolated(unsafe) private var openConnections: [Int32] = []

extension Misbehaving {
    static func registerConnect() {
        register("connect") { task in
            let path = Bundle.main.bundlePath + "/connect-port"
            guard let text = try? String(contentsOfFile: path, encoding: .utf8),
                  let port = UInt16(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                print("misbehaving: connect found no port in \(path)")
                return task.setTaskCompleted(success: false)
            }
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard fd >= 0, connected == 0 else {
                print("misbehaving: connect could not connect to port \(port): errno \(errno)")
                return task.setTaskCompleted(success: false)
            }
            let chunk = [UInt8](repeating: 7, count: 64 << 10)
            var sent = 0
            while sent < 256 << 10 {
                let count = chunk.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
                guard count > 0 else { break }
                sent += count
            }
            var received = 0
            var buffer = [UInt8](repeating: 0, count: 64 << 10)
            while received < 128 << 10 {
                let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard count > 0 else { break }
                received += count
            }
            openConnections.append(fd)
            print("misbehaving: connect sent \(sent) bytes, received \(received) bytes, and keeps the connection open")
            task.setTaskCompleted(success: sent == 256 << 10 && received == 128 << 10)
        }
    }
}

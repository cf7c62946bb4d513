import BGTaskHost
import BGTaskControl
import BGTaskModel
import Foundation
import Glibc
import NIOCore
import NIOHTTP1
import NIOPosix

// Issue 16's figure: a download carried by the host (a background URL session of the
// Downloader app, Tests/Fixtures/Downloader) against `curl -o` of the same URL, from the same
// loopback server, in the same run; and the host's memory while it streams to disk.

extension SectionRunner {
    func transfer() throws {
        let size: Int64 = iterations.quick ? 256 << 20 : 1 << 30
        let runs = iterations.quick ? 2 : 3
        report.section("transfer: a \(mib(Double(size))) download carried by the host (background URL session) vs curl -o, one loopback server")
        let directory = root.appendingPathComponent("transfer")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let payload = directory.appendingPathComponent("payload.bin")
        try Self.writePayload(payload, size: size)
        let server = try FileServer(file: payload)
        defer { server.stop() }
        let url = "http://127.0.0.1:\(server.port)/payload.bin"

        // The floor: curl writing the same bytes to a file on the same disk.
        var curl = Samples()
        let curlOut = directory.appendingPathComponent("curl.out").path
        for run in 1...runs {
            progress("transfer: curl -o, run \(run) of \(runs)")
            let t0 = monotonicNs()
            let status = waitFor(try spawn(["/usr/bin/curl", "-sS", "--fail", "-o", curlOut, url], stdout: nil, stderr: 2))
            let elapsed = seconds(since: t0)
            guard status == 0 else { throw BenchError("curl failed (status \(status)): is curl installed?") }
            curl.append(Double(size) / elapsed)
            unlink(curlOut)
        }

        // Through the host: the app resumes a download and ends its task; the host carries it.
        let plugins = directory.appendingPathComponent("plugins"), state = directory.appendingPathComponent("state")
        try FileManager.default.createDirectory(at: plugins, withIntermediateDirectories: true)
        let bundle = plugins.appendingPathComponent("Downloader.app")
        try makeDownloaderBundle(at: bundle, config: ["downloads": [url]])
        let host = HostProcess(plugins: plugins, state: state, log: directory.appendingPathComponent("host.log"), arguments: [])
        try host.start()
        defer { host.stop() }
        var throughHost = Samples()
        var rssBefore = Double.nan, rssPeak = 0.0
        var seen = Set<String>()
        for run in 1...runs {
            progress("transfer: through the host, run \(run) of \(runs)")
            if rssBefore.isNaN { rssBefore = ProcStat.rss(host.pid).map { Double($0) } ?? .nan }
            // The previous run's delivery (a background-transfer launch) may still be running.
            let launchBy = Date().addingTimeInterval(120)
            // Timed here, from before the launch that resumes the download to the first look
            // that finds it finished (every 5 ms): the records' times are whole seconds in the
            // control socket's answers, too coarse for a transfer of about a second (the first
            // figures, 512 and 1,024 MiB/s, were 2 s and 1 s exactly). It includes the launch.
            var t0 = monotonicNs()
            while true {
                t0 = monotonicNs()
                let status = waitFor(try spawn([Products.cli, "simulate-launch", "com.example.downloader.start", "--force", "--type", "refresh",
                                                 "--state", state.path], stdout: nil, stderr: nil))
                if status == 0 { break }
                guard Date() < launchBy else { throw BenchError("bgtask simulate-launch failed (status \(status)) for 2 minutes") }
                usleep(100_000)
            }
            let deadline = Date().addingTimeInterval(600)
            var finished: TransferReport?
            while finished == nil && Date() < deadline {
                rssPeak = max(rssPeak, ProcStat.rss(host.pid).map { Double($0) } ?? 0)
                let listed = (try? host.client.send(.transfers(app: "com.example.downloader")).transfers) ?? []
                if let done = listed.first(where: { !seen.contains($0.id) && $0.finishedAt != nil }) {
                    finished = done
                } else {
                    usleep(5_000)
                }
            }
            let elapsed = seconds(since: t0)
            guard let finished, finished.finishedAt != nil else { throw BenchError("the host's transfer did not finish within 10 minutes") }
            guard finished.error == nil, finished.bytesReceived == size else {
                throw BenchError("the host's transfer ended with \(finished.bytesReceived) bytes: \(finished.error?.message ?? "?")")
            }
            seen.insert(finished.id)
            throughHost.append(Double(size) / elapsed)
        }

        let floor = curl.percentile(50), value = throughHost.percentile(50)
        let ratio = value / floor
        report.row("download, curl -o (floor, p50 of \(runs))", String(format: "%.0f MiB/s", floor / 1_048_576))
        report.row("download through the host (p50 of \(runs))", String(format: "%.0f MiB/s", value / 1_048_576),
                   floor: String(format: "%.0f MiB/s", floor / 1_048_576), ratio: pct(ratio * 100), target: "≥ 90 %", verdict: verdict(ratio >= 0.9))
        report.row("host RSS before / peak while streaming", "\(mib(rssBefore)) / \(mib(rssPeak))", floor: "", ratio: "+\(mib(rssPeak - rssBefore))",
                   target: "flat", verdict: verdict(rssPeak - rssBefore < Double(64 << 20)))
        report.set("transfer_bytes", .int(Int(size)))
        report.set("transfer_curl_bytes_per_s", floor, 0)
        report.set("transfer_host_bytes_per_s", value, 0)
        report.set("transfer_host_vs_curl", ratio, 3)
        report.set("transfer_host_rss_before_bytes", rssBefore, 0)
        report.set("transfer_host_rss_peak_bytes", rssPeak, 0)
    }

    /// A file of `size` bytes (written, not sparse, so both readers read real pages).
    static func writePayload(_ url: URL, size: Int64) throws {
        if let attributes = try? FileManager.default.attributesOfItem(atPath: url.path), (attributes[.size] as? Int64) == size { return }
        let fd = open(url.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw BenchError("cannot create \(url.path): errno \(errno)") }
        defer { close(fd) }
        var block = [UInt8](repeating: 0, count: 1 << 20)
        for index in block.indices { block[index] = UInt8(truncatingIfNeeded: index &* 31) }
        var written: Int64 = 0
        while written < size {
            let count = Int(min(Int64(block.count), size - written))
            let result = block.withUnsafeBytes { write(fd, $0.baseAddress, count) }
            guard result > 0 else { throw BenchError("cannot write \(url.path): errno \(errno)") }
            written += Int64(result)
        }
    }

    /// The Downloader fixture as a bundle, told what to fetch.
    func makeDownloaderBundle(at url: URL, config: [String: Any]) throws {
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        let library = url.appendingPathComponent("libDownloader.so")
        if link(Products.downloaderLibrary, library.path) != 0 {
            try FileManager.default.copyItem(atPath: Products.downloaderLibrary, toPath: library.path)
        }
        let plist: [String: Any] = [
            "CFBundleIdentifier": "com.example.downloader",
            "CFBundleExecutable": "libDownloader.so",
            "BGTaskSchedulerPermittedIdentifiers": ["com.example.downloader.start"],
            "UIBackgroundModes": ["fetch"],
        ]
        try PropertyListSerialization.data(fromPropertyList: plist, format: .xml, options: 0).write(to: url.appendingPathComponent("Info.plist"))
        try JSONSerialization.data(withJSONObject: config).write(to: url.appendingPathComponent("config.json"))
    }
}

/// A loopback HTTP/1.1 server of one file, sent with sendfile (NIO's FileRegion): the
/// server both clients read from, so neither figure is its limit.
final class FileServer {
    private let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    private let channel: Channel
    let port: Int

    init(file: URL) throws {
        let path = file.path
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.pipeline.configureHTTPServerPipeline().flatMap {
                    channel.pipeline.addHandler(FileHandler(path: path))
                }
            }
        channel = try bootstrap.bind(host: "127.0.0.1", port: 0).wait()
        port = channel.localAddress?.port ?? 0
    }

    func stop() {
        try? channel.close().wait()
        try? group.syncShutdownGracefully()
    }

    private final class FileHandler: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let path: String
        init(path: String) { self.path = path }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard case .end = unwrapInboundIn(data) else { return }
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            var info = stat()
            guard fd >= 0, fstat(fd, &info) == 0 else {
                if fd >= 0 { close(fd) }
                context.close(promise: nil)
                return
            }
            let handle = NIOFileHandle(_deprecatedTakingOwnershipOfDescriptor: fd)
            let size = Int(info.st_size)
            let head = HTTPResponseHead(version: .http1_1, status: .ok,
                                        headers: ["Content-Length": "\(size)", "ETag": "\"bench\"", "Accept-Ranges": "bytes"])
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.write(wrapOutboundOut(.body(.fileRegion(FileRegion(fileHandle: handle, readerIndex: 0, endIndex: size)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in try? handle.close() }
        }
    }
}

import BGTaskHost
import BGTaskControl
import Foundation
import Testing

/// The plugin ABI's growth rules (bgtask/plugin.h, "How the structs grow"), with real compiled
/// plugins (Tests/Fixtures/ABIGrowth, one per BGTASK_FIXTURE_MODE) and the real runner: each side
/// reads min(its size, the writer's size) of every struct the other side wrote, and refuses a
/// struct below ABI 1's size with a message that names the struct and both sizes.
@Suite struct ABIGrowthTests {
    /// Runs `mode` and returns its record and the "abi-growth" lines of its log.
    private func launch(_ mode: String) throws -> (RunRecord, [String]) {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let app = try scratch.bundle("ABIGrowth", info: "Tests/Fixtures/ABIGrowth/Info.plist")
        let (record, _) = try scratch.run(app, ["--task", "com.example.abigrowth.task"],
                                          environment: ["BGTASK_FIXTURE_MODE": mode])
        let log = (try? String(contentsOfFile: record.log ?? "", encoding: .utf8)) ?? ""
        return (record, log.split(separator: "\n").map(String.init).filter { $0.hasPrefix("abi-growth ") })
    }

    /// (a) A plugin built against ABI 1 as first published (its own copy of the header: C enum
    /// fields, a host table that ends at supported_resources) runs with today's runner, whose
    /// table is larger: it registers, submits, lists pending requests and completes its task.
    @Test func pluginBuiltAgainstASmallerTableRunsWithTheLargerHost() throws {
        let (record, lines) = try launch("older")
        #expect(record.termination == .exited, "\(record.error ?? "")")
        #expect(record.task("com.example.abigrowth.task")?.outcome == .succeeded, "\(lines)")
        #expect(record.submitted.map(\.identifier) == ["com.example.abigrowth.later"])
        #expect(record.submitted.first?.requiresNetworkConnectivity == true)
        #expect(record.submitted.first?.earliestBeginDate == nil)
        // The runner's table is larger than the one the plugin was built against (LP64 sizes,
        // pinned in plugin.h): the plugin used only what it knows.
        #expect(lines.contains { $0.hasPrefix("abi-growth older: host table 272 bytes, built against 96;") }, "\(lines)")
        #expect(lines.contains { $0.contains("(type 2, info 32 bytes): submit 0, pending found") }, "\(lines)")
    }

    /// (b) A plugin built against a later header, whose descriptor, requests, host table and
    /// infos all have fields appended: the runner reads its descriptor and request only as far
    /// as it knows them (the extra bytes, set, are ignored), and the plugin reads the runner's
    /// smaller structs with its new fields zero and the appended function absent.
    @Test func pluginWithLargerStructsThanTheHostKnowsRuns() throws {
        let (record, lines) = try launch("newer")
        #expect(record.termination == .exited, "\(record.error ?? "")")
        #expect(record.task("com.example.abigrowth.task")?.outcome == .succeeded, "\(lines)")
        #expect(record.submitted.map(\.identifier) == ["com.example.abigrowth.later"])
        #expect(record.submitted.first?.requiresExternalPower == true)
        #expect(lines.contains {
            $0.hasPrefix("abi-growth newer: host table 272 bytes, built against 280: future_function absent (NULL);")
                && $0.contains("launch info 56 bytes, built against 64, launch_flags 0; app_group_container present")
        }, "\(lines)")
        #expect(lines.contains("abi-growth newer: pending request of 56 bytes, read as 72 (priority 0, group none)"), "\(lines)")
        #expect(lines.contains { $0.contains("info 32 bytes, priority 0): submitted 72 bytes: 0, pending found") }, "\(lines)")
    }

    /// (c) A descriptor whose size is below ABI 1's fails the launch before the plugin's launch
    /// function runs, and the record names the struct and both sizes.
    @Test func descriptorBelowTheFirstVersionFailsTheLaunch() throws {
        let (record, _) = try launch("small-descriptor")
        #expect(record.termination == .launchFailed)
        #expect(record.error == "libABIGrowth.so: the plugin descriptor is refused: bgtask_plugin.size is 16 bytes, below the 32 bytes of bgtask_plugin in bgtask ABI 1 (set it to sizeof(bgtask_plugin) with bgtask/plugin.h)",
                "\(record.error ?? "no error")")
        #expect(record.task("com.example.abigrowth.task")?.outcome == .notRegistered)
    }

    /// (c) A request whose size is below ABI 1's is refused by submit (invalid argument, with a
    /// message naming the struct and both sizes); nothing is submitted and the launch goes on.
    @Test func requestBelowTheFirstVersionIsRefused() throws {
        let (record, lines) = try launch("small-request")
        #expect(record.termination == .exited, "\(record.error ?? "")")
        #expect(record.task("com.example.abigrowth.task")?.outcome == .succeeded, "\(lines)")
        #expect(record.submitted.isEmpty)
        #expect(lines.contains("abi-growth small-request: submit returned 100: invalid request: bgtask_request.size is 8 bytes, below the 56 bytes of bgtask_request in bgtask ABI 1 (set it to sizeof(bgtask_request) with bgtask/plugin.h)"),
                "\(lines)")
    }

    /// The SDK's side: a Swift plugin (ApplePatterns6, which links the SDK) loaded here and handed
    /// what a broken or foreign host would hand it refuses it with the struct's name and sizes,
    /// before any app code runs. (No runner hands these; the runner's own sizes are tested above.)
    @Test func sdkRefusesAHostTableOrLaunchInfoBelowTheFirstVersion() throws {
        // Kept loaded: Swift libraries are not safe to unload.
        let handle = try #require(dlopen(Products.library("ApplePatterns6"), RTLD_NOW | RTLD_LOCAL))
        typealias Entry = @convention(c) () -> UnsafeRawPointer?
        typealias Launch = @convention(c) (UnsafeRawPointer?, OpaquePointer?, UnsafeRawPointer?, UnsafeMutablePointer<CChar>?, Int) -> Int32
        let entry = unsafeBitCast(try #require(dlsym(handle, "bgtask_plugin_entry")), to: Entry.self)
        let descriptor = try #require(entry())
        // bgtask_plugin on LP64: magic, abi_version, size, name at 16, launch at 24 (plugin.h pins it).
        let launch = try #require(descriptor.load(fromByteOffset: 24, as: Launch?.self))

        func launchError(tableVersion: UInt32, tableSize: UInt32, infoSize: UInt32) -> (Int32, String) {
            let table = UnsafeMutableRawPointer.allocate(byteCount: 256, alignment: 8)
            let info = UnsafeMutableRawPointer.allocate(byteCount: 256, alignment: 8)
            defer { table.deallocate(); info.deallocate() }
            table.initializeMemory(as: UInt8.self, repeating: 0, count: 256)
            info.initializeMemory(as: UInt8.self, repeating: 0, count: 256)
            table.storeBytes(of: tableVersion, as: UInt32.self)                     // abi_version
            table.storeBytes(of: tableSize, toByteOffset: 4, as: UInt32.self)       // size
            info.storeBytes(of: infoSize, as: UInt32.self)                          // size
            var error = [CChar](repeating: 0, count: 512)
            let status = launch(table, nil, info, &error, error.count)
            return (status, String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }

        let smallTable = launchError(tableVersion: 1, tableSize: 8, infoSize: 48)
        #expect(smallTable.0 == 1)
        #expect(smallTable.1 == "the host's bgtask_host_api.size is 8 bytes, below the 96 bytes of bgtask_host_api in bgtask ABI 1, which this plugin was built for")
        let otherVersion = launchError(tableVersion: 2, tableSize: 104, infoSize: 48)
        #expect(otherVersion.0 == 1)
        #expect(otherVersion.1 == "ABI version mismatch: the host provides bgtask ABI 2, this plugin was built for ABI 1")
        // A table of the first version's size is accepted; the launch info is not.
        let smallInfo = launchError(tableVersion: 1, tableSize: 96, infoSize: 12)
        #expect(smallInfo.0 == 1)
        #expect(smallInfo.1 == "the host's bgtask_launch_info.size is 12 bytes, below the 48 bytes of bgtask_launch_info in bgtask ABI 1, which this plugin was built for")
    }
}

import BGTaskControl
@testable import BGTaskHost
import BGTaskModel
import Foundation
import Testing

@Suite struct HealthResearchTests {
    func installStudy(_ host: HostProcess, entitled: Bool) throws {
        let info = host.scratch.url.appendingPathComponent("study.plist")
        try """
        <?xml version="1.0" encoding="UTF-8"?>
        <plist version="1.0"><dict>
        <key>CFBundleIdentifier</key><string>com.example.misbehaving</string>
        <key>CFBundleExecutable</key><string>libMisbehaving.so</string>
        <key>BGTaskSchedulerPermittedIdentifiers</key><array><string>com.example.misbehaving.ok</string><string>com.example.misbehaving.fail</string></array>
        <key>UIBackgroundModes</key><array><string>processing</string></array>
        <key>Entitlements</key><dict><key>\(PluginBundle.healthResearchEntitlement)</key>\(entitled ? "<true/>" : "<false/>")</dict>
        </dict></plist>
        """.write(to: info, atomically: true, encoding: .utf8)
        let staged = host.scratch.url.appendingPathComponent("Study.app")
        let made = try runCLI(["bundle", "--library", Products.library("Misbehaving"), "--info", info.path, "--output", staged.path])
        try #require(made.status == 0, "\(made.stderr)")
        try FileManager.default.moveItem(at: staged, to: host.plugins.appendingPathComponent("Study.app"))
    }

    @Test func healthResearchNeedsTheEntitlement() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        try installStudy(host, entitled: false)
        try host.start()
        defer { host.stop() }
        let result = try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.ok", "--type", "health-research"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("[notPermitted]") && result.stderr.contains("health-research"), "\(result.stderr)")
    }

    @Test func dataProtectionHoldsTasksWhileLocked() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess(scratch: scratch)
        try installStudy(host, entitled: true)
        // The device is locked when the host ("the device") starts: never unlocked since boot.
        try FileManager.default.createDirectory(at: scratch.state, withIntermediateDirectories: true)
        try host.start()
        _ = try host.cli(["device", "--locked", "on"])
        host.stop()
        try host.start()
        defer { host.stop() }

        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.ok", "--type", "health-research", "--protection", "complete"]).status == 0)
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.fail", "--type", "health-research", "--protection", "until-first-auth"]).status == 0)
        for identifier in ["com.example.misbehaving.ok", "com.example.misbehaving.fail"] {
            let why = try host.cli(["why", identifier])
            #expect(why.stdout.contains("[data-protected]"), "\(why.stdout)")
        }

        _ = try host.cli(["device", "--locked", "off"])
        let records = try host.waitForHistory(count: 1)
        let tasks = records.flatMap(\.tasks)
        #expect(tasks.first { $0.identifier == "com.example.misbehaving.ok" }?.type == .healthResearch)
        #expect(tasks.first { $0.identifier == "com.example.misbehaving.ok" }?.outcome == .succeeded)
        #expect(tasks.first { $0.identifier == "com.example.misbehaving.fail" }?.outcome == .failed)

        // Locked again: "complete" data is unavailable, "until first authentication" data is not.
        _ = try host.cli(["device", "--locked", "on"])
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.ok", "--type", "health-research", "--protection", "complete", "--earliest", "+1h"]).status == 0)
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.fail", "--type", "health-research", "--protection", "until-first-auth", "--earliest", "+1h"]).status == 0)
        let complete = try #require(try host.send(.why(identifier: "com.example.misbehaving.ok")).why)
        #expect(complete.blockers.map(\.code).contains("data-protected"))
        let firstAuth = try #require(try host.send(.why(identifier: "com.example.misbehaving.fail")).why)
        #expect(!firstAuth.blockers.map(\.code).contains("data-protected"), "\(firstAuth.text)")
    }
}

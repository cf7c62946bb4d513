@testable import BGTaskHost
import BGTaskControl
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A fake kernel in a scratch directory: sysfs power supplies and net classes, procfs route
/// tables and a /dev tree, with a reader pointed at them. `remove()` deletes it.
private struct FakeKernel {
    let root: URL
    var reader: MachineConditionsReader

    static let routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"

    init() throws {
        root = FileManager.default.temporaryDirectory.appendingPathComponent("bgtask-device-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        reader = MachineConditionsReader()
        reader.powerSupplyDirectory = root.appendingPathComponent("sys/class/power_supply")
        reader.routeFile = root.appendingPathComponent("proc/net/route")
        reader.ipv6RouteFile = root.appendingPathComponent("proc/net/ipv6_route")
        reader.netClassDirectory = root.appendingPathComponent("sys/class/net")
        reader.devDirectory = root.appendingPathComponent("dev")
        reader.thermalDirectory = root.appendingPathComponent("sys/class/thermal")
    }

    func remove() { try? FileManager.default.removeItem(at: root) }

    /// Writes `text` at `path` (relative to the root), creating directories.
    func write(_ path: String, _ text: String) throws {
        let url = root.appendingPathComponent(path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(text.utf8).write(to: url)
    }

    func mkdir(_ path: String) throws {
        try FileManager.default.createDirectory(at: root.appendingPathComponent(path), withIntermediateDirectories: true)
    }

    /// A power supply as the kernel shows it: `type` and, when given, `online` and `scope`.
    func supply(_ name: String, type: String, online: Int? = nil, scope: String? = nil) throws {
        try write("sys/class/power_supply/\(name)/type", "\(type)\n")
        if let online { try write("sys/class/power_supply/\(name)/online", "\(online)\n") }
        if let scope { try write("sys/class/power_supply/\(name)/scope", "\(scope)\n") }
        if type == "Battery" {
            try write("sys/class/power_supply/\(name)/status", online == nil ? "Discharging\n" : "Charging\n")
        }
    }

    /// /proc/net/route with the header and `rows` (interface, destination, flags).
    func ipv4Routes(_ rows: [(iface: String, destination: String, flags: String)]) throws {
        var text = Self.routeHeader + "\n"
        for row in rows {
            text += "\(row.iface)\t\(row.destination)\t010200C0\t\(row.flags)\t0\t0\t100\t00000000\t0\t0\t0\n"
        }
        try write("proc/net/route", text)
    }

    /// /proc/net/ipv6_route with `rows` (destination, prefix length, flags, interface), padded
    /// as the kernel pads the interface column.
    func ipv6Routes(_ rows: [(destination: String, prefix: String, flags: String, iface: String)]) throws {
        var text = ""
        for row in rows {
            text += "\(row.destination) \(row.prefix) 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 \(row.flags) \(String(repeating: " ", count: max(0, 8 - row.iface.count)))\(row.iface)\n"
        }
        try write("proc/net/ipv6_route", text)
    }

    func operstate(_ iface: String, _ state: String) throws {
        try write("sys/class/net/\(iface)/operstate", "\(state)\n")
    }
}

private let zero128 = String(repeating: "0", count: 32)

@Suite struct DeviceConditionsTests {
    // MARK: Power

    @Test func laptopOnBattery() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.supply("BAT0", type: "Battery")
        try kernel.supply("AC", type: "Mains", online: 0)
        #expect(kernel.reader.externalPower() == false)
    }

    @Test func laptopOnAC() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.supply("BAT0", type: "Battery", online: 1)
        try kernel.supply("BAT1", type: "Battery", online: 1)
        try kernel.supply("ACAD", type: "Mains", online: 1)
        #expect(kernel.reader.externalPower() == true)
    }

    @Test func desktopWithoutBattery() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.mkdir("sys/class/power_supply")
        #expect(kernel.reader.externalPower() == true, "empty power_supply directory")
        try kernel.supply("ups", type: "UPS", online: 0)
        #expect(kernel.reader.externalPower() == true, "a UPS is not a battery of the machine")
    }

    @Test(arguments: ["USB", "USB_C", "USB_PD", "USB_PD_DRP", "USB_DCP", "Wireless"])
    func usbSupplyCountsAsExternal(_ type: String) throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.supply("BAT0", type: "Battery")
        try kernel.supply("ucsi-source-psy-USBC000:001", type: type, online: 0)
        #expect(kernel.reader.externalPower() == false, "\(type) offline")
        try kernel.supply("ucsi-source-psy-USBC000:001", type: type, online: 1)
        #expect(kernel.reader.externalPower() == true, "\(type) online")
        // online 2 is "online, programmable" for USB supplies.
        try kernel.supply("ucsi-source-psy-USBC000:001", type: type, online: 2)
        #expect(kernel.reader.externalPower() == true, "\(type) online=2")
    }

    @Test func peripheralBatteryDoesNotMakeADesktopABattery() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.supply("hid-00:11:22:33:44:55-battery", type: "Battery", scope: "Device")
        #expect(kernel.reader.externalPower() == true)
        try kernel.supply("BAT0", type: "Battery", scope: "System")
        #expect(kernel.reader.externalPower() == false)
    }

    @Test func externalSupplyWithoutOnlineFileIsOffline() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.supply("BAT0", type: "Battery")
        try kernel.supply("AC", type: "Mains")
        #expect(kernel.reader.externalPower() == false)
        try kernel.write("sys/class/power_supply/AC/online", "garbage\n")
        #expect(kernel.reader.externalPower() == false)
    }

    @Test func supplyWithoutTypeIsIgnored() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.mkdir("sys/class/power_supply/odd")
        try kernel.write("sys/class/power_supply/stray-file", "Battery\n")
        #expect(kernel.reader.externalPower() == true)
    }

    // MARK: Network

    @Test func defaultRouteOnAnInterfaceThatIsUp() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.ipv4Routes([("eth0", "00000000", "0003"), ("eth0", "000200C0", "0001")])
        try kernel.operstate("eth0", "up")
        #expect(kernel.reader.network() == true)
        #expect(kernel.reader.defaultRouteInterfaces() == ["eth0"])
    }

    @Test func noDefaultRoute() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.ipv4Routes([("eth0", "000200C0", "0001")])
        try kernel.ipv6Routes([("fe800000000000000000000000000000", "40", "00000001", "eth0")])
        try kernel.operstate("eth0", "up")
        #expect(kernel.reader.network() == false)
        // Header only.
        try kernel.ipv4Routes([])
        try kernel.write("proc/net/ipv6_route", "")
        #expect(kernel.reader.network() == false)
    }

    @Test func defaultRouteThatIsNotUpOrIsReject() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.operstate("eth0", "up")
        try kernel.ipv4Routes([("eth0", "00000000", "0002")])
        #expect(kernel.reader.network() == false, "RTF_UP clear")
        try kernel.ipv4Routes([("eth0", "00000000", "0201")])
        #expect(kernel.reader.network() == false, "RTF_REJECT")
    }

    @Test func defaultRouteOnLoopbackOnly() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.operstate("lo", "unknown")
        try kernel.ipv4Routes([("lo", "00000000", "0001")])
        // What the kernel really lists for IPv6: an unreachable ::/0 on lo.
        try kernel.ipv6Routes([(zero128, "00", "00200200", "lo"), (zero128, "00", "00000001", "lo")])
        #expect(kernel.reader.network() == false)
        #expect(kernel.reader.defaultRouteInterfaces().isEmpty)
    }

    @Test func defaultRouteViaAnInterfaceThatIsDown() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.ipv4Routes([("wlan0", "00000000", "0003")])
        for state in ["down", "dormant", "lowerlayerdown", "notpresent"] {
            try kernel.operstate("wlan0", state)
            #expect(kernel.reader.network() == false, "operstate \(state)")
        }
        try kernel.operstate("wlan0", "unknown")
        #expect(kernel.reader.network() == true, "operstate unknown")
        try kernel.operstate("wlan0", "up")
        #expect(kernel.reader.network() == true, "operstate up")
    }

    @Test func secondDefaultRouteOnAnInterfaceThatIsUp() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.ipv4Routes([("wlan0", "00000000", "0003"), ("eth0", "00000000", "0003")])
        try kernel.operstate("wlan0", "down")
        try kernel.operstate("eth0", "up")
        #expect(kernel.reader.network() == true)
        #expect(kernel.reader.defaultRouteInterfaces() == ["wlan0", "eth0"])
    }

    @Test func missingOperstateCountsAsUp() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.ipv4Routes([("tun0", "00000000", "0001")])
        #expect(kernel.reader.network() == true)
    }

    @Test func ipv6OnlyDefaultRoute() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.ipv4Routes([])
        try kernel.ipv6Routes([
            ("fd000000000000000000000000000000", "40", "00000001", "eth0"),
            (zero128, "00", "00000003", "eth0"),
            (zero128, "00", "00200200", "lo"),
        ])
        try kernel.operstate("eth0", "up")
        #expect(kernel.reader.network() == true)
        #expect(kernel.reader.defaultRouteInterfaces() == ["eth0"])
        // No IPv4 table at all.
        try FileManager.default.removeItem(at: kernel.reader.routeFile)
        #expect(kernel.reader.network() == true)
        try kernel.operstate("eth0", "down")
        #expect(kernel.reader.network() == false)
    }

    @Test func ipv6RouteThatIsNotDefault() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.operstate("eth0", "up")
        // ::/0-looking destination with a non-zero prefix length is not the default route.
        try kernel.ipv6Routes([(zero128, "08", "00000001", "eth0")])
        #expect(kernel.reader.network() == false)
    }

    @Test func malformedRouteLinesAreSkipped() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.operstate("eth0", "up")
        try kernel.write("proc/net/route", FakeKernel.routeHeader + "\nshort\neth0\tzzzzzzzz\t0\t0003\n\n\u{0}\u{ff}\n")
        try kernel.write("proc/net/ipv6_route", "\(zero128) 00 eth0\n\u{1}\u{2}\n")
        #expect(kernel.reader.network() == false)
        // The last line need not end in a newline.
        try kernel.write("proc/net/route", FakeKernel.routeHeader + "\neth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0")
        #expect(kernel.reader.network() == true)
    }

    @Test func headerLineIsNotARoute() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.operstate("eth0", "up")
        // A first line that looks like a default route is the header by definition.
        try kernel.write("proc/net/route", "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
        #expect(kernel.reader.network() == false)
    }

    // MARK: Missing and unreadable files

    @Test func missingFilesReadAsAbsent() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        #expect(kernel.reader.externalPower() == true)
        #expect(kernel.reader.network() == false)
        #expect(kernel.reader.supportedResources() == 0)
    }

    @Test func directoriesAndFifosWhereFilesShouldBeReadAsAbsent() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.mkdir("proc/net/route")
        try kernel.mkdir("proc/net")
        #expect(mkfifo(kernel.reader.ipv6RouteFile.path, 0o644) == 0)
        try kernel.mkdir("sys/class/power_supply/BAT0/type")
        #expect(kernel.reader.network() == false)
        #expect(kernel.reader.externalPower() == true)
        // A FIFO where operstate should be must not hang the reader (reads as missing: up).
        try FileManager.default.removeItem(at: kernel.reader.routeFile)
        try kernel.ipv4Routes([("eth0", "00000000", "0003")])
        try kernel.mkdir("sys/class/net/eth0")
        #expect(mkfifo(kernel.root.appendingPathComponent("sys/class/net/eth0/operstate").path, 0o644) == 0)
        #expect(kernel.reader.network() == true)
    }

    @Test func unreadableFilesReadAsAbsent() throws {
        // Mode 0 files: absent for a normal user; root reads them regardless of mode bits.
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.supply("BAT0", type: "Battery")
        try kernel.ipv4Routes([("eth0", "00000000", "0003")])
        try kernel.operstate("eth0", "up")
        chmod(kernel.root.appendingPathComponent("sys/class/power_supply/BAT0/type").path, 0)
        chmod(kernel.reader.routeFile.path, 0)
        if geteuid() != 0 {
            #expect(kernel.reader.externalPower() == true)
            #expect(kernel.reader.network() == false)
        } else {
            #expect(kernel.reader.externalPower() == false)
            #expect(kernel.reader.network() == true)
        }
    }

    // MARK: GPU

    @Test func gpuFromRenderNode() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.write("dev/dri/card0", "")
        #expect(kernel.reader.supportedResources() == 0, "a display-only card is not a render node")
        try kernel.write("dev/dri/renderD128", "")
        #expect(kernel.reader.supportedResources() == 1)
    }

    @Test func gpuFromNvidiaDevice() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.write("dev/nvidiactl", "")
        #expect(kernel.reader.supportedResources() == 0, "the control node alone is not a GPU")
        try kernel.write("dev/nvidia0", "")
        #expect(kernel.reader.supportedResources() == 1)
    }

    @Test func gpuAbsent() throws {
        let kernel = try FakeKernel()
        defer { kernel.remove() }
        try kernel.write("dev/null", "")
        try kernel.mkdir("dev/dri")
        #expect(kernel.reader.supportedResources() == 0)
    }

    // MARK: resolve

    /// A fake laptop on battery, online, with a GPU.
    private func laptop() throws -> FakeKernel {
        let kernel = try FakeKernel()
        try kernel.supply("BAT0", type: "Battery")
        try kernel.supply("AC", type: "Mains", online: 0)
        try kernel.ipv4Routes([("wlan0", "00000000", "0003")])
        try kernel.operstate("wlan0", "up")
        try kernel.write("dev/dri/renderD128", "")
        return kernel
    }

    @Test func resolveWithoutOverrides() throws {
        let kernel = try laptop()
        defer { kernel.remove() }
        let conditions = DeviceOverrides.resolve(overrides: [:], machine: kernel.reader, unlockedSinceBoot: true)
        #expect(conditions == DeviceConditions(
            externalPower: false, network: true, idle: true, lowPowerMode: false, backgroundRefresh: true,
            locked: false, unlockedSinceBoot: true, supportedResources: 1, thermalState: .nominal,
            sources: ["externalPower": "machine", "network": "machine", "idle": "default", "lowPowerMode": "default",
                      "backgroundRefresh": "default", "locked": "default", "supportedResources": "machine", "thermalState": "default"]))
    }

    @Test func resolveWithEveryOverride() throws {
        let kernel = try laptop()
        defer { kernel.remove() }
        let on = DeviceOverrides.resolve(
            overrides: Dictionary(uniqueKeysWithValues: DeviceOverrides.keys.map { ($0, $0 == "thermal" ? "serious" : "on") }),
            machine: kernel.reader, unlockedSinceBoot: false)
        #expect(on.externalPower && on.network && on.idle && on.lowPowerMode && on.backgroundRefresh && on.locked)
        #expect(on.supportedResources == 1)
        #expect(on.unlockedSinceBoot == false)
        #expect(on.thermalState == .serious)
        #expect(on.sources.count == 8)
        #expect(on.sources.values.allSatisfy { $0 == "override" }, "\(on.sources)")

        let off = DeviceOverrides.resolve(
            overrides: Dictionary(uniqueKeysWithValues: DeviceOverrides.keys.map { ($0, $0 == "thermal" ? "nominal" : "off") }),
            machine: kernel.reader, unlockedSinceBoot: false)
        #expect(!off.externalPower && !off.network && !off.idle && !off.lowPowerMode && !off.backgroundRefresh && !off.locked)
        #expect(off.supportedResources == 0)
        #expect(off.unlockedSinceBoot == true, "not locked now: unlocked since boot")
        #expect(off.sources.values.allSatisfy { $0 == "override" })
    }

    @Test func resolveMixesOverridesMachineAndDefaults() throws {
        let kernel = try laptop()
        defer { kernel.remove() }
        let conditions = DeviceOverrides.resolve(
            overrides: ["power": "on", "idle": "off", "gpu": "off"], machine: kernel.reader, unlockedSinceBoot: true)
        #expect(conditions.externalPower == true)
        #expect(conditions.sources["externalPower"] == "override")
        #expect(conditions.network == true)
        #expect(conditions.sources["network"] == "machine")
        #expect(conditions.idle == false)
        #expect(conditions.sources["idle"] == "override")
        #expect(conditions.lowPowerMode == false)
        #expect(conditions.sources["lowPowerMode"] == "default")
        #expect(conditions.supportedResources == 0)
        #expect(conditions.sources["supportedResources"] == "override")
    }

    @Test func resolveIgnoresValuesOtherThanOnAndOff() throws {
        let kernel = try laptop()
        defer { kernel.remove() }
        let conditions = DeviceOverrides.resolve(
            overrides: ["power": "yes", "network": "", "idle": "ON", "low-power": "1", "refresh": "off ",
                        "locked": "true", "gpu": "maybe", "device.power": "on", "unknown": "on"],
            machine: kernel.reader, unlockedSinceBoot: true)
        let plain = DeviceOverrides.resolve(overrides: [:], machine: kernel.reader, unlockedSinceBoot: true)
        #expect(conditions == plain)
    }

    @Test func unlockedSinceBootPassesThroughWhenLocked() throws {
        let kernel = try laptop()
        defer { kernel.remove() }
        let locked = DeviceOverrides.resolve(overrides: ["locked": "on"], machine: kernel.reader, unlockedSinceBoot: false)
        #expect(locked.locked == true)
        #expect(locked.unlockedSinceBoot == false)
        let lockedAfterUnlock = DeviceOverrides.resolve(overrides: ["locked": "on"], machine: kernel.reader, unlockedSinceBoot: true)
        #expect(lockedAfterUnlock.unlockedSinceBoot == true)
        let unlocked = DeviceOverrides.resolve(overrides: [:], machine: kernel.reader, unlockedSinceBoot: false)
        #expect(unlocked.locked == false)
        #expect(unlocked.unlockedSinceBoot == true)
    }

    @Test func resolvedConditionsRoundTripThroughJSON() throws {
        let kernel = try laptop()
        defer { kernel.remove() }
        let conditions = DeviceOverrides.resolve(overrides: ["refresh": "off"], machine: kernel.reader, unlockedSinceBoot: true)
        let decoded = try JSONDecoder().decode(DeviceConditions.self, from: JSONEncoder().encode(conditions))
        #expect(decoded == conditions)
    }

    // MARK: The real machine

    @Test func realMachineReadsWithoutCrashing() {
        let reader = MachineConditionsReader()
        let power: Bool = reader.externalPower()
        let network: Bool = reader.network()
        let resources: UInt32 = reader.supportedResources()
        #expect(resources & ~UInt32(1) == 0, "only the GPU bit is defined")
        let conditions = DeviceOverrides.resolve(overrides: [:], machine: reader, unlockedSinceBoot: true)
        #expect(conditions.externalPower == power)
        #expect(conditions.network == network)
        #expect(conditions.supportedResources == resources)
        #expect(Set(conditions.sources.keys) == ["externalPower", "network", "idle", "lowPowerMode",
                                                 "backgroundRefresh", "locked", "supportedResources", "thermalState"])
        #expect(Set(conditions.sources.values).isSubset(of: ["machine", "default"]))
    }
}

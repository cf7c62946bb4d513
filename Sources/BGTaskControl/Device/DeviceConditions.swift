import BGTaskSystem
import Foundation
import _BGTaskSystemShims
#if canImport(Glibc)
import Glibc
#endif

/// The device conditions scheduling depends on, each from the real machine where Linux exposes
/// it, with an override for testing (`bgtask device`).
public struct DeviceConditions: Sendable, Equatable, Codable {
    /// On external power (AC or USB supply online, or no battery at all).
    public var externalPower: Bool
    /// A usable network: a default route on an interface that is up.
    public var network: Bool
    /// The device is idle (processing tasks run only then). No Linux signal: default true.
    public var idle: Bool
    /// Low Power Mode: refresh is unavailable. Default false.
    public var lowPowerMode: Bool
    /// The global Background App Refresh switch. Default true.
    public var backgroundRefresh: Bool
    /// Simulated lock state for health research data protection. Default false.
    public var locked: Bool
    /// Unlocked at least once since "boot" (the host's start). Default true.
    public var unlockedSinceBoot: Bool
    /// BGTASK_RESOURCE_* bits (GPU detected from /dev/dri/renderD* or /dev/nvidia*).
    public var supportedResources: UInt32
    /// The thermal state, as `ProcessInfo.thermalState` (from the machine's thermal zones; a
    /// machine without any, such as most VMs, is nominal).
    public var thermalState: ThermalState
    /// For each field, where its value came from: "machine", "override" or "default".
    public var sources: [String: String]

    public init(externalPower: Bool = true, network: Bool = true, idle: Bool = true, lowPowerMode: Bool = false,
                backgroundRefresh: Bool = true, locked: Bool = false, unlockedSinceBoot: Bool = true,
                supportedResources: UInt32 = 0, thermalState: ThermalState = .nominal, sources: [String: String] = [:]) {
        self.externalPower = externalPower
        self.network = network
        self.idle = idle
        self.lowPowerMode = lowPowerMode
        self.backgroundRefresh = backgroundRefresh
        self.locked = locked
        self.unlockedSinceBoot = unlockedSinceBoot
        self.supportedResources = supportedResources
        self.thermalState = thermalState
        self.sources = sources
    }
}

/// How hot the device runs, as `ProcessInfo.ThermalState` (same raw values). What the realistic
/// policy makes of each is in `Eligibility`: processing work waits at `serious`, nothing is
/// launched at `critical`, and running background launches are expired when it turns critical.
public enum ThermalState: Int, Sendable, Codable, CaseIterable, Comparable {
    case nominal, fair, serious, critical

    public var name: String { ["nominal", "fair", "serious", "critical"][rawValue] }

    public init?(name: String) {
        guard let state = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = state
    }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

    /// By name in JSON (`"thermalState": "serious"`), as people and scripts read it.
    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        guard let state = Self(name: name) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "thermal state '\(name)' is not nominal, fair, serious or critical"))
        }
        self = state
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(name)
    }
}

/// Reads conditions from the machine. Paths are injectable so tests can play the kernel.
public struct MachineConditionsReader: Sendable {
    public var powerSupplyDirectory: URL = URL(fileURLWithPath: "/sys/class/power_supply")
    public var routeFile: URL = URL(fileURLWithPath: "/proc/net/route")
    public var ipv6RouteFile: URL = URL(fileURLWithPath: "/proc/net/ipv6_route")
    public var netClassDirectory: URL = URL(fileURLWithPath: "/sys/class/net")
    public var devDirectory: URL = URL(fileURLWithPath: "/dev")
    public var thermalDirectory: URL = URL(fileURLWithPath: "/sys/class/thermal")
    /// The last thermal reading and when (monotonic ns), kept `thermalCacheNs`: a zone's
    /// temperature can take milliseconds to read (ACPI), and the host asks for its conditions
    /// on the launch path. Shared by copies of this reader.
    private let thermalCache = LockedValue<(at: UInt64, state: ThermalState?)?>(nil)
    /// Each zone's last state, for hysteresis (`thermalState(temperature:trips:hysteresis:previous:)`).
    private let thermalZones = LockedValue<[String: ThermalState]>([:])
    public static let thermalCacheNs: UInt64 = 2_000_000_000

    public init() {}

    /// External power: true if any supply of type Mains/USB/USB_* reports online=1, or if no
    /// supply of type Battery exists; false if batteries exist and nothing external is online.
    public func externalPower() -> Bool {
        var batteries = 0
        for supply in SysFS.entries(of: powerSupplyDirectory) {
            let directory = powerSupplyDirectory.appendingPathComponent(supply)
            guard let type = SysFS.firstLine(of: directory.appendingPathComponent("type")) else { continue }
            // A supply whose scope is "Device" powers a peripheral (a wireless mouse's battery,
            // a phone charging over USB), not this machine.
            if SysFS.firstLine(of: directory.appendingPathComponent("scope"))?.lowercased() == "device" { continue }
            if type == "Battery" {
                batteries += 1
            } else if Self.isExternalSupplyType(type) {
                // online: 0 offline, 1 online, 2 online (programmable); absent or unreadable: offline.
                if let online = SysFS.firstLine(of: directory.appendingPathComponent("online")),
                   let value = Int(online), value != 0 {
                    return true
                }
            }
        }
        return batteries == 0
    }

    /// Supply types that feed the machine from outside: Mains, USB and its variants (USB_C,
    /// USB_PD, USB_DCP, ... on older kernels), wireless chargers and BrickID.
    package static func isExternalSupplyType(_ type: String) -> Bool {
        type == "Mains" || type == "USB" || type.hasPrefix("USB_") || type == "Wireless" || type == "BrickID"
    }

    /// Network: a default route (destination 0 in /proc/net/route, or ::/0 in ipv6_route) whose
    /// interface is not loopback and has operstate "up" or "unknown".
    public func network() -> Bool {
        defaultRouteInterfaces().contains { interfaceIsUp($0) }
    }

    /// Interfaces (other than loopback) that carry an IPv4 or IPv6 default route, in table order.
    package func defaultRouteInterfaces() -> [String] {
        var result: [String] = []
        func add(_ interface: String) {
            if interface != "lo" && !result.contains(interface) { result.append(interface) }
        }
        // /proc/net/route: a header line, then "Iface Destination Gateway Flags RefCnt Use
        // Metric Mask MTU Window IRTT", addresses and flags in hex.
        SysFS.forEachLine(of: routeFile) { line, index in
            guard index > 0 else { return true }
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count >= 4, let destination = UInt32(fields[1], radix: 16),
                  let flags = UInt32(fields[3], radix: 16) else { return true }
            if destination == 0 && flags & Self.routeUp != 0 && flags & Self.routeReject == 0 {
                add(String(fields[0]))
            }
            return true
        }
        // /proc/net/ipv6_route: "destination prefix-length source prefix-length next-hop metric
        // refcnt use flags interface", no header; ::/0 is 32 zeros with prefix length 00.
        SysFS.forEachLine(of: ipv6RouteFile) { line, _ in
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count >= 10 else { return true }
            let destination = fields[0], prefix = fields[1]
            guard destination.count == 32, destination.allSatisfy({ $0 == "0" }), prefix == "00" else { return true }
            // The kernel lists an unreachable ::/0 (RTF_REJECT) on lo; skip reject routes anywhere.
            if let flags = UInt32(fields[8], radix: 16), flags & Self.routeReject != 0 { return true }
            add(String(fields[fields.count - 1]))
            return true
        }
        return result
    }

    /// operstate "up" or "unknown" (what loopback-like and many virtual interfaces report);
    /// a missing or unreadable operstate counts as up.
    package func interfaceIsUp(_ interface: String) -> Bool {
        guard !interface.isEmpty, !interface.contains("/"), interface != ".", interface != ".." else { return false }
        let file = netClassDirectory.appendingPathComponent(interface).appendingPathComponent("operstate")
        guard let state = SysFS.firstLine(of: file) else { return true }
        let lowered = state.lowercased()
        return lowered == "up" || lowered == "unknown"
    }

    package static let routeUp: UInt32 = 0x0001      // RTF_UP
    package static let routeReject: UInt32 = 0x0200  // RTF_REJECT

    /// GPU: BGTASK_RESOURCE_GPU (1) if /dev/dri/renderD* or /dev/nvidia0 exists.
    public func supportedResources() -> UInt32 {
        let dri = devDirectory.appendingPathComponent("dri")
        let renderNode = SysFS.entries(of: dri).contains { $0.hasPrefix("renderD") }
        let nvidia = SysFS.exists(devDirectory.appendingPathComponent("nvidia0"))
        return renderNode || nvidia ? Self.resourceGPU : 0
    }

    /// The hottest of the machine's thermal zones, or nil when it has none (most VMs). Per zone
    /// (`thermal_zone*` with `mode` not `disabled`), from its temperature and its trip points,
    /// which the kernel and firmware set for that sensor:
    /// - critical: at or over its lowest `hot` or `critical` trip (the kernel shuts down or
    ///   reboots past these);
    /// - serious: at or over its lowest `passive` trip (the kernel throttles the CPU there), or
    ///   10 °C under critical when it has none;
    /// - fair: at or over its lowest `active` trip (a fan starts), or 10 °C under serious
    ///   when it has none;
    /// - nominal below. A zone without trip points, or with an unreadable temperature, counts
    ///   as nominal.
    ///
    /// A zone's state falls only once its temperature is its trip's hysteresis under the
    /// threshold it crossed (the kernel's `trip_point_N_hyst`, else 2 °C), as the kernel's own
    /// trips and iOS's states do: a sensor hovering at a trip point does not flap between two
    /// states, expiring and holding work at every crossing.
    public func thermalState() -> ThermalState? {
        let now = bgtask_monotonic_ns()
        if let cached = thermalCache.withLock({ $0 }), now < cached.at + Self.thermalCacheNs { return cached.state }
        let state = readThermalState()
        thermalCache.withLock { $0 = (now, state) }
        return state
    }

    /// A reading now, past the cache (tests).
    package func uncachedThermalState() -> ThermalState? { readThermalState() }

    private func readThermalState() -> ThermalState? {
        let zones = SysFS.entries(of: thermalDirectory).filter { $0.hasPrefix("thermal_zone") }
        guard !zones.isEmpty else { return nil }
        var hottest = ThermalState.nominal
        var states: [String: ThermalState] = [:]
        let previous = thermalZones.withLock { $0 }
        defer { thermalZones.withLock { $0 = states } }
        for zone in zones {
            let directory = thermalDirectory.appendingPathComponent(zone)
            if SysFS.firstLine(of: directory.appendingPathComponent("mode")) == "disabled" { continue }
            guard let text = SysFS.firstLine(of: directory.appendingPathComponent("temp")), let temperature = Int(text) else { continue }
            var trips: [String: Int] = [:]
            var hysteresis = Self.defaultHysteresis
            for entry in SysFS.entries(of: directory) where entry.hasPrefix("trip_point_") && entry.hasSuffix("_type") {
                let stem = entry.dropLast("_type".count)
                guard let type = SysFS.firstLine(of: directory.appendingPathComponent(entry)),
                      let value = SysFS.firstLine(of: directory.appendingPathComponent(stem + "_temp")).flatMap({ Int($0) }),
                      value > 0 else { continue }
                let kind = type == "hot" ? "critical" : type
                trips[kind] = min(trips[kind] ?? .max, value)
                // The largest the zone's trips state (bounded: a garbage figure cannot hold a state for good).
                if let hyst = SysFS.firstLine(of: directory.appendingPathComponent(stem + "_hyst")).flatMap({ Int($0) }), hyst > 0 {
                    hysteresis = max(hysteresis, min(hyst, Self.maximumHysteresis))
                }
            }
            let state = Self.thermalState(temperature: temperature, trips: trips, hysteresis: hysteresis, previous: previous[zone] ?? .nominal)
            states[zone] = state
            hottest = max(hottest, state)
        }
        return hottest
    }

    /// Hysteresis when a zone states none, and the most one may state (millidegrees).
    package static let defaultHysteresis = 2_000
    package static let maximumHysteresis = 10_000

    /// One zone's state with hysteresis: what its temperature says, or, when that is lower
    /// than `previous`, the state `hysteresis` more would say (never above `previous`).
    package static func thermalState(temperature: Int, trips: [String: Int], hysteresis: Int, previous: ThermalState) -> ThermalState {
        let now = thermalState(temperature: temperature, trips: trips)
        guard now < previous else { return now }
        return max(now, min(previous, thermalState(temperature: temperature + hysteresis, trips: trips)))
    }

    /// One zone's state from its temperature and lowest trip of each kind (`critical` (with
    /// `hot`), `passive`, `active`), all in millidegrees Celsius.
    package static func thermalState(temperature: Int, trips: [String: Int]) -> ThermalState {
        let critical = trips["critical"]
        guard let serious = trips["passive"] ?? critical.map({ $0 - 10_000 }) else { return .nominal }
        let fair = trips["active"].map { min($0, serious) } ?? serious - 10_000
        if let critical, temperature >= critical { return .critical }
        if temperature >= serious { return .serious }
        if temperature >= fair { return .fair }
        return .nominal
    }

    /// BGTASK_RESOURCE_GPU in bgtask/plugin.h (BGTaskHost does not import the ABI module).
    package static let resourceGPU: UInt32 = 1
}

/// Overrides stored as settings (keys `device.power`, `device.network`, `device.idle`,
/// `device.low-power`, `device.refresh`, `device.locked`, `device.gpu`; values "on"/"off",
/// absent = machine or default) combined with the machine's values.
public enum DeviceOverrides {
    /// `thermal` holds a state's name (`ThermalState.name`) rather than on or off.
    public static let keys = DeviceCondition.allCases.map(\.rawValue) + ["thermal"]

    /// Combines `overrides` (key without the "device." prefix → "on"/"off") with the machine.
    public static func resolve(overrides: [String: String], machine: MachineConditionsReader,
                               unlockedSinceBoot: Bool) -> DeviceConditions {
        var sources: [String: String] = [:]

        /// The override for `key` ("on" → true, "off" → false; anything else is ignored).
        func override(_ key: String) -> Bool? {
            switch overrides[key] {
            case "on": true
            case "off": false
            default: nil
            }
        }
        /// The override for `key`, else the machine's value (read only when needed).
        func fromMachine(_ key: String, _ field: String, _ read: () -> Bool) -> Bool {
            if let value = override(key) {
                sources[field] = "override"
                return value
            }
            sources[field] = "machine"
            return read()
        }
        /// The override for `key`, else `value`.
        func withDefault(_ key: String, _ field: String, _ value: Bool) -> Bool {
            if let overridden = override(key) {
                sources[field] = "override"
                return overridden
            }
            sources[field] = "default"
            return value
        }

        let externalPower = fromMachine("power", "externalPower") { machine.externalPower() }
        let network = fromMachine("network", "network") { machine.network() }
        let idle = withDefault("idle", "idle", true)
        let lowPowerMode = withDefault("low-power", "lowPowerMode", false)
        let backgroundRefresh = withDefault("refresh", "backgroundRefresh", true)
        let locked = withDefault("locked", "locked", false)
        let resources: UInt32
        switch override("gpu") {
        case true?:
            sources["supportedResources"] = "override"
            resources = MachineConditionsReader.resourceGPU
        case false?:
            sources["supportedResources"] = "override"
            resources = 0
        case nil:
            sources["supportedResources"] = "machine"
            resources = machine.supportedResources()
        }
        let thermal: ThermalState
        if let name = overrides["thermal"], let state = ThermalState(name: name) {
            sources["thermalState"] = "override"
            thermal = state
        } else if let state = machine.thermalState() {
            sources["thermalState"] = "machine"
            thermal = state
        } else {
            // No thermal zone to read (a VM): nominal, as a device at rest.
            sources["thermalState"] = "default"
            thermal = .nominal
        }
        return DeviceConditions(
            externalPower: externalPower, network: network, idle: idle, lowPowerMode: lowPowerMode,
            backgroundRefresh: backgroundRefresh, locked: locked,
            // A device that is unlocked now has been unlocked since boot.
            unlockedSinceBoot: locked ? unlockedSinceBoot : true,
            supportedResources: resources, thermalState: thermal, sources: sources)
    }
}

/// Reading kernel-provided text files (sysfs, procfs) defensively: a missing, unreadable or
/// odd file (a directory, a FIFO) reads as absent, never as a crash or a hang.
package enum SysFS {
    /// Calls `body` with each line (without its newline) and its index until it returns false.
    /// Streams the file, so a large routing table is not read whole. Does nothing if the file
    /// cannot be opened as a regular file.
    package static func forEachLine(of url: URL, _ body: (Substring, Int) -> Bool) {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { return }

        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        var index = 0
        /// Hands complete lines in `pending` to `body`; false once `body` asked to stop.
        func drain(final: Bool) -> Bool {
            var start = 0
            while let newline = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[start..<newline], as: UTF8.self)
                start = newline + 1
                defer { index += 1 }
                if !body(line[...], index) { return false }
            }
            pending.removeFirst(start)
            if final && !pending.isEmpty {
                let line = String(decoding: pending, as: UTF8.self)
                pending.removeAll()
                defer { index += 1 }
                return body(line[...], index)
            }
            return true
        }
        while true {
            let count = retryingEINTR { buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }
            if count <= 0 { break }  // end of file, or an error: what was read so far counts
            pending.append(contentsOf: buffer[0..<count])
            if !drain(final: false) { return }
        }
        _ = drain(final: true)
    }

    /// The first line of a small file, trimmed of whitespace; nil if absent or unreadable.
    package static func firstLine(of url: URL) -> String? {
        var result: String?
        forEachLine(of: url) { line, _ in
            result = line.trimmingCharacters(in: .whitespacesAndNewlines)
            return false
        }
        return result
    }

    /// The names in a directory, sorted; empty if it is absent or unreadable.
    package static func entries(of directory: URL) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).sorted()
    }

    /// Whether anything (file, device node, symlink target) is at `url`.
    package static func exists(_ url: URL) -> Bool {
        var status = stat()
        return stat(url.path, &status) == 0
    }
}

import Foundation

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
    /// For each field, where its value came from: "machine", "override" or "default".
    public var sources: [String: String]

    public init(externalPower: Bool = true, network: Bool = true, idle: Bool = true, lowPowerMode: Bool = false,
                backgroundRefresh: Bool = true, locked: Bool = false, unlockedSinceBoot: Bool = true,
                supportedResources: UInt32 = 0, sources: [String: String] = [:]) {
        self.externalPower = externalPower
        self.network = network
        self.idle = idle
        self.lowPowerMode = lowPowerMode
        self.backgroundRefresh = backgroundRefresh
        self.locked = locked
        self.unlockedSinceBoot = unlockedSinceBoot
        self.supportedResources = supportedResources
        self.sources = sources
    }
}

/// Reads conditions from the machine. Paths are injectable so tests can play the kernel.
public struct MachineConditionsReader: Sendable {
    public var powerSupplyDirectory: URL = URL(fileURLWithPath: "/sys/class/power_supply")
    public var routeFile: URL = URL(fileURLWithPath: "/proc/net/route")
    public var ipv6RouteFile: URL = URL(fileURLWithPath: "/proc/net/ipv6_route")
    public var netClassDirectory: URL = URL(fileURLWithPath: "/sys/class/net")
    public var devDirectory: URL = URL(fileURLWithPath: "/dev")

    public init() {}

    /// External power: true if any supply of type Mains/USB/USB_* reports online=1, or if no
    /// supply of type Battery exists; false if batteries exist and nothing external is online.
    public func externalPower() -> Bool { fatalError("unimplemented") }

    /// Network: a default route (destination 0 in /proc/net/route, or ::/0 in ipv6_route) whose
    /// interface is not loopback and has operstate "up" or "unknown".
    public func network() -> Bool { fatalError("unimplemented") }

    /// GPU: BGTASK_RESOURCE_GPU (1) if /dev/dri/renderD* or /dev/nvidia0 exists.
    public func supportedResources() -> UInt32 { fatalError("unimplemented") }
}

/// Overrides stored as settings (keys `device.power`, `device.network`, `device.idle`,
/// `device.low-power`, `device.refresh`, `device.locked`, `device.gpu`; values "on"/"off",
/// absent = machine or default) combined with the machine's values.
public enum DeviceOverrides {
    public static let keys = ["power", "network", "idle", "low-power", "refresh", "locked", "gpu"]

    /// Combines `overrides` (key without the "device." prefix → "on"/"off") with the machine.
    public static func resolve(overrides: [String: String], machine: MachineConditionsReader,
                               unlockedSinceBoot: Bool) -> DeviceConditions { fatalError("unimplemented") }
}

import BGTaskControl
import BGTaskHost
import BGTaskLaunch
import BGTaskModel
import Foundation
import Testing

/// The system's judgement as iOS exercises it: thermal state (read from thermal zones, overridden,
/// deferring and expiring work, told to the app) and the background CPU limit.
@Suite struct DeviceJudgementTests {
    // MARK: Thermal state from the machine

    /// A fake /sys/class/thermal: zone name → (temp, mode, [(trip type, trip temp)]).
    private func thermalDirectory(_ zones: [String: (temp: String, mode: String?, trips: [(String, Int)])]) throws -> (URL, Scratch) {
        let scratch = try Scratch()
        let root = scratch.url.appendingPathComponent("thermal")
        for (name, zone) in zones {
            let directory = root.appendingPathComponent(name)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try (zone.temp + "\n").write(to: directory.appendingPathComponent("temp"), atomically: true, encoding: .utf8)
            if let mode = zone.mode { try (mode + "\n").write(to: directory.appendingPathComponent("mode"), atomically: true, encoding: .utf8) }
            for (index, (type, temp)) in zone.trips.enumerated() {
                try (type + "\n").write(to: directory.appendingPathComponent("trip_point_\(index)_type"), atomically: true, encoding: .utf8)
                try "\(temp)\n".write(to: directory.appendingPathComponent("trip_point_\(index)_temp"), atomically: true, encoding: .utf8)
            }
        }
        // Not a zone: the kernel's cooling devices sit beside them.
        try FileManager.default.createDirectory(at: root.appendingPathComponent("cooling_device0"), withIntermediateDirectories: true)
        return (root, scratch)
    }

    private func state(_ zones: [String: (temp: String, mode: String?, trips: [(String, Int)])]) throws -> ThermalState? {
        let (root, scratch) = try thermalDirectory(zones)
        defer { scratch.remove() }
        var reader = MachineConditionsReader()
        reader.thermalDirectory = root
        return reader.thermalState()
    }

    @Test func thermalZonesAreReadWithTheirTripPoints() throws {
        let laptop: [(String, Int)] = [("active", 60_000), ("passive", 85_000), ("critical", 105_000)]
        #expect(try state(["thermal_zone0": ("45000", "enabled", laptop)]) == .nominal)
        #expect(try state(["thermal_zone0": ("62000", "enabled", laptop)]) == .fair)
        #expect(try state(["thermal_zone0": ("85000", "enabled", laptop)]) == .serious)
        #expect(try state(["thermal_zone0": ("105000", "enabled", laptop)]) == .critical)
        // Only a critical trip (many ACPI zones): serious 10 °C under it, fair 10 °C under that.
        let acpi: [(String, Int)] = [("critical", 100_000)]
        #expect(try state(["thermal_zone0": ("79000", nil, acpi)]) == .nominal)
        #expect(try state(["thermal_zone0": ("81000", nil, acpi)]) == .fair)
        #expect(try state(["thermal_zone0": ("92000", nil, acpi)]) == .serious)
        // `hot` counts as critical; the hottest zone wins; a disabled zone and a zone whose
        // temperature cannot be read are left out; a zone without trips is nominal.
        #expect(try state(["thermal_zone0": ("45000", nil, acpi), "thermal_zone1": ("96000", nil, [("hot", 95_000)])]) == .critical)
        #expect(try state(["thermal_zone0": ("45000", nil, acpi), "thermal_zone1": ("120000", "disabled", acpi)]) == .nominal)
        #expect(try state(["thermal_zone0": ("garbage", nil, acpi), "thermal_zone1": ("99000", nil, [])]) == .nominal)
        // No zone at all (a VM): nil, which the host takes as nominal by default.
        #expect(try state([:]) == nil)
        let conditions = DeviceOverrides.resolve(overrides: ["thermal": "serious"], machine: MachineConditionsReader(), unlockedSinceBoot: true)
        #expect(conditions.thermalState == .serious && conditions.sources["thermalState"] == "override")
        let garbage = DeviceOverrides.resolve(overrides: ["thermal": "toasty"], machine: MachineConditionsReader(), unlockedSinceBoot: true)
        #expect(garbage.sources["thermalState"] != "override")
    }

    /// A zone falls back a state only once it is its hysteresis under the trip it crossed
    /// (the kernel's `trip_point_N_hyst`, else 2 °C): a sensor hovering at a trip holds its state.
    @Test func aZoneHoveringAtATripPointDoesNotFlap() throws {
        let (root, scratch) = try thermalDirectory(["thermal_zone0": ("84000", nil, [("active", 60_000), ("passive", 85_000), ("critical", 105_000)])])
        defer { scratch.remove() }
        let temp = root.appendingPathComponent("thermal_zone0/temp")
        func reading(_ millidegrees: Int) throws -> ThermalState? {
            try "\(millidegrees)\n".write(to: temp, atomically: true, encoding: .utf8)
            var reader = MachineConditionsReader()
            reader.thermalDirectory = root
            return reader.thermalState()
        }
        // A reader per reading (no cache), sharing nothing: hysteresis lives in one reader.
        var reader = MachineConditionsReader()
        reader.thermalDirectory = root
        func read(_ millidegrees: Int) throws -> ThermalState? {
            try "\(millidegrees)\n".write(to: temp, atomically: true, encoding: .utf8)
            return reader.uncachedThermalState()
        }
        #expect(try read(84_000) == .fair)
        #expect(try read(85_000) == .serious)
        #expect(try read(84_000) == .serious, "1 °C under the passive trip: still serious")
        #expect(try read(83_500) == .serious)
        #expect(try read(82_900) == .fair, "2 °C under it: fair again")
        #expect(try reading(84_000) == .fair, "a new reader has no history")
        // The zone's own hysteresis, when it states one.
        try "5000\n".write(to: root.appendingPathComponent("thermal_zone0/trip_point_1_hyst"), atomically: true, encoding: .utf8)
        #expect(try read(85_000) == .serious)
        #expect(try read(81_000) == .serious, "4 °C under: within the zone's 5 °C")
        #expect(try read(79_900) == .fair)
        // Pure: with no previous state, no hysteresis.
        let trips = ["passive": 85_000, "critical": 105_000]
        #expect(MachineConditionsReader.thermalState(temperature: 104_000, trips: trips, hysteresis: 2_000, previous: .critical) == .critical)
        #expect(MachineConditionsReader.thermalState(temperature: 102_000, trips: trips, hysteresis: 2_000, previous: .critical) == .serious)
        #expect(MachineConditionsReader.thermalState(temperature: 104_000, trips: trips, hysteresis: 2_000, previous: .nominal) == .serious)
    }

    @Test func processingWaitsWhenSeriousAndNothingRunsWhenCritical() {
        func blockers(_ kind: TaskKind, _ thermal: ThermalState, _ policy: SchedulingPolicy) -> [String] {
            var conditions = DeviceConditions(thermalState: thermal)
            conditions.sources["thermalState"] = "override"
            let eligibility = Eligibility(policy: policy, now: Date(), conditions: conditions, runningLaunches: 0, maximumConcurrentLaunches: 4)
            let stored = StoredRequest(app: "com.example.app", request: TaskRequest(kind: kind, identifier: "com.example.app.t"), submittedAt: Date())
            return eligibility.blockers(for: stored, app: nil, state: AppState(app: "com.example.app"), appRunning: false)
                .filter { $0.knownCode == .thermalState }.map(\.message)
        }
        for kind in TaskKind.allCases {
            #expect(blockers(kind, .fair, .realistic).isEmpty)
            #expect(blockers(kind, .critical, .realistic).count == 1, "\(kind)")
            #expect(blockers(kind, .critical, .immediate).count == 1, "critical holds everything back in every policy")
        }
        #expect(blockers(.processing, .serious, .realistic).first?.contains("serious") == true)
        #expect(blockers(.healthResearch, .serious, .realistic).count == 1)
        #expect(blockers(.refresh, .serious, .realistic).isEmpty)
        #expect(blockers(.processing, .serious, .immediate).isEmpty, "the immediate policy does not defer")
        #expect(BlockerCode.thermalState.liftsWithDeviceConditions)
    }

    @Test func theDeviceVerbRefusesAThermalStateItDoesNotKnow() throws {
        #expect(throws: ControlFailure.self) { try ControlCommand(wire: ControlRequest(verb: "device", device: ["thermal": "toasty"])) }
        let command = try ControlCommand(wire: ControlRequest(verb: "device", device: ["thermal": "critical"]))
        #expect(command == .device(DeviceChanges(thermal: .critical)))
        let result = try runCLI(["device", "--thermal", "warm", "--state", "/nonexistent"])
        #expect(result.status != 0 && result.stderr.contains("warm"), "\(result.stderr)")
    }

    // MARK: Thermal state through a real host

    /// Polls the launch logs of `state` until one holds `text`.
    private func waitForLog(_ scratch: Scratch, containing text: String, within seconds: Double = 15) -> Bool {
        eventually(within: seconds) {
            let logs = scratch.state.appendingPathComponent("logs")
            let names = (try? FileManager.default.contentsOfDirectory(atPath: logs.path)) ?? []
            return names.contains { ((try? String(contentsOf: logs.appendingPathComponent($0), encoding: .utf8)) ?? "").contains(text) }
        }
    }

    @Test func aCriticalDeviceExpiresRunningWorkHoldsNewWorkAndTheAppSeesEachChange() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let host = try HostProcess.started(scratch, arguments: ["--clock", "virtual", "--budget", "60s", "--grace", "2s"], installing: [.misbehaving])
        defer { host.stop() }
        #expect(try host.cli(["device", "--low-power", "off"]).status == 0)
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.thermal"]).status == 0)
        #expect(waitForLog(scratch, containing: "misbehaving: thermal: began at state 0, low power false"))

        // Serious: the app hears it, its refresh goes on.
        let serious = try host.cli(["device", "--thermal", "serious"])
        #expect(serious.status == 0 && serious.stdout.contains("serious"), "\(serious.stdout)")
        #expect(waitForLog(scratch, containing: "misbehaving: thermal: state changed to 2"))
        #expect(try host.send(.history()).records?.isEmpty == true)

        // Critical: expired (its handler completes it), with the reason in the record.
        #expect(try host.cli(["device", "--thermal", "critical"]).status == 0)
        let records = try host.waitForHistory(count: 1)
        let record = try #require(records.first)
        #expect(record.task("com.example.misbehaving.thermal")?.outcome == .expired, "\(record)")
        #expect(record.expirationReason?.contains("thermal state turned critical") == true, "\(record.expirationReason ?? "nil")")
        #expect(record.termination == .exited || record.termination == .suspended)
        let log = try String(contentsOfFile: try #require(record.log), encoding: .utf8)
        #expect(log.contains("misbehaving: thermal: expired at state 3"), "\(log)")

        // Nothing starts while it is critical; why says so; cooling lets it run.
        #expect(try host.cli(["submit", "com.example.misbehaving", "com.example.misbehaving.ok"]).status == 0)
        let why = try #require(try host.send(.why(identifier: "com.example.misbehaving.ok")).why)
        #expect(why.blockers.contains { $0.code == "thermal-state" && $0.message.contains("critical") }, "\(why.text)")
        usleep(300_000)
        #expect(try host.send(.history()).records?.count == 1)
        #expect(try host.cli(["device", "--thermal", "auto"]).status == 0)
        let after = try host.waitForHistory(count: 2)
        #expect(after.contains { $0.task("com.example.misbehaving.ok")?.outcome == .succeeded })
    }

    // MARK: The CPU limit

    @Test func aBackgroundCPUHogIsKilledAsCPULimitAndAModestLaunchIsNot() throws {
        let scratch = try Scratch()
        defer { scratch.remove() }
        let bundle = try scratch.bundle("Misbehaving", info: "Tests/Fixtures/Misbehaving/Info.plist")
        // `spin` burns a core and ignores expiration: over 50 % of a core over any 1 s, killed
        // within about a second, long before its 20 s budget.
        let (hog, _) = try scratch.run(bundle, ["--task", "com.example.misbehaving.spin:refresh", "--budget", "20s", "--cpu-limit", "50%/1s"])
        #expect(hog.termination == .cpuLimit, "\(hog)")
        #expect(hog.signal == "SIGKILL")
        #expect(hog.error?.contains("over the background limit of 50% of a core over 1s") == true, "\(hog.error ?? "nil")")
        #expect(hog.wallMs < 5_000, "killed within the window and its check interval, not at the budget")
        #expect(hog.cpuMs >= 500)
        #expect(hog.energy?.cpuLimit == "50% of a core over 1s")

        // The same limit does not touch a launch that sleeps.
        let (calm, _) = try scratch.run(bundle, ["--task", "com.example.misbehaving.ok:refresh", "--cpu-limit", "50%/1s"])
        #expect(calm.termination != .cpuLimit && calm.tasks.first?.outcome == .succeeded, "\(calm)")
        // Off: the hog runs to its watchdog.
        let (unlimited, _) = try scratch.run(bundle, ["--task", "com.example.misbehaving.spin:refresh", "--budget", "1500ms", "--grace", "200ms", "--cpu-limit", "off"])
        #expect(unlimited.termination == .watchdog, "\(unlimited)")
        #expect(unlimited.energy?.cpuLimit == "none: --cpu-limit off")

        let refused = try runCLI(["run", bundle.path, "--task", "com.example.misbehaving.ok:refresh", "--cpu-limit", "80"])
        #expect(refused.status != 0 && refused.stderr.contains("PERCENT%/DURATION"), "\(refused.stderr)")
    }

    @Test func cpuLimitsReadAsTheyPrint() {
        #expect(CPULimit.parse("80%/60s") == .ios)
        #expect(CPULimit.ios.description == "80% of a core over 1m")
        #expect(CPULimit.parse(CPULimit.ios.argument) == .ios)
        #expect(CPULimit.parse("150%/1m")?.allowedNs == 90_000_000_000)
        for bad in ["80", "80%", "/60s", "0%/60s", "-5%/1s", "80%/0s", "80%/10ms", "nan%/1s", "80%/2d", "80%/60s/1"] {
            #expect(CPULimit.parse(bad) == nil, "\(bad)")
        }
    }

    @Test func theMonitorCountsOnlyTheTrailingWindow() throws {
        var monitor = CPUMonitor(limit: CPULimit(percentOfCore: 50, window: .seconds(1)), startNs: 0)
        var cpu: UInt64 = 0
        // 40 % of a core for ten seconds: never over 50 % in any second.
        for step in 0...120 {
            let now = UInt64(step) * 100_000_000
            cpu = UInt64(Double(now) * 0.4)
            #expect(monitor.check(at: now) { cpu } == nil, "at \(now)")
        }
        // Then a whole core: over within a window and a check.
        var killedAt: UInt64?
        for step in 121...200 where killedAt == nil {
            let now = UInt64(step) * 100_000_000
            cpu += 100_000_000
            if monitor.check(at: now, cpuNs: { cpu }) != nil { killedAt = now }
        }
        let at = try #require(killedAt)
        #expect(at <= 13_200_000_000)
    }
}

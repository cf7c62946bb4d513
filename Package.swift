// swift-tools-version: 6.0
//
// Targets are split by who uses them:
//   - `BackgroundTasks`   the API plugin authors import (Apple's framework, the Swift face of the ABI)
//   - `CBGTaskPluginABI`  the C header that *is* the plugin ABI (plugins written in C include it)
//   - `BGTaskABI`         the ABI's growth rules in Swift (one reader of every struct), for the SDK and the runner
//   - `BGTaskHost`        the host's internals: bundles, launch supervision, run records
//   - `BGTaskModel`       the domain model: task kinds, task requests, assignments, containers, shared rules
//   - `BGTaskWire`        the launch channel's and the zygote's protocols, shared by the host and the runner
//   - `BGTaskSystem`      the system layer: system calls (EINTR, errno), directories, process
//                         trees (/proc), signal names; shared by the host, the runner, the bench and tests
//   - `bgtask-runner`     the child process: loads one bundle and serves the ABI to it
//   - `bgtask`            the CLI
//   - `_BGTaskSystemShims`, `CFFI`  C shims and the libffi system library (not API)
//
// Linux only (namespaces, Landlock, seccomp, /proc, pidfds): no platform is declared for others.
import PackageDescription

let package = Package(
    name: "bgtask",
    products: [
        .library(name: "BackgroundTasks", targets: ["BackgroundTasks"]),
        .library(name: "UIKit", targets: ["UIKit"]),
        .library(name: "UserNotifications", targets: ["UserNotifications"]),
        .library(name: "BGTaskHost", targets: ["BGTaskHost"]),
        .executable(name: "bgtask", targets: ["bgtask"]),
        .executable(name: "bgtask-runner", targets: ["bgtask-runner"]),
        .executable(name: "bgtask-bench", targets: ["bgtask-bench"]),

        // Example plugins (Plugins/): each one is a shared library loaded only in a child process.
        .library(name: "Feed", type: .dynamic, targets: ["Feed"]),
        .library(name: "Counter", type: .dynamic, targets: ["Counter"]),
        .library(name: "FeedShare", type: .dynamic, targets: ["FeedShare"]),

        // Test fixtures (Tests/Fixtures/): plugins that exercise the API and misbehave on purpose.
        .library(name: "ApplePatterns5", type: .dynamic, targets: ["ApplePatterns5"]),
        .library(name: "ApplePatterns6", type: .dynamic, targets: ["ApplePatterns6"]),
        .library(name: "Misbehaving", type: .dynamic, targets: ["Misbehaving"]),
        .library(name: "BadABI", type: .dynamic, targets: ["BadABI"]),
        .library(name: "NoEntry", type: .dynamic, targets: ["NoEntry"]),
        .library(name: "EntryFails", type: .dynamic, targets: ["EntryFails"]),
        .library(name: "CrashInConstructor", type: .dynamic, targets: ["CrashInConstructor"]),
        .library(name: "BenchPlugin", type: .dynamic, targets: ["BenchPlugin"]),
        .library(name: "IOSApp", type: .dynamic, targets: ["IOSApp"]),
        .library(name: "BackgroundTime", type: .dynamic, targets: ["BackgroundTime"]),
        .library(name: "Podcasts", type: .dynamic, targets: ["Podcasts"]),
        .library(name: "Hostile", type: .dynamic, targets: ["Hostile"]),
        .library(name: "ABIGrowth", type: .dynamic, targets: ["ABIGrowth"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.0.0"),
    ],
    targets: [
        // MARK: The ABI and the SDK
        .target(name: "CBGTaskPluginABI"),
        // The ABI's growth rules in Swift (one struct reader), for both sides: the SDK and the runner.
        .target(name: "BGTaskABI", dependencies: ["CBGTaskPluginABI"]),
        .target(
            name: "BackgroundTasks",
            dependencies: ["BGTaskABI", "CBGTaskPluginABI"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // Apple's module name for the UIKit API that background execution uses (the application
        // object, its delegate, background time): app code importing it compiles unchanged.
        .target(
            name: "UIKit",
            dependencies: ["BackgroundTasks", "BGTaskABI", "CBGTaskPluginABI"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // Apple's module name for local notifications (UNUserNotificationCenter and its types):
        // app code that posts "new episodes downloaded" after a refresh compiles unchanged.
        .target(
            name: "UserNotifications",
            dependencies: ["BackgroundTasks", "BGTaskABI", "CBGTaskPluginABI"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),

        // MARK: Host internals
        .systemLibrary(name: "CFFI", pkgConfig: "libffi", providers: [.apt(["libffi-dev"])]),
        .target(name: "_BGTaskSystemShims"),
        .target(name: "BGTaskSystem", dependencies: ["_BGTaskSystemShims"]),
        .target(name: "BGTaskModel"),
        .target(name: "BGTaskWire", dependencies: ["BGTaskModel", "BGTaskSystem", "CBGTaskPluginABI"]),
        .target(
            name: "BGTaskHost",
            dependencies: [
                "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),
        .executableTarget(
            name: "bgtask-runner",
            dependencies: ["BGTaskABI", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "CBGTaskPluginABI", "CFFI", "_BGTaskSystemShims"],
            // C interop all the way down (libffi's global type descriptors, stdio): Swift 5 mode
            // keeps it readable; the runner's state is guarded by one lock regardless.
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .executableTarget(
            name: "bgtask",
            dependencies: [
                "BGTaskHost",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        .executableTarget(
            name: "bgtask-bench",
            dependencies: [
                "BGTaskHost", "BGTaskModel", "BGTaskWire", "_BGTaskSystemShims",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),

        // MARK: Example plugins
        .target(name: "Feed", dependencies: ["BackgroundTasks"], path: "Plugins/Feed", exclude: ["Info.plist"]),
        .target(name: "Counter", dependencies: ["CBGTaskPluginABI"], path: "Plugins/Counter", exclude: ["Info.plist"]),
        .target(name: "FeedShare", dependencies: ["BackgroundTasks"], path: "Plugins/FeedShare", exclude: ["Info.plist"]),

        // MARK: Test fixtures
        .target(
            name: "ApplePatterns5", dependencies: ["BackgroundTasks"], path: "Tests/Fixtures/ApplePatterns5",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "ApplePatterns6", dependencies: ["BackgroundTasks"], path: "Tests/Fixtures/ApplePatterns6",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .target(name: "Misbehaving", dependencies: ["BackgroundTasks"], path: "Tests/Fixtures/Misbehaving", exclude: ["Info.plist"]),
        .target(name: "BadABI", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/BadABI"),
        .target(name: "NoEntry", path: "Tests/Fixtures/NoEntry"),
        .target(name: "EntryFails", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/EntryFails"),
        .target(name: "CrashInConstructor", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/CrashInConstructor"),
        .target(name: "BenchPlugin", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/BenchPlugin"),
        .target(
            name: "BackgroundTime", dependencies: ["BackgroundTasks", "UIKit"], path: "Tests/Fixtures/BackgroundTime",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "Podcasts", dependencies: ["BackgroundTasks", "UIKit", "UserNotifications"], path: "Tests/Fixtures/Podcasts",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .target(
            name: "IOSApp", dependencies: ["BackgroundTasks"], path: "Tests/Fixtures/IOSApp",
            exclude: ["Info.plist", "Share-Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(name: "Hostile", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/Hostile", exclude: ["Info.plist"]),
        .target(name: "ABIGrowth", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/ABIGrowth", exclude: ["Info.plist"]),

        // MARK: Tests
        // Tests follow the modules: the system layer and the wire protocols stand alone; the
        // host's tests drive real hosts, runners and plugins.
        .testTarget(name: "BGTaskSystemTests", dependencies: ["BGTaskSystem", "_BGTaskSystemShims"]),
        .testTarget(name: "BGTaskWireTests", dependencies: ["BGTaskModel", "BGTaskWire", "CBGTaskPluginABI"]),
        .testTarget(
            name: "BGTaskHostTests",
            dependencies: ["BGTaskHost", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims"]
        ),
    ]
)

// swift-tools-version: 6.1
//
// Targets are split by who uses them:
//   - `BackgroundTasks`   the API plugin authors import (Apple's framework, the Swift face of the ABI)
//   - `os`                Apple's unified logging (`Logger`, `os_log`, `OSSignposter`) under Apple's module
//                         name, writing into the launch's log (docs/sdk.md, "Unified logging")
//   - `MetricKit`         Apple's app metrics and diagnostics (`MXMetricManager`, its payloads) under
//                         Apple's module name, from the host's days of the app's use
//   - `BGTaskLogLine`     the line format of those entries, shared by `os` (writer) and `bgtask log` (reader)
//   - `CBGTaskPluginABI`  the C header that *is* the plugin ABI (plugins written in C include it)
//   - `BGTaskABI`         the ABI's growth rules in Swift (one reader of every struct), for the SDK and the runner
//   - `BGTaskControl`     what the host speaks and its clients read: the control protocol and client,
//                         run records, bundles, scheduling rules (no store, no network)
//   - `BGTaskStore`       the host's SQLite store (GRDB), one file per aggregate
//   - `BGTaskLaunch`      launch supervision (all `bgtask run` needs): supervisor, loops, zygote client, confinement
//   - `BGTaskTransfers`   background URL sessions' transfers (AsyncHTTPClient on SwiftNIO)
//   - `BGTaskHost`        the daemon: its parts, scheduling, the control server, pushes, notifications
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

/// Swift 5 language mode, for app code written as iOS apps are.
let v5: [SwiftSetting] = [.swiftLanguageMode(.v5)]

let package = Package(
    name: "bgtask",
    products: [
        .library(name: "BackgroundTasks", targets: ["BackgroundTasks"]),
        .library(name: "UIKit", targets: ["UIKit"]),
        .library(name: "os", targets: ["os"]),
        .library(name: "UserNotifications", targets: ["UserNotifications"]),
        .library(name: "MetricKit", targets: ["MetricKit"]),
        .library(name: "BGTaskHost", targets: ["BGTaskHost"]),
        .executable(name: "bgtask", targets: ["bgtask"]),
        .executable(name: "bgtask-runner", targets: ["bgtask-runner"]),
        .executable(name: "bgtask-bench", targets: ["bgtask-bench"]),

        // Example plugins (Plugins/): each one is a shared library loaded only in a child process.
        .library(name: "Feed", type: .dynamic, targets: ["Feed"]),
        .library(name: "Counter", type: .dynamic, targets: ["Counter"]),
        .library(name: "FeedShare", type: .dynamic, targets: ["FeedShare"]),
        // One example per background API (README, "A five-minute tour"; Examples/build.sh).
        .library(name: "Export", type: .dynamic, targets: ["Export"]),
        .library(name: "Notes", type: .dynamic, targets: ["Notes"]),
        .library(name: "Mail", type: .dynamic, targets: ["Mail"]),
        .library(name: "Episodes", type: .dynamic, targets: ["Episodes"]),
        .library(name: "Weather", type: .dynamic, targets: ["Weather"]),
        .library(name: "Reader", type: .dynamic, targets: ["Reader"]),
        .library(name: "ReaderShare", type: .dynamic, targets: ["ReaderShare"]),

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
        .library(name: "PushApp", type: .dynamic, targets: ["PushApp"]),
        .library(name: "Podcasts", type: .dynamic, targets: ["Podcasts"]),
        .library(name: "Downloader", type: .dynamic, targets: ["Downloader"]),
        .library(name: "Hostile", type: .dynamic, targets: ["Hostile"]),
        .library(name: "ABIGrowth", type: .dynamic, targets: ["ABIGrowth"]),
        .library(name: "UnifiedLogging5", type: .dynamic, targets: ["UnifiedLogging5"]),
        .library(name: "UnifiedLogging6", type: .dynamic, targets: ["UnifiedLogging6"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.0.0"),
        // The APNs-compatible provider endpoint's HTTP/2 (and, for background transfers, the
        // event loops an HTTP client runs on).
        .package(url: "https://github.com/apple/swift-nio", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-nio-http2", from: "1.36.0"),
        // TLS for the APNs endpoint (with ALPN h2, as APNs speaks it to provider libraries).
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.29.0"),
        // ES256 verification of APNs provider tokens (JWT) on the endpoint (and the transfer
        // tests' SHA-256).
        .package(url: "https://github.com/apple/swift-crypto", from: "3.0.0"),
        // Background URL sessions' transfers (issue 16): an HTTP client on SwiftNIO (the event
        // loops above), streaming bodies with backpressure, HTTP/1.1 and HTTP/2, TLS through
        // swift-nio-ssl, pooled connections, redirects (docs/transfers.md, "Why AsyncHTTPClient").
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.26.0"),
        // The supervision loops' deadline heap and the launch workers' queue (already built for
        // SwiftNIO, which depends on it).
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
        // The dashboard's HTTP server (issue 32, docs/dashboard.md): routing, streamed
        // responses for server-sent events, on the SwiftNIO above. Without its default traits:
        // swift-configuration and full Foundation are not needed.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.20.0", traits: []),
        // /metrics: swift-metrics' API, Prometheus's text format from its backend.
        .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.0.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.1.0"),
    ],
    targets: [
        // MARK: The ABI and the SDK
        .target(name: "CBGTaskPluginABI"),
        // The ABI's growth rules in Swift (one struct reader), for both sides: the SDK and the runner.
        .target(name: "BGTaskABI", dependencies: ["CBGTaskPluginABI"]),
        .target(
            name: "BackgroundTasks",
            dependencies: ["BGTaskABI", "CBGTaskPluginABI", "os"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // Apple's module name for the UIKit API that background execution uses (the application
        // object, its delegate, background time): app code importing it compiles unchanged.
        // Sees every URLSession the app makes (hook.c), so a background session's events reach it.
        .target(name: "_BGTaskURLSessionHook"),
        .target(
            name: "UIKit",
            dependencies: ["BackgroundTasks", "BGTaskABI", "CBGTaskPluginABI", "BGTaskModel", "_BGTaskURLSessionHook"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // Apple's module name, so that `import os` compiles unchanged. It depends on nothing of
        // ours but the pure-Swift line format: SwiftPM shows every module to every target, and a
        // package that asks `#if canImport(os)` must be able to load it (UnfairLock.swift). The
        // SDK installs the launch's log writer into it (BackgroundTasks depends on os, not back).
        .target(name: "BGTaskLogLine", swiftSettings: [.swiftLanguageMode(.v6)]),
        .target(name: "os", dependencies: ["BGTaskLogLine"], swiftSettings: [.swiftLanguageMode(.v6)]),
        // Apple's module name for local notifications (UNUserNotificationCenter and its types):
        // app code that posts "new episodes downloaded" after a refresh compiles unchanged.
        .target(
            name: "UserNotifications",
            // BGTaskModel: the notification request's one schema (`NotificationRequest`), shared
            // with the runner, the launch channel, the store and the control socket.
            dependencies: ["BackgroundTasks", "BGTaskABI", "CBGTaskPluginABI", "BGTaskModel"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),

        // Apple's module name for app metrics and diagnostics (MXMetricManager, MXMetricPayload,
        // MXDiagnosticPayload): app code that subscribes to its daily payloads compiles unchanged
        // and receives the host's days of its use (the ABI's `metric_payloads`).
        .target(
            name: "MetricKit",
            // BGTaskModel: the days' schema (`MetricDelivery`) and Apple's JSON shape (`MetricPayloadJSON`).
            dependencies: ["BackgroundTasks", "BGTaskABI", "CBGTaskPluginABI", "BGTaskModel"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),

        // MARK: Host internals
        .systemLibrary(name: "CFFI", pkgConfig: "libffi", providers: [.apt(["libffi-dev"])]),
        .target(name: "_BGTaskSystemShims"),
        .target(name: "BGTaskSystem", dependencies: ["_BGTaskSystemShims"]),
        .target(name: "BGTaskModel"),
        .target(name: "BGTaskWire", dependencies: ["BGTaskModel", "BGTaskSystem", "CBGTaskPluginABI"]),
        // What the host speaks and what its clients read: the control protocol and its client, run
        // records, bundles, the scheduling rules. No store, no network: the test kit and the
        // CLI's client side need only this.
        .target(
            name: "BGTaskControl",
            dependencies: ["BGTaskModel", "BGTaskSystem", "_BGTaskSystemShims", "BGTaskLogLine"]
        ),
        // The host's SQLite store (GRDB): pending requests, app state, launches, pushes,
        // transfers, notifications, settings, and the disk reserve that keeps it writable.
        .target(
            name: "BGTaskStore",
            dependencies: [
                "BGTaskControl", "BGTaskModel", "BGTaskSystem", "_BGTaskSystemShims",
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),
        // Launch supervision, all `bgtask run` needs: the supervisor and its event loops, the
        // zygote client, confinement (identities, cgroups), the launch log, disk quotas,
        // suspended app processes. It knows the host only through `LaunchRequestBroker`.
        .target(
            name: "BGTaskLaunch",
            dependencies: [
                "BGTaskControl", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims", "BGTaskLogLine",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "DequeModule", package: "swift-collections"),
            ]
        ),
        // Background URL sessions' transfers, made by the host for its apps: AsyncHTTPClient on
        // SwiftNIO, staging files, bounds per app and per host (docs/transfers.md).
        .target(
            name: "BGTaskTransfers",
            dependencies: [
                "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ]
        ),
        // The dashboard and /metrics (issue 32): an HTTP server over the host's answers and
        // launch events, its pages embedded in the binary.
        .target(
            name: "BGTaskDashboard",
            dependencies: [
                "BGTaskControl", "BGTaskModel",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            resources: [.embedInCode("Pages/index.html"), .embedInCode("Pages/dashboard.js"), .embedInCode("Pages/dashboard.css")]
        ),
        .target(
            name: "BGTaskHost",
            dependencies: [
                "BGTaskDashboard", "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims", "BGTaskLogLine",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "DequeModule", package: "swift-collections"),
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
                "BGTaskHost", "BGTaskDashboard", "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskLogLine", "_BGTaskSystemShims",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        .executableTarget(
            name: "bgtask-bench",
            dependencies: [
                "BGTaskHost", "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                // The transfer section's loopback file server (sendfile).
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // The e2e section's provider pushing through the APNs endpoint.
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),

        // MARK: Example plugins
        .target(name: "Feed", dependencies: ["BackgroundTasks"], path: "Plugins/Feed", exclude: ["Info.plist"]),
        .target(name: "Counter", dependencies: ["CBGTaskPluginABI"], path: "Plugins/Counter", exclude: ["Info.plist"]),
        .target(name: "FeedShare", dependencies: ["BackgroundTasks"], path: "Plugins/FeedShare", exclude: ["Info.plist"]),
        // Continued processing; background time; background pushes; background downloads; local
        // notifications; an app group shared with an extension. App-delegate apps in Swift 5
        // mode, as most iOS app code and Apple's samples are.
        .target(name: "Export", dependencies: ["BackgroundTasks", "UIKit"], path: "Plugins/Export", exclude: ["Info.plist"], swiftSettings: v5),
        .target(name: "Notes", dependencies: ["BackgroundTasks", "UIKit"], path: "Plugins/Notes", exclude: ["Info.plist"], swiftSettings: v5),
        .target(name: "Mail", dependencies: ["BackgroundTasks", "UIKit"], path: "Plugins/Mail", exclude: ["Info.plist"], swiftSettings: v5),
        .target(name: "Episodes", dependencies: ["BackgroundTasks", "UIKit"], path: "Plugins/Episodes", exclude: ["Info.plist"], swiftSettings: v5),
        .target(name: "Weather", dependencies: ["BackgroundTasks", "UIKit", "UserNotifications"], path: "Plugins/Weather", exclude: ["Info.plist"], swiftSettings: v5),
        .target(name: "Reader", dependencies: ["BackgroundTasks", "UIKit"], path: "Plugins/Reader", exclude: ["Info.plist"], swiftSettings: v5),
        .target(name: "ReaderShare", dependencies: ["BackgroundTasks"], path: "Plugins/ReaderShare", exclude: ["Info.plist"]),

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
            name: "PushApp", dependencies: ["BackgroundTasks", "UIKit"], path: "Tests/Fixtures/PushApp",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "BackgroundTime", dependencies: ["BackgroundTasks", "UIKit"], path: "Tests/Fixtures/BackgroundTime",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "Podcasts", dependencies: ["BackgroundTasks", "UIKit", "UserNotifications"], path: "Tests/Fixtures/Podcasts",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .target(
            name: "Downloader", dependencies: ["BackgroundTasks", "UIKit"], path: "Tests/Fixtures/Downloader",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "IOSApp", dependencies: ["BackgroundTasks"], path: "Tests/Fixtures/IOSApp",
            exclude: ["Info.plist", "Share-Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(name: "Hostile", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/Hostile", exclude: ["Info.plist"]),
        .target(name: "ABIGrowth", dependencies: ["CBGTaskPluginABI"], path: "Tests/Fixtures/ABIGrowth", exclude: ["Info.plist"]),
        // App code that logs as public apps do (`import os`), in both language modes (one file).
        .target(
            name: "UnifiedLogging5", dependencies: ["BackgroundTasks", "os"], path: "Tests/Fixtures/UnifiedLogging5",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "UnifiedLogging6", dependencies: ["BackgroundTasks", "os"], path: "Tests/Fixtures/UnifiedLogging6",
            exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v6)]
        ),

        // MARK: Tests
        // Tests follow the modules: the system layer and the wire protocols stand alone; the
        // host's tests drive real hosts, runners and plugins.
        .testTarget(name: "BGTaskSystemTests", dependencies: ["BGTaskSystem", "_BGTaskSystemShims"]),
        .testTarget(name: "BGTaskWireTests", dependencies: ["BGTaskModel", "BGTaskWire", "CBGTaskPluginABI"]),
        .testTarget(name: "UnifiedLoggingTests", dependencies: ["os", "BGTaskLogLine"]),
        .testTarget(
            name: "BGTaskHostTests",
            dependencies: [
                "BGTaskHost", "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims",
                "BGTaskDashboard",
                .product(name: "Crypto", package: "swift-crypto"),
                // The transfer tests' own HTTP/1.1 server (TransferTestServer.swift).
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
    ]
)

// MARK: - The test kit and the bundle plugin (issue 17, parts 1 and 2)
//
// Appended rather than interleaved above, so this block merges apart from other changes.
//   - `BackgroundTasksTestKit`  for app developers' tests: a test scheduler behind
//                               `BGTaskScheduler.shared` (in process), and a real host (out of process)
//   - `BundlePlugin`            `swift package bgtask-bundle`: builds a dynamic library product and
//                               assembles its bundle with `bgtask bundle` (PackagePlugins/, since
//                               Plugins/ holds the example bgtask plugins)
package.products += [
    .library(name: "BackgroundTasksTestKit", targets: ["BackgroundTasksTestKit"]),
    .plugin(name: "BundlePlugin", targets: ["BundlePlugin"]),
]
package.targets += [
    .target(
        name: "BackgroundTasksTestKit",
        dependencies: ["BackgroundTasks", "BGTaskABI", "CBGTaskPluginABI", "BGTaskControl", "BGTaskModel", "BGTaskWire", "BGTaskSystem", "_BGTaskSystemShims"]
    ),
    .plugin(
        name: "BundlePlugin",
        capability: .command(
            intent: .custom(verb: "bgtask-bundle", description: "Build dynamic library products and assemble their bgtask bundles (Name.app, extensions in PlugIns/)"),
            permissions: [.writeToPackageDirectory(reason: "writes the bundles (by default into the build directory, next to the libraries)")]
        ),
        dependencies: ["bgtask"],
        path: "PackagePlugins/BundlePlugin"
    ),
    // App code with the expiration bugs real handlers have (no plugin entry: linked into tests).
    .target(name: "RacyApp", dependencies: ["BackgroundTasks"], path: "Tests/Fixtures/RacyApp", exclude: ["Info.plist"]),
    // The kit's own tests, in both language modes and both test frameworks.
    .testTarget(name: "TestKitTests", dependencies: ["BackgroundTasksTestKit", "RacyApp", "BGTaskHost", "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers"], swiftSettings: [.swiftLanguageMode(.v6)]),
    .testTarget(name: "TestKitSwift5Tests", dependencies: ["BackgroundTasksTestKit", "RacyApp"], swiftSettings: [.swiftLanguageMode(.v5)]),
    // The Feed example's tests, written with the kit as an app developer would.
    .testTarget(name: "FeedTests", dependencies: ["BackgroundTasksTestKit", "Feed"]),
    // The bundle plugin's planning (its BundlePlan.swift, linked in) and the bundle it makes, run.
    .testTarget(name: "BundlePluginTests", dependencies: ["BGTaskHost", "BGTaskControl", "BGTaskStore", "BGTaskLaunch", "BGTaskTransfers"]),
]

// MARK: - App lifecycle fixture (issue 29)
//
// Appended rather than interleaved above, so this block merges apart from other changes. An app
// written here whose background paths follow two patterns public apps use (docs/testing.md,
// "An app's lifecycle: LifecycleApp").
package.products += [
    .library(name: "LifecycleApp", type: .dynamic, targets: ["LifecycleApp"]),
]
package.targets += [
    .target(
        name: "LifecycleApp", dependencies: ["BackgroundTasks", "UIKit", "UserNotifications", "os"], path: "Tests/Fixtures/LifecycleApp",
        exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
    ),
]

// MARK: - MetricKit fixture
//
// Appended rather than interleaved above, so this block merges apart from other changes. An app
// that subscribes to MetricKit as iOS apps do and prints each payload it receives.
package.products += [
    .library(name: "MetricsApp", type: .dynamic, targets: ["MetricsApp"]),
]
package.targets += [
    .target(
        name: "MetricsApp", dependencies: ["BackgroundTasks", "UIKit", "MetricKit"], path: "Tests/Fixtures/MetricsApp",
        exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
    ),
]

// MARK: - Main-actor app delegate fixtures
//
// The same app delegate in Swift 5 mode, and in Swift 6 mode with the main actor as the
// module's default isolation (what Xcode 26 sets for new app targets).
package.products += [
    .library(name: "MainActorApp5", type: .dynamic, targets: ["MainActorApp5"]),
    .library(name: "MainActorApp6", type: .dynamic, targets: ["MainActorApp6"]),
]
package.targets += [
    .target(
        name: "MainActorApp5", dependencies: ["BackgroundTasks", "UIKit"], path: "Tests/Fixtures/MainActorApp5",
        exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v5)]
    ),
    .target(
        name: "MainActorApp6", dependencies: ["BackgroundTasks", "UIKit"], path: "Tests/Fixtures/MainActorApp6",
        exclude: ["Info.plist"], swiftSettings: [.swiftLanguageMode(.v6), .unsafeFlags(["-default-isolation", "MainActor"])]
    ),
]

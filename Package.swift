// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "Hop",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "HopStore", targets: ["HopStore"]),
        .library(name: "HopEngine", targets: ["HopEngine"]),
        .library(name: "HopTesting", targets: ["HopTesting"]),
        .library(name: "HopPostgres", targets: ["HopPostgres"]),
        .executable(name: "hopctl", targets: ["hopctl"]),
        .executable(name: "hopctl-postgres", targets: ["hopctl-postgres"]),
        .executable(name: "hop-demo", targets: ["hop-demo"]),
        .executable(name: "hop-bench", targets: ["hop-bench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
        // Only the example daemon's metrics endpoint (hop-demo) builds these: never HopStore or HopEngine.
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
        // Only HopPostgres (and what embeds it) builds these: a SQLite-only embedder never builds NIO.
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        // postgres-nio accepts swift-crypto 3 to 5; held at the release this project uses.
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
    ],
    targets: [
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .executableTarget(
            name: "hop-embed-migrations",
            path: "Sources/hop-embed-migrations"
        ),
        .plugin(
            name: "EmbedMigrations",
            capability: .buildTool(),
            dependencies: ["hop-embed-migrations"]
        ),
        .target(
            name: "HopStore",
            dependencies: [
                "CSQLite",
                .product(name: "Logging", package: "swift-log"),
            ],
            plugins: ["EmbedMigrations"]
        ),
        .target(
            name: "HopEngine",
            dependencies: [
                "HopStore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        .target(
            name: "HopPostgres",
            dependencies: [
                "HopStore",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            plugins: ["EmbedMigrations"]
        ),
        .target(
            name: "HopTesting",
            dependencies: ["HopEngine"]
        ),
        // hopctl's commands; the hopctl executable links SQLite only (it starts in milliseconds)
        // and hands command lines naming a PostgreSQL database to hopctl-postgres.
        .target(
            name: "HopctlCommands",
            dependencies: [
                "HopStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "hopctl",
            dependencies: ["HopctlCommands"],
            // The Swift runtime and FoundationEssentials linked in (release builds on Linux): a
            // command starts without loading and relocating them, 3 of its 10 ms. The static
            // FoundationEssentials needs its two helper libraries named (a module compiled
            // against the shared one does not).
            linkerSettings: [
                .unsafeFlags(
                    ["-static-stdlib", "-Xlinker", "-l_FoundationCollections", "-Xlinker", "-l_FoundationCShims"],
                    .when(platforms: [.linux], configuration: .release))
            ]
        ),
        .executableTarget(
            name: "hopctl-postgres",
            dependencies: ["HopctlCommands", "HopPostgres"]
        ),
        .executableTarget(
            name: "hop-demo",
            dependencies: [
                "HopEngine", "HopPostgres",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
            ],
            path: "Examples/StartupDaemon",
            exclude: ["hop-demo.service"]
        ),
        .executableTarget(
            name: "hop-bench",
            dependencies: [
                "HopEngine", "HopStore", "HopPostgres", "HopStoreTestSupport", "CSQLite", "hopctl", "hopctl-postgres",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Benchmarks/HopBench"
        ),
        .executableTarget(
            name: "hop-minimal-daemon",
            dependencies: [
                "HopEngine",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Examples/MinimalDaemon"
        ),
        .executableTarget(
            name: "hop-test-daemon",
            dependencies: ["HopEngine", "HopPostgres"],
            path: "Tests/HopTestDaemon"
        ),
        .executableTarget(
            name: "hop-test-proxy",
            path: "Tests/HopTestProxy"
        ),
        .executableTarget(
            name: "hop-test-store",
            dependencies: ["HopStore", "CSQLite"],
            path: "Tests/HopTestStore"
        ),
        .target(
            name: "CHopFaultVFS",
            dependencies: ["CSQLite"],
            path: "Tests/CHopFaultVFS"
        ),
        .executableTarget(
            name: "hop-test-faults",
            dependencies: [
                "HopEngine", "CHopFaultVFS", "HopTestSupport", .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/HopTestFaults"
        ),
        .executableTarget(
            name: "hop-test-blocking",
            dependencies: ["HopEngine", "HopTestSupport", .product(name: "Logging", package: "swift-log")],
            path: "Tests/HopTestBlocking"
        ),
        .target(
            name: "HopStoreTestSupport",
            dependencies: [
                "CSQLite",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ],
            path: "Tests/HopStoreTestSupport"
        ),
        .target(
            name: "HopTestSupport",
            dependencies: ["HopEngine", "HopPostgres", "HopStoreTestSupport"],
            path: "Tests/HopTestSupport"
        ),
        .testTarget(
            name: "HopStoreTests",
            dependencies: ["HopStore", "CSQLite", "HopStoreTestSupport", "hop-test-store"]
        ),
        .testTarget(
            name: "HopEngineTests",
            dependencies: [
                "HopEngine", "HopTesting", "HopTestSupport", "HopPostgres", "hop-test-daemon", "hopctl",
                "hopctl-postgres", "hop-demo", "hop-test-blocking", "hop-test-proxy",
                // Only to make the pool's errors that HopPostgres recognizes (PostgresErrorTests).
                .product(name: "_ConnectionPoolModule", package: "postgres-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryLogging", package: "swift-log"),
                .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(
            name: "hopctlTests",
            dependencies: [
                "HopEngine", "HopTestSupport", "HopctlCommands", "hopctl", "hopctl-postgres", "hop-test-daemon",
                "hop-test-store",
            ]
        ),
        .testTarget(
            name: "HopReliabilityTests",
            dependencies: [
                "HopEngine", "HopStore", "CSQLite", "CHopFaultVFS", "HopTestSupport", "hop-test-faults", "hopctl",
                "hopctl-postgres",
                "hop-test-store", "hop-test-daemon",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "HopDemoTests",
            dependencies: [
                "HopStore", "HopTestSupport", "hop-demo", "hop-minimal-daemon", "hopctl", "hopctl-postgres",
                "hop-test-store",
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// swift-tools-version:6.1
// Fuzz targets for Hop, built only by script/fuzz (with -sanitize=fuzzer): not part of the
// main package's build or tests.
import PackageDescription

let package = Package(
    name: "HopFuzz",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "Hop", path: "..")],
    targets: [
        .systemLibrary(name: "CSQLiteFuzz", path: "Sources/CSQLiteFuzz"),
        .executableTarget(
            name: "hop-fuzz-history",
            dependencies: [
                "CSQLiteFuzz",
                .product(name: "HopEngine", package: "Hop"),
                .product(name: "HopStore", package: "Hop"),
            ],
            path: "Sources/hop-fuzz-history",
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]
        ),
    ],
    swiftLanguageModes: [.v6]
)

import Foundation

/// A process whose wall clock is off: a small library, preloaded (`LD_PRELOAD`), that adds
/// `HOP_TEST_CLOCK_OFFSET` seconds to what `clock_gettime` says of the real-time clocks, and to
/// `gettimeofday` and `time`. Nothing else: the monotonic clocks, and the timers and waits set on
/// them, are left alone, as on a machine whose clock is merely set wrong. With
/// `HOP_TEST_CLOCK_OFFSET_FILE` instead, the offset is read from that file at every call, so a
/// test can step the clock of running processes (``Stepper``), as NTP steps a machine's.
///
/// libfaketime was used before; it also moves the deadlines of `timerfd` timers by its offset,
/// monotonic ones included, so a Swift process whose clock it put behind never woke from a
/// `Task.sleep`, and one it put ahead never slept.
///
/// The library is compiled into the test's folder with the C compiler on `PATH` (the Swift
/// toolchain's `clang`).
public enum ClockSkew {
    /// The environment of a process whose wall clock is `seconds` off this machine's (behind
    /// when negative), with the library compiled into `folder`.
    public static func environment(offBy seconds: Int, in folder: TemporaryDirectory) async throws -> [String: String] {
        ["LD_PRELOAD": try await library(in: folder), "HOP_TEST_CLOCK_OFFSET": "\(seconds)"]
    }

    /// A wall clock that a test steps for every process started with its ``environment``.
    public struct Stepper: Sendable {
        /// The file the processes read their offset from.
        public let file: String

        /// A clock on time until ``step(to:)``, its file in `folder`.
        public init(in folder: TemporaryDirectory) throws {
            file = folder.path("clock-offset")
            try Self.text(0).write(toFile: file, atomically: false, encoding: .utf8)
        }

        /// The environment of a process whose wall clock follows this one.
        public func environment(in folder: TemporaryDirectory) async throws -> [String: String] {
            ["LD_PRELOAD": try await library(in: folder), "HOP_TEST_CLOCK_OFFSET_FILE": file]
        }

        /// Sets every such process's clock `seconds` off this machine's, at once: the file is
        /// rewritten in place (same width), never replaced, so an open descriptor reads the new offset.
        public func step(to seconds: Int) throws {
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: file))
            defer { try? handle.close() }
            try handle.write(contentsOf: Data(Self.text(seconds).utf8))
        }

        private static func text(_ seconds: Int) -> String {
            let digits = String(abs(seconds))
            return (seconds < 0 ? "-" : "+") + String(repeating: "0", count: max(0, 19 - digits.count)) + digits + "\n"
        }
    }

    private static let source = #"""
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <fcntl.h>
        #include <stdlib.h>
        #include <sys/syscall.h>
        #include <sys/time.h>
        #include <time.h>
        #include <unistd.h>

        static long fixed_offset;
        static int offset_file = -1;
        static int started;
        static int (*real_clock_gettime)(clockid_t, struct timespec *);
        static int (*real_gettimeofday)(struct timeval *, void *);

        // Also called by the first call, should it come before the constructors run (a
        // sanitizer's runtime reads the clock as it starts, while the process has one thread,
        // and before its own `open` and `pread` work: so the file is read by system calls).
        __attribute__((constructor)) static void start(void) {
            if (started) return;
            started = 1;
            const char *text = getenv("HOP_TEST_CLOCK_OFFSET");
            fixed_offset = text ? strtol(text, NULL, 10) : 0;
            const char *file = getenv("HOP_TEST_CLOCK_OFFSET_FILE");
            if (file) offset_file = (int)syscall(SYS_openat, AT_FDCWD, file, O_RDONLY | O_CLOEXEC);
            real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
            real_gettimeofday = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
        }

        static long offset(void) {
            if (offset_file < 0) return fixed_offset;
            char text[32];
            long count = syscall(SYS_pread64, offset_file, text, sizeof text - 1, 0L);
            if (count <= 0) return 0;
            text[count] = 0;
            return strtol(text, NULL, 10);
        }

        int clock_gettime(clockid_t clock, struct timespec *now) {
            start();
            int result = real_clock_gettime(clock, now);
            if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) now->tv_sec += offset();
            return result;
        }

        int gettimeofday(struct timeval *now, void *zone) {
            start();
            int result = real_gettimeofday(now, zone);
            if (result == 0) now->tv_sec += offset();
            return result;
        }

        time_t time(time_t *now) {
            struct timespec value;
            clock_gettime(CLOCK_REALTIME, &value);
            if (now) *now = value.tv_sec;
            return value.tv_sec;
        }
        """#

    /// Compiles the library into `folder` (once per folder); returns its path.
    private static func library(in folder: TemporaryDirectory) async throws -> String {
        let library = folder.path("clock_skew.so")
        if FileManager.default.fileExists(atPath: library) { return library }
        let paths = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":")
        let compiler = ["clang", "cc"].lazy.flatMap { name in paths.map { "\($0)/\(name)" } }
            .first { FileManager.default.isExecutableFile(atPath: $0) }
        guard let compiler else {
            throw TestFailure("no C compiler (clang or cc) on PATH to build the clock-skew library")
        }
        let code = folder.path("clock_skew.c")
        try source.write(toFile: code, atomically: true, encoding: .utf8)
        let result = try await run(compiler, ["-shared", "-fPIC", "-O2", "-o", library, code, "-ldl"], in: folder)
        guard result.status == 0 else { throw TestFailure("cannot compile the clock-skew library: \(result.stderr)") }
        return library
    }
}

import CSQLite
import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

@Suite struct LeaseTests {
    @Test func aBulkClaimTakesFreeAndExpiredRunsButLeavesLiveLeasesAlone() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        var ids: [Int64] = []
        for subject in ["free", "expired", "held", "mine", "done"] {
            ids.append(try await store.startRun(flow: "startup", subject: subject, version: "1").run.id)
        }
        let now = Date()
        #expect(try await store.claim(runID: ids[1], owner: "dead", until: now.addingTimeInterval(-1)) != nil)
        #expect(try await store.claim(runID: ids[2], owner: "other", until: now.addingTimeInterval(60)) != nil)
        #expect(try await store.claim(runID: ids[3], owner: "me", until: now.addingTimeInterval(1)) != nil)
        try await store.completeRun(runID: ids[4])

        let claimed = try await store.claim(runIDs: ids, owner: "me", until: now.addingTimeInterval(30))
        #expect(Set(claimed.map(\.id)) == [ids[0], ids[1], ids[3]])
        #expect(claimed.allSatisfy { $0.owner == "me" })
        #expect(try await store.run(id: ids[2])?.owner == "other", "a live lease of another engine is left alone")
        #expect(try await store.claim(runIDs: [], owner: "me", until: now).isEmpty)
    }

    /// A lease is measured by the machine's uptime clock in the boot that wrote it (schema 9), so a
    /// step of the wall clock moves no lease (`ClockStepProcessTests`); one of another boot is
    /// over, and one written by an older binary (no boot) still goes by the wall clock.
    @Test func aLeaseGoesByTheUptimeOfItsBootAndAnOlderBinarysByTheWallClock() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        var ids: [String: Int64] = [:]
        let subjects = ["old-live", "old-over", "other-boot", "live", "over"]
        let end = Date().addingTimeInterval(60)
        for subject in subjects {
            let id = try await store.startRun(flow: "startup", subject: subject, version: "1").run.id
            ids[subject] = id
            #expect(try await store.claim(runID: id, owner: "them", until: end) != nil)
        }
        let written = try #require(try await store.run(id: ids["live"] ?? 0))
        // Shown by the wall clock as it was written, to the conversion's few milliseconds; the
        // length counts from the write, so a write that waited (a loaded machine) ends later.
        let shown = try #require(written.leaseExpiresAt).timeIntervalSince(end)
        #expect(shown >= -0.01 && shown < 10 && written.leaseIsLive(), "shown to end \(shown) s after the lease's end")

        let wall = Clock.nowMilliseconds()
        let uptime = UptimeClock.uptimeMilliseconds()
        let boot = try #require(UptimeClock.machine.boot, "this machine names its boots")
        let rewrite = """
            UPDATE runs SET lease_boot = NULL, lease_expires_at = \(wall + 60_000) WHERE subject = 'old-live';
            UPDATE runs SET lease_boot = NULL, lease_expires_at = \(wall - 1000) WHERE subject = 'old-over';
            UPDATE runs SET lease_boot = \(boot &+ 1), lease_expires_at = \(uptime + 60_000) WHERE subject = 'other-boot';
            UPDATE runs SET lease_boot = \(boot), lease_expires_at = \(uptime - 1000) WHERE subject = 'over';
            """
        #expect(Self.execute(rewrite, on: folder.database))

        let claimable = try await store.claimableRuns(versions: ["startup": ["1"]], now: Date(), limit: 10)
        #expect(Set(claimable.map(\.subject)) == ["old-over", "other-boot", "over"])
        for subject in subjects {
            let run = try #require(try await store.run(id: ids[subject] ?? 0))
            #expect(run.leaseIsLive() == ["old-live", "live"].contains(subject), "\(subject)")
        }
        let claimed = try await store.claim(runIDs: subjects.compactMap { ids[$0] }, owner: "me", until: Date())
        #expect(Set(claimed.map(\.subject)) == ["old-over", "other-boot", "over"])
    }

    /// A parked step's deadline is due by the uptime clock in the boot it was set in (schema 10),
    /// whatever the wall clock says; one of an earlier boot, or an older binary's (no boot), goes
    /// by the wall clock.
    @Test func aParkedStepIsDueByTheUptimeOfItsBootAndOtherwiseByTheWallClock() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        var ids: [String: Int64] = [:]
        let subjects = ["this-boot-due", "this-boot-later", "earlier-boot", "no-boot", "no-boot-later"]
        let deadline = Date().addingTimeInterval(60)
        for subject in subjects {
            let id = try await store.startRun(flow: "startup", subject: subject, version: "1").run.id
            ids[subject] = id
            let hop = RunWrite.hop(step: "login", from: nil, parks: true, wakeOn: nil, deadline: deadline)
            _ = try await store.record([hop], runID: id, owner: nil, durability: .now)
        }
        let shown = try #require(try await store.run(id: ids["this-boot-later"] ?? 0)?.wakeAt)
        #expect(abs(shown.timeIntervalSince(deadline)) <= 0.01, "shown due \(shown.timeIntervalSince(deadline)) s late")
        #expect(try await store.dueTimeouts(now: Date()).isEmpty)

        let wall = Clock.nowMilliseconds()
        let uptime = UptimeClock.uptimeMilliseconds()
        let boot = try #require(UptimeClock.machine.boot, "this machine names its boots")
        // As if the wall clock had been stepped an hour forward: every wall-clock deadline is past.
        let rewrite = """
            UPDATE runs SET wake_at = \(wall - 1000);
            UPDATE runs SET wake_uptime = \(uptime - 1000) WHERE subject = 'this-boot-due';
            UPDATE runs SET wake_boot = \(boot &+ 1), wake_uptime = \(uptime + 60_000) WHERE subject = 'earlier-boot';
            UPDATE runs SET wake_boot = NULL, wake_uptime = NULL WHERE subject = 'no-boot';
            UPDATE runs SET wake_boot = NULL, wake_uptime = NULL, wake_at = \(wall + 60_000) WHERE subject = 'no-boot-later';
            """
        #expect(Self.execute(rewrite, on: folder.database))

        let due = try await store.dueTimeouts(now: Date())
        #expect(Set(due.map(\.subject)) == ["this-boot-due", "earlier-boot", "no-boot"])
        // The earlier boot's deadline now goes by the wall clock alone.
        let earlier = try #require(try await store.run(id: ids["earlier-boot"] ?? 0))
        #expect(earlier.wakeAt.map(Clock.milliseconds) == wall - 1000)
    }

    /// The deadline a timer or a hop with a timeout records reads back by the uptime clock in
    /// the boot it was set in (schema 11): after a step of the wall clock, as the same time from
    /// now. One of an earlier boot, or an older binary's (no boot), reads back as written. A
    /// forked run's copy keeps it by the uptime clock too.
    @Test func aRecordedDeadlineReadsBackByTheUptimeOfItsBootAndOtherwiseAsWritten() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let deadline = Date().addingTimeInterval(60)
        var ids: [String: Int64] = [:]
        let subjects = ["timer", "hop", "earlier-boot", "no-boot"]
        for subject in subjects {
            let id = try await store.startRun(flow: "startup", subject: subject, version: "1").run.id
            ids[subject] = id
            let write =
                subject == "hop"
                ? RunWrite.hop(step: "work", from: nil, parks: false, wakeOn: nil, deadline: deadline)
                : RunWrite.timer(name: "nap", deadline: deadline)
            _ = try await store.record([write], runID: id, owner: nil, durability: .now)
        }
        func recorded(_ subject: String) async throws -> Date? {
            try await store.history(runID: ids[subject] ?? 0).last?.deadline
        }
        for subject in subjects {
            let read = try #require(try await recorded(subject), "\(subject)")
            #expect(
                abs(read.timeIntervalSince(deadline)) <= 0.01,
                "\(subject): read \(read.timeIntervalSince(deadline)) s off")
        }

        // As if the wall clock had been stepped an hour forward: every value is an hour behind it.
        let boot = try #require(UptimeClock.machine.boot, "this machine names its boots")
        let behind = Clock.milliseconds(deadline) - 3_600_000
        let rewrite = """
            UPDATE history SET value = CASE kind WHEN 'hop' THEN '{"deadline":\(behind)}' ELSE '\(behind)' END;
            UPDATE history SET deadline_boot = \(boot &+ 1) WHERE run_id = \(ids["earlier-boot"] ?? 0);
            UPDATE history SET deadline_boot = NULL, deadline_uptime = NULL WHERE run_id = \(ids["no-boot"] ?? 0);
            """
        #expect(Self.execute(rewrite, on: folder.database))
        for subject in subjects {
            let read = try #require(try await recorded(subject), "\(subject)")
            let expected = ["timer", "hop"].contains(subject) ? deadline : Clock.date(behind)
            #expect(
                abs(read.timeIntervalSince(expected)) <= 0.01,
                "\(subject): read \(read.timeIntervalSince(expected)) s off")
        }

        let forked = try await store.forkRun(flow: "startup", subject: "timer", through: 1).new
        ids["forked"] = forked.id
        #expect(try await store.history(runID: forked.id).map(\.kind) == [.fork, .timer])
        #expect(Self.execute("UPDATE history SET value = '\(behind)' WHERE run_id = \(forked.id)", on: folder.database))
        let copied = try #require(try await recorded("forked"))
        #expect(
            abs(copied.timeIntervalSince(deadline)) <= 0.01,
            "the fork's copy read \(copied.timeIntervalSince(deadline)) s off")
    }

    /// A time stored by the uptime clock reads back as the same wall-clock time every time: a
    /// run read twice is equal. (Converting by two clock readings each time gave a millisecond
    /// more now and then, when the readings straddled one.)
    @Test func aTimeByTheUptimeClockReadsBackTheSameEveryTime() throws {
        let clock = UptimeClock.machine
        let boot = try #require(clock.boot, "this machine names its boots")
        let stored = UptimeClock.uptimeMilliseconds() + 60_000
        let first = clock.wallClockDeadline(wall: 0, uptime: stored, boot: boot)
        var different = 0
        for _ in 0..<200_000 where clock.wallClockDeadline(wall: 0, uptime: stored, boot: boot) != first {
            different += 1
        }
        #expect(different == 0, "\(different) of 200,000 reads differ from the first")
        #expect(clock.wallClockEnd(expiresAt: stored, boot: boot) == first)
    }

    /// Runs `sql` on the database file at `path` behind the store's back (as another binary
    /// would write it); whether it succeeded.
    static func execute(_ sql: String, on path: String) -> Bool {
        var db: OpaquePointer?
        defer { sqlite3_close(db) }
        return sqlite3_open(path, &db) == SQLITE_OK && sqlite3_busy_timeout(db, 5_000) == SQLITE_OK
            && sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK
    }

    @Test func historiesOfManyRunsAreReadInOrderPerRun() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let a = try await store.startRun(flow: "startup", subject: "a", version: "1").run.id
        let b = try await store.startRun(flow: "startup", subject: "b", version: "1").run.id
        let c = try await store.startRun(flow: "startup", subject: "c", version: "1").run.id
        let hop = try await store.recordHop(runID: a, step: "splash")
        try await store.recordHop(runID: b, step: "splash")
        try await store.recordUnhop(runID: a, token: try #require(hop.token))
        try await store.recordHop(runID: a, step: "main")

        let histories = try await store.histories(runIDs: [a, b, c])
        #expect(histories[a]?.map(\.seq) == [1, 2, 3])
        #expect(histories[a]?.map(\.kind) == [.hop, .unhop, .hop])
        #expect(histories[b]?.map(\.step) == ["splash"])
        #expect(histories[c] == nil)
        #expect(histories[a] == (try await store.history(runID: a)))
    }

    @Test func twoIncarnationsWithOneLabelAreTwoOwnersAndADeadOnesRunsAreReleasedAtOnce() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let first = try await store.startRun(flow: "startup", subject: "a", version: "1").run.id
        let second = try await store.startRun(flow: "startup", subject: "b", version: "1").run.id
        var old: Incarnation? = store.makeIncarnation(label: "kiosk")
        let new = store.makeIncarnation(label: "kiosk")
        let oldID = try #require(old?.id)
        #expect(oldID != new.id && Incarnation.label(of: oldID) == "kiosk" && new.canProveLiveness)

        let until = Date().addingTimeInterval(60)
        #expect(try await store.claim(runIDs: [first, second], owner: oldID, until: until).count == 2)
        #expect(
            try await store.claim(runID: first, owner: new.id, until: until) == nil,
            "the same label is no claim to a live lease")
        #expect(try await store.releaseRunsOfDeadIncarnations(except: new).isEmpty, "a live incarnation is not dead")
        #expect(
            try await store.renewLeases(owner: oldID, runIDs: [first], until: until) == [first],
            "only the runs named are renewed")
        #expect(try await store.renewLeases(owner: new.id, runIDs: [first, second], until: until).isEmpty)

        old = nil  // its lock goes, as when its process dies
        // A child process that another test spawns at this moment holds a copy of the lock's
        // descriptor until it execs (CLOEXEC closes it then): look again until the lock is free,
        // as an engine's watch does on every poll.
        var released = try await store.releaseRunsOfDeadIncarnations(except: new)
        let deadline = ContinuousClock.now.advanced(by: .seconds(10))
        while released.isEmpty, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
            released = try await store.releaseRunsOfDeadIncarnations(except: new)
        }
        #expect(released.map(\.owner) == [oldID] && released.map(\.runs) == [2])
        #expect(try await store.releaseRunsOfDeadIncarnations(except: new).isEmpty, "its lock file is gone with it")
        let taken = try #require(try await store.claim(runID: first, owner: new.id, until: until))
        #expect(taken.owner == new.id && taken.ownerLabel == "kiosk")
        let takeover = try #require(try await store.history(runID: first).last)
        #expect(takeover.kind == .takeover && takeover.step == "kiosk")
        #expect(takeover.value == #"{"from":"\#(oldID)","to":"\#(new.id)"}"#)
        // The old owner's writes are refused from now on: they are fenced by owner.
        await #expect(throws: HopError.self) {
            try await store.recordDecision(runID: first, name: "late", value: "1", owner: oldID)
        }
        #expect(try await store.history(runID: first).count == 1)
    }

    /// A run whose lease expired is not taken from an owner whose heartbeat says it waits for
    /// the file's write lock: it is alive, and could not renew only because another process held
    /// the lock. Once the heartbeat is stale (a frozen or stuck owner), or of another boot, the
    /// run is taken as before, with one takeover entry.
    @Test func anExpiredLeaseIsNotTakenFromAnOwnerThatWaitsForTheWriteLock() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let run = try await store.startRun(flow: "startup", subject: "a", version: "1").run.id
        let owner = store.makeIncarnation(label: "owner")
        let other = store.makeIncarnation(label: "other")
        let locks = LivenessLocks(databasePath: folder.database)
        #expect(try await store.claim(runID: run, owner: owner.id, until: Date().addingTimeInterval(-1)) != nil)
        let until = Date().addingTimeInterval(60)

        owner.beat(for: .seconds(60))
        #expect(locks.waits(owner.id) && !locks.waits(other.id))
        #expect(try await store.claimableRuns(versions: ["startup": ["1"]]).isEmpty)
        #expect(try await store.claim(runID: run, owner: other.id, until: until) == nil)
        #expect(try await store.claim(runIDs: [run], owner: other.id, until: until).isEmpty)
        #expect(try await store.run(id: run)?.owner == owner.id)

        let boot = try #require(UptimeClock.machine.boot)
        let beat = try #require(locks.beat(of: owner.id))
        // Written in another boot: it holds nothing in this one.
        try Self.overwrite(beat: LivenessLocks.Beat(boot: boot &+ 1, until: beat.until), of: owner.id, in: folder)
        #expect(!locks.waits(owner.id))
        // Stale: the owner stopped waiting (frozen, or gone) a moment ago.
        try Self.overwrite(
            beat: LivenessLocks.Beat(boot: boot, until: UptimeClock.uptimeMilliseconds() - 1), of: owner.id,
            in: folder)
        #expect(!locks.waits(owner.id))
        #expect(try await store.claimableRuns(versions: ["startup": ["1"]]).map(\.id) == [run])
        #expect(try await store.claim(runID: run, owner: other.id, until: until)?.owner == other.id)
        #expect(try await store.history(runID: run).filter { $0.kind == .takeover }.count == 1)
    }

    /// A store's write that waits for another process's lock keeps the heartbeat of each
    /// incarnation made over the store fresh, for as long as it waits; a dead incarnation's
    /// heartbeat goes with its lock file, and one left without a lock file is removed.
    @Test func aWriteThatWaitsForTheLockKeepsItsIncarnationsHeartbeatsFresh() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let run = try await store.startRun(flow: "startup", subject: "a", version: "1").run.id
        var owner: Incarnation? = store.makeIncarnation(label: "owner")
        let id = try #require(owner?.id)
        let locks = LivenessLocks(databasePath: folder.database)
        #expect(!locks.waits(id), "no write has waited yet")

        try await holdingTheWriteLock(of: folder.database) {
            let renewal = Task { try await store.renewLeases(owner: id, runIDs: [run], until: Date()) }
            // Held for more than a heartbeat lasts: the waiting write writes it again meanwhile.
            try await waitUntil("the waiting write's heartbeat is fresh") { locks.waits(id) }
            let first = try #require(locks.beat(of: id)).until
            try await waitUntil("the heartbeat is written again while the write waits") {
                (locks.beat(of: id)?.until ?? 0) > first
            }
            renewal.cancel()
        }

        let beatFile = folder.database + "-engines/" + id.suffix(16) + ".beat"
        #expect(FileManager.default.fileExists(atPath: beatFile))
        owner = nil
        let other = store.makeIncarnation(label: "other")
        try await waitUntil("the dead incarnation is found") {
            try await !store.releaseRunsOfDeadIncarnations(except: other).isEmpty
        }
        #expect(!FileManager.default.fileExists(atPath: beatFile), "its heartbeat went with its lock file")

        // A heartbeat left by a release that removed only the lock file goes at the next look.
        #expect(FileManager.default.createFile(atPath: beatFile, contents: Data()))
        _ = try await store.releaseRunsOfDeadIncarnations(except: other)
        #expect(!FileManager.default.fileExists(atPath: beatFile))
        #expect(FileManager.default.fileExists(atPath: folder.database + "-engines/" + other.id.suffix(16) + ".beat"))
    }

    /// A lease taken or renewed by a write that waited for the write lock (another process held
    /// it: an operator's `sqlite3` session, a `VACUUM`) lasts as long as asked from when the
    /// write runs, as a server's does. Before, it ended when asked, counted from the call: a
    /// write that waited longer than the lease stored one already over, and only the owner's
    /// heartbeat, for the 2 s it lasts, and its next renewal kept the run from being taken.
    ///
    /// A first claim waits for the lock (its heartbeat says so); the other writes are asked for
    /// while it waits, and so while the store's connection is busy with it. Each asks for 10 s
    /// while the lock is held for 4 s more: once written, each lease must end at least 12 s after
    /// the writes were asked for (2 s for the tasks to start); before, 10 s.
    @Test func aLeaseWrittenAfterAWaitForTheWriteLockLastsAsLongAsAskedFromTheWrite() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database, options: HopStore.Options(busyTimeout: .seconds(60)))
        let owner = store.makeIncarnation(label: "me")
        var ids: [String: Int64] = [:]
        for subject in ["first", "claimed", "batch", "renewed"] {
            ids[subject] = try await store.startRun(flow: "startup", subject: subject, version: "1").run.id
        }
        let first = try #require(ids["first"])
        let claimed = try #require(ids["claimed"])
        let batch = try #require(ids["batch"])
        let renewed = try #require(ids["renewed"])
        #expect(try await store.claim(runID: renewed, owner: owner.id, until: Date().addingTimeInterval(60)) != nil)

        let asked = Date()
        let until = asked.addingTimeInterval(10)
        let writes = try await holdingTheWriteLock(of: folder.database) {
            let waiting = Task { _ = try await store.claim(runID: first, owner: owner.id, until: until) }
            try await waitUntil("the first claim waits for the lock") {
                LivenessLocks(databasePath: folder.database).waits(owner.id)
            }
            let writes: [Task<Void, any Error>] = [
                waiting,
                Task { _ = try await store.claim(runID: claimed, owner: owner.id, until: until) },
                Task { _ = try await store.claim(runIDs: [batch], owner: owner.id, until: until) },
                Task { _ = try await store.renewLeases(owner: owner.id, runIDs: [renewed], until: until) },
                Task {
                    _ = try await store.startRun(
                        flow: "startup", subject: "started", version: "1", owner: owner.id, until: until)
                },
            ]
            // How long the lock is held, not a wait for an outcome.
            try await Task.sleep(for: .seconds(4))
            return writes
        }
        for write in writes { try await write.value }
        let started = try #require(try await store.latestRun(flow: "startup", subject: "started"))
        let written = [
            ("first claim", first), ("claim", claimed), ("bulk claim", batch), ("renewal", renewed),
            ("start", started.id),
        ]
        for (name, id) in written {
            let run = try #require(try await store.run(id: id))
            #expect(run.owner == owner.id, "\(name)")
            let end = try #require(run.leaseExpiresAt, "\(name)")
            #expect(
                end.timeIntervalSince(asked) >= 12,
                "\(name): the lease ends \(end.timeIntervalSince(asked)) s after it was asked for")
        }
    }

    /// Writes `beat` as the heartbeat of the incarnation `owner` of the database in `folder`.
    static func overwrite(beat: LivenessLocks.Beat, of owner: String, in folder: TemporaryDirectory) throws {
        let descriptor = open(folder.database + "-engines/" + owner.suffix(16) + ".beat", O_RDWR)
        guard descriptor >= 0 else { throw TestFailure("no heartbeat file for \(owner)") }
        defer { close(descriptor) }
        LivenessLocks.store(beat, in: descriptor)
    }
}

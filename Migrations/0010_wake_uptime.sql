-- Hop schema, version 10: parked steps' deadlines measured by the machine's uptime clock too.
--
-- A parked step with a timeout was due when the wall clock passed `wake_at`: a step of the clock
-- forward (NTP setting the clock of a device that booted with a stale one) timed every such step
-- out at once, and a step back delayed them as much. Now the deadline is also kept as a time by
-- CLOCK_BOOTTIME (`wake_uptime`, milliseconds since boot) in the boot `wake_boot` (as for leases,
-- schema 9), and a step is due by that clock in that boot. `wake_at` stays the deadline by the
-- wall clock, for display and for a deadline of another boot (or an older binary's, or where the
-- boot is unknown: `wake_boot` is null then).
ALTER TABLE runs ADD COLUMN wake_boot INTEGER;
ALTER TABLE runs ADD COLUMN wake_uptime INTEGER;

-- The due steps of this boot, by uptime.
CREATE INDEX runs_by_wake_uptime ON runs (wake_boot, wake_uptime) WHERE wake_boot IS NOT NULL;

-- The due steps of no boot, by the wall clock: the steps of this boot are not in it, so that
-- after a step forward a look for due steps does not read every one of them each time.
DROP INDEX runs_by_wake_at;
CREATE INDEX runs_by_wake_at ON runs (wake_at) WHERE wake_at IS NOT NULL AND wake_boot IS NULL;

-- Hop schema, version 11: the deadlines that history entries record measured by the machine's
-- uptime clock too.
--
-- A durable sleep's timer entry and a hop with a timeout record their deadline in their value,
-- by the wall clock. A running engine waits for it by the monotonic clock, but a daemon that
-- restarted read it back by the wall clock: after a step of the clock (NTP setting the clock of a
-- device that booted with a stale one, an operator's `date -s`), a resumed sleep or step in
-- process ended at once, or as much later. Now the entry also keeps the deadline by CLOCK_BOOTTIME
-- (`deadline_uptime`, milliseconds since boot) in the boot `deadline_boot` (as for leases, schema
-- 9, and parked steps, schema 10), and the entry is read back in that boot with its value
-- converted to the wall clock as it now stands. The value stays the deadline by the wall clock
-- for a deadline of another boot, or an older binary's (both columns are null then).
ALTER TABLE history ADD COLUMN deadline_boot INTEGER;
ALTER TABLE history ADD COLUMN deadline_uptime INTEGER;

-- Hop schema on PostgreSQL, version 4 (PostgreSQL's own: a file has no server): when an engine
-- first found each start of the server answering. For 15 s from then, no engine is taken for
-- dead for want of its liveness lock and no lease is taken as run out, so that every engine has
-- the time to take its lock again and renew its leases. Counted from the server's own start
-- before, which a failover does not reset: a standby promoted to primary started long before.
CREATE TABLE server_starts (
    started_at timestamptz PRIMARY KEY,  -- pg_postmaster_start_time() of the server
    first_seen_at timestamptz NOT NULL   -- when an engine first found it answering as the primary
);
-- The server this schema is upgraded on has been the one engines reach since it started.
INSERT INTO server_starts (started_at, first_seen_at) VALUES (pg_postmaster_start_time(), pg_postmaster_start_time());

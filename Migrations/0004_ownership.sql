-- Hop schema, version 4: run ownership by liveness; sessions that expire.
--
-- runs.owner now holds an engine *incarnation* ("label#random", unique per engine started), not
-- a configured name; last_owner keeps the incarnation that executed the run last, so that a
-- change of hands can be recorded in history when another incarnation claims the run.
ALTER TABLE runs ADD COLUMN last_owner TEXT;
UPDATE runs SET last_owner = owner;

-- Sessions by expiry: an engine ends the expired ones (as a logout) without scanning the table.
CREATE INDEX sessions_by_expiry ON sessions (expires_at) WHERE expires_at IS NOT NULL;

-- History gains the kind 'takeover': another incarnation claimed the run (step: its label;
-- value: {"from": previous incarnation, "to": new incarnation}). SQLite cannot change a CHECK
-- constraint, so the table is rebuilt.
CREATE TABLE history_v4 (
    run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    kind    TEXT    NOT NULL
        CHECK (kind IN ('hop', 'unhop', 'decision', 'effect', 'transition', 'error',
                        'cancel', 'restart', 'complete', 'fail', 'diverge', 'reroute',
                        'timer', 'timeout', 'takeover')),
    step    TEXT,
    token   TEXT,
    value   TEXT,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

INSERT INTO history_v4 (run_id, seq, kind, step, token, value, at)
    SELECT run_id, seq, kind, step, token, value, at FROM history;
DROP TABLE history;
ALTER TABLE history_v4 RENAME TO history;

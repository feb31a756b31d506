-- Hop schema, version 3: durable timers, step timeouts, re-routes and engine leases.

-- A parked run whose step has a timeout: when the engine must end the step.
ALTER TABLE runs ADD COLUMN wake_at INTEGER;
CREATE INDEX runs_by_wake_at ON runs (wake_at) WHERE wake_at IS NOT NULL;

-- The runs an engine holds, to renew or release their leases in one statement.
CREATE INDEX runs_by_owner ON runs (owner) WHERE owner IS NOT NULL;

-- History gains two kinds: 'timer' (a durable sleep and its deadline) and 'timeout' (a step
-- ended by its deadline). SQLite cannot change a CHECK constraint, so the table is rebuilt.
CREATE TABLE history_v3 (
    run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    kind    TEXT    NOT NULL
        CHECK (kind IN ('hop', 'unhop', 'decision', 'effect', 'transition', 'error',
                        'cancel', 'restart', 'complete', 'fail', 'diverge', 'reroute',
                        'timer', 'timeout')),
    step    TEXT,
    token   TEXT,
    value   TEXT,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

INSERT INTO history_v3 (run_id, seq, kind, step, token, value, at)
    SELECT run_id, seq, kind, step, token, value, at FROM history;
DROP TABLE history;
ALTER TABLE history_v3 RENAME TO history;

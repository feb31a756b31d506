-- Hop schema, version 5: patches in flow code.
--
-- History gains the kind 'patch': the run took the new branch of `flow.patched(name)` (step: the
-- patch's name), so that replay takes that branch again, while a run whose history has no marker
-- at that point keeps the old one. 'fork' is reserved for a run started from another run's
-- history. SQLite cannot change a CHECK constraint, so the table is rebuilt.
CREATE TABLE history_v5 (
    run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    kind    TEXT    NOT NULL
        CHECK (kind IN ('hop', 'unhop', 'decision', 'effect', 'transition', 'error',
                        'cancel', 'restart', 'complete', 'fail', 'diverge', 'reroute',
                        'timer', 'timeout', 'takeover', 'patch', 'fork')),
    step    TEXT,
    token   TEXT,
    value   TEXT,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

INSERT INTO history_v5 (run_id, seq, kind, step, token, value, at)
    SELECT run_id, seq, kind, step, token, value, at FROM history;
DROP TABLE history;
ALTER TABLE history_v5 RENAME TO history;

-- The markers of a patch, for `hopctl patches`: which runs took its new branch, and since when.
CREATE INDEX history_patches ON history (step, at) WHERE kind = 'patch';

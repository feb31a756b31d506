-- Hop schema, version 6: the history's kind check without an IN list.
--
-- SQLite checks `kind IN ('hop', …)` by building a temporary index of the seventeen kinds for
-- every INSERT statement it runs, which took about half of an insert's CPU. The same check as
-- comparisons costs a tenth of that; the kinds allowed are unchanged. SQLite cannot change a
-- CHECK constraint, so the table is rebuilt, as in version 5.
CREATE TABLE history_v6 (
    run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    kind    TEXT    NOT NULL
        CHECK (kind = 'hop' OR kind = 'unhop' OR kind = 'decision' OR kind = 'effect'
               OR kind = 'transition' OR kind = 'error' OR kind = 'cancel' OR kind = 'restart'
               OR kind = 'complete' OR kind = 'fail' OR kind = 'diverge' OR kind = 'reroute'
               OR kind = 'timer' OR kind = 'timeout' OR kind = 'takeover' OR kind = 'patch'
               OR kind = 'fork'),
    step    TEXT,
    token   TEXT,
    value   TEXT,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

INSERT INTO history_v6 (run_id, seq, kind, step, token, value, at)
    SELECT run_id, seq, kind, step, token, value, at FROM history;
DROP TABLE history;
ALTER TABLE history_v6 RENAME TO history;

CREATE INDEX history_patches ON history (step, at) WHERE kind = 'patch';

-- Hop schema, version 1: flow runs and their hop history.
-- Times are milliseconds since the Unix epoch (UTC).

-- One row per run of a flow for a subject (a device, a user; 'default' when a daemon serves one).
CREATE TABLE runs (
    id               INTEGER PRIMARY KEY,
    flow             TEXT    NOT NULL,
    subject          TEXT    NOT NULL,
    flow_version     TEXT    NOT NULL,
    status           TEXT    NOT NULL
        CHECK (status IN ('running', 'parked', 'completed', 'failed', 'cancelled', 'diverged')),
    current_step     TEXT,             -- the step in flight, NULL between hops and once finished
    current_token    TEXT,             -- the token an unhop of current_step must present
    wake_on          TEXT,             -- for a parked run: the stored change that unhops it, if any
    owner            TEXT,             -- the engine executing the run
    lease_expires_at INTEGER,          -- until when owner holds the run
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

-- At most one unfinished run per (flow, subject).
CREATE UNIQUE INDEX runs_unfinished_per_subject ON runs (flow, subject)
    WHERE status IN ('running', 'parked');

-- Latest run of a flow for a subject; runs of a flow.
CREATE INDEX runs_by_flow_subject ON runs (flow, subject, id);

-- Runs an engine must look at when it starts or wakes: the unfinished ones.
CREATE INDEX runs_unfinished ON runs (status, flow) WHERE status IN ('running', 'parked');

-- Append-only hop history of every run, numbered 1, 2, 3… within the run.
CREATE TABLE history (
    run_id  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    kind    TEXT    NOT NULL
        CHECK (kind IN ('hop', 'unhop', 'decision', 'effect', 'transition', 'error',
                        'cancel', 'restart', 'complete', 'fail', 'diverge', 'reroute')),
    step    TEXT,                      -- the step (hop, unhop, transition, error) or name (decision, effect)
    token   TEXT,                      -- the hop's token (hop, unhop)
    value   TEXT,                      -- JSON: an unhop's output, a decision's value; or a message
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

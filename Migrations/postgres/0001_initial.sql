-- Hop schema on PostgreSQL, version 1: the SQLite schema's version 5 (Migrations/0001…0005), as
-- one migration, since no deployment on PostgreSQL predates it. The same tables, columns, checks
-- and indexes; times are milliseconds since the Unix epoch (UTC), as there.

-- One row per run of a flow for a subject. Ids come from an identity sequence: never reused.
CREATE TABLE runs (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    flow             TEXT    NOT NULL,
    subject          TEXT    NOT NULL,
    flow_version     TEXT    NOT NULL,
    status           TEXT    NOT NULL
        CHECK (status IN ('running', 'parked', 'completed', 'failed', 'cancelled', 'diverged')),
    current_step     TEXT,             -- the step in flight, NULL between hops and once finished
    current_token    TEXT,             -- the token an unhop of current_step must present
    wake_on          TEXT,             -- for a parked run: the stored change that unhops it, if any
    owner            TEXT,             -- the engine incarnation executing the run
    lease_expires_at BIGINT,           -- until when owner holds the run
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    wake_at          BIGINT,           -- a parked run whose step has a timeout: when it ends
    last_owner       TEXT              -- the incarnation that executed the run last
);

-- At most one unfinished run per (flow, subject).
CREATE UNIQUE INDEX runs_unfinished_per_subject ON runs (flow, subject)
    WHERE status IN ('running', 'parked');
-- Latest run of a flow for a subject; runs of a flow.
CREATE INDEX runs_by_flow_subject ON runs (flow, subject, id);
-- Runs an engine must look at when it starts or wakes: the unfinished ones.
CREATE INDEX runs_unfinished ON runs (status, flow) WHERE status IN ('running', 'parked');
CREATE INDEX runs_by_wake_at ON runs (wake_at) WHERE wake_at IS NOT NULL;
-- The runs an engine holds, to renew or release their leases in one statement.
CREATE INDEX runs_by_owner ON runs (owner) WHERE owner IS NOT NULL;

-- Append-only hop history of every run, numbered 1, 2, 3… within the run.
CREATE TABLE history (
    run_id  BIGINT  NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq     BIGINT  NOT NULL,
    kind    TEXT    NOT NULL
        CHECK (kind IN ('hop', 'unhop', 'decision', 'effect', 'transition', 'error',
                        'cancel', 'restart', 'complete', 'fail', 'diverge', 'reroute',
                        'timer', 'timeout', 'takeover', 'patch', 'fork')),
    step    TEXT,                      -- the step (hop, unhop, transition, error) or name (decision, effect, patch)
    token   TEXT,                      -- the hop's token (hop, unhop)
    value   TEXT,                      -- JSON: an unhop's output, a decision's value; or a message
    at      BIGINT  NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- The markers of a patch, for `hopctl patches`.
CREATE INDEX history_patches ON history (step, at) WHERE kind = 'patch';

-- First-use flags: a row means the feature has been used by the subject; no row means first use.
CREATE TABLE first_use (
    subject  TEXT    NOT NULL,
    feature  TEXT    NOT NULL,
    used_at  BIGINT  NOT NULL,
    PRIMARY KEY (subject, feature)
);

-- The stored user session of each subject; Hop never logs or prints the token unless asked to.
CREATE TABLE sessions (
    subject     TEXT    NOT NULL PRIMARY KEY,
    user_id     TEXT    NOT NULL,
    token       TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    expires_at  BIGINT                -- NULL: does not expire
);
-- Sessions by expiry: an engine ends the expired ones without scanning the table.
CREATE INDEX sessions_by_expiry ON sessions (expires_at) WHERE expires_at IS NOT NULL;

-- The daemon's own key/value facts per subject (e.g. 'terms-version' = '3').
CREATE TABLE facts (
    subject     TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    value       TEXT    NOT NULL,
    updated_at  BIGINT  NOT NULL,
    PRIMARY KEY (subject, key)
);

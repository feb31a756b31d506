-- Hop schema, version 2: the persisted state that conditional hops are evaluated against.

-- First-use flags: a row means the feature has been used by the subject; no row means first use.
CREATE TABLE first_use (
    subject  TEXT    NOT NULL,
    feature  TEXT    NOT NULL,
    used_at  INTEGER NOT NULL,
    PRIMARY KEY (subject, feature)
) WITHOUT ROWID;

-- The stored user session of each subject. The token is kept so the daemon can use it;
-- Hop never logs or prints it unless asked to.
CREATE TABLE sessions (
    subject     TEXT    NOT NULL PRIMARY KEY,
    user_id     TEXT    NOT NULL,
    token       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER               -- NULL: does not expire
) WITHOUT ROWID;

-- The daemon's own key/value facts per subject (e.g. 'terms-version' = '3').
CREATE TABLE facts (
    subject     TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    value       TEXT    NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (subject, key)
) WITHOUT ROWID;

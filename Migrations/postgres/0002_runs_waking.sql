-- Hop schema on PostgreSQL, version 2: the SQLite schema's version 7 (Migrations/0007), an index
-- of the parked runs that wait for a stored change, by subject.
CREATE INDEX runs_waking ON runs (subject, wake_on) WHERE wake_on IS NOT NULL;

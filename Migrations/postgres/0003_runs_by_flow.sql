-- Hop schema on PostgreSQL, version 3: the SQLite schema's version 8 (Migrations/0008), an index
-- of the runs of each flow in the order they were made (the newest run of a flow in one search).
CREATE INDEX runs_by_flow ON runs (flow, id);

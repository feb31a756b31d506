-- Hop schema, version 8: an index of the runs of each flow in the order they were made.
--
-- `hopctl start` without `--version` starts a run on the version of the flow's newest run, and
-- reads it inside its write transaction. The index by flow, subject and id holds a flow's runs
-- by subject, so finding the newest one read every run of the flow (about 100 ms at 1,000,000
-- runs, while the daemon waited for the write lock); this index finds it in one search.
CREATE INDEX runs_by_flow ON runs (flow, id);

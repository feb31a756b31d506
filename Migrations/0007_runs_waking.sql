-- Hop schema, version 7: an index of the parked runs that wait for a stored change.
--
-- Setting, clearing or expiring a subject's session ends the parked steps of that subject that
-- wait for it (`wake_on`). Without an index on the subject, finding them read every run ever
-- stored. Only a parked run has `wake_on` set, so the index holds those runs and nothing else.
CREATE INDEX runs_waking ON runs (subject, wake_on) WHERE wake_on IS NOT NULL;

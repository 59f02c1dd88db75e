-- gnl schema 7 (Postgres): a holder's death is charged exactly (docs/DECISIONS.md "Events: a
-- holder's death is charged to the event it hit"). A batch delivery is not charged when it is
-- written: `batched` = 1 on a 'wait' mark says its last delivery was part of a batch (attempts
-- not counted for it). Due again without a settle, its holder died or lost the lease: it goes
-- out alone, charged at that fetch. A failure settled for it counts the attempt then.
ALTER TABLE gnl_event_marks ADD COLUMN batched smallint NOT NULL DEFAULT 0;

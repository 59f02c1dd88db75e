-- gnl schema 3 (SQLite): the scheduler's triggers. A definition (immutable: `definition` is
-- its canonical text) and a state moved by compare-and-set on `version`. `due_at` is
-- `next_run_at` while pending, NULL otherwise: the partial index holds only due-able triggers,
-- so an idle poll reads one index entry at any number of triggers.

CREATE TABLE gnl_triggers (
    id                 TEXT    NOT NULL PRIMARY KEY,
    name               TEXT    NOT NULL,               -- the workflow
    kind               TEXT    NOT NULL,               -- cron every at
    spec               TEXT    NOT NULL,               -- expression, every_ms or the instant
    anchor_ms          INTEGER NOT NULL,               -- registration instant
    misfire            TEXT    NOT NULL,
    max_catchup        INTEGER,
    misfire_grace_ms   INTEGER NOT NULL,
    input              TEXT,                           -- JSON
    max_attempts       INTEGER NOT NULL,
    definition         TEXT    NOT NULL,               -- canonical text of the definition
    state              TEXT    NOT NULL,               -- pending done failed
    fire_count         INTEGER NOT NULL,
    next_run_at        INTEGER,
    owed_slot          INTEGER,                        -- the grid slot owed
    retry_slot         INTEGER,                        -- a failed/deferred fire's slot
    attempts           INTEGER NOT NULL,
    last_error         TEXT,
    last_fired_at      INTEGER,
    last_scheduled_for INTEGER,
    missed             INTEGER NOT NULL,
    deferrals          INTEGER NOT NULL,
    last_deferral_at   INTEGER,
    due_at             INTEGER,                        -- next_run_at while pending
    version            INTEGER NOT NULL,               -- +1 per state write (the CAS witness)
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
);
CREATE INDEX gnl_triggers_due ON gnl_triggers (due_at, id) WHERE due_at IS NOT NULL;

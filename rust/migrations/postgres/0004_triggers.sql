-- gnl schema 4 (Postgres): the scheduler's triggers. A definition (immutable: `definition` is
-- its canonical text) and a state moved by compare-and-set on `version`. `due_at` is
-- `next_run_at` while pending, NULL otherwise: the partial index holds only due-able triggers,
-- so an idle poll reads one index entry at any number of triggers.

CREATE TABLE gnl_triggers (
    id                 text COLLATE "C" NOT NULL PRIMARY KEY,
    name               text    NOT NULL,               -- the workflow
    kind               text    NOT NULL,               -- cron every at
    spec               text    NOT NULL,               -- expression, every_ms or the instant
    anchor_ms          bigint NOT NULL,               -- registration instant
    misfire            text    NOT NULL,
    max_catchup        bigint,
    misfire_grace_ms   bigint NOT NULL,
    input              text,                           -- JSON
    max_attempts       bigint NOT NULL,
    definition         text    NOT NULL,               -- canonical text of the definition
    state              text    NOT NULL,               -- pending done failed
    fire_count         bigint NOT NULL,
    next_run_at        bigint,
    owed_slot          bigint,                        -- the grid slot owed
    retry_slot         bigint,                        -- a failed/deferred fire's slot
    attempts           bigint NOT NULL,
    last_error         text,
    last_fired_at      bigint,
    last_scheduled_for bigint,
    missed             bigint NOT NULL,
    deferrals          bigint NOT NULL,
    last_deferral_at   bigint,
    due_at             bigint,                        -- next_run_at while pending
    version            bigint NOT NULL,               -- +1 per state write (the CAS witness)
    created_at         bigint NOT NULL,
    updated_at         bigint NOT NULL
);
CREATE INDEX gnl_triggers_due ON gnl_triggers (due_at, id) WHERE due_at IS NOT NULL;

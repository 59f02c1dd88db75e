-- gnl schema 3 (MySQL / MariaDB): the scheduler's triggers. A definition (immutable:
-- `definition` is its canonical text) and a state moved by compare-and-set on `version`.
-- `due_at` is `next_run_at` while pending, NULL otherwise; an idle poll reads the first entry
-- of (due_at, id) past the NULLs, one index probe at any number of triggers.
-- Trigger ids are at most 255 characters (1,020 bytes): the id is the key itself.

CREATE TABLE IF NOT EXISTS gnl_triggers (
    id                 VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    name               VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kind               VARCHAR(8) NOT NULL,                    -- cron every at
    spec               TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    anchor_ms          BIGINT NOT NULL,                        -- registration instant
    misfire            VARCHAR(16) NOT NULL,
    max_catchup        BIGINT,
    misfire_grace_ms   BIGINT NOT NULL,
    input              LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    max_attempts       BIGINT NOT NULL,
    definition         LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state              VARCHAR(16) NOT NULL,                   -- pending done failed
    fire_count         BIGINT NOT NULL,
    next_run_at        BIGINT,
    owed_slot          BIGINT,
    retry_slot         BIGINT,
    attempts           BIGINT NOT NULL,
    last_error         LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    last_fired_at      BIGINT,
    last_scheduled_for BIGINT,
    missed             BIGINT NOT NULL,
    deferrals          BIGINT NOT NULL,
    last_deferral_at   BIGINT,
    due_at             BIGINT,
    version            BIGINT NOT NULL,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (id),
    KEY gnl_triggers_due (due_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

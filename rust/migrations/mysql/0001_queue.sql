-- gnl schema 1 (MySQL >= 8.0.1 / MariaDB >= 10.6): the queue and the step journal.
-- MySQL DDL commits as it goes, so every statement here is idempotent (IF NOT EXISTS, indexes
-- inside CREATE TABLE): a migration cut off half-way is simply run again.
--
-- org, id and type are VARBINARY: compared and sorted byte for byte (no case folding, no
-- trailing-space padding), like SQLite's and Postgres's "C" collation. An id may be 1,000
-- characters (4,000 bytes), too long for an InnoDB key, so uniqueness is kept on
-- (org, SHA-256 of id).

CREATE TABLE IF NOT EXISTS gnl_jobs (
    seq              BIGINT NOT NULL AUTO_INCREMENT,          -- enqueue order, never reused
    org              VARBINARY(800) NOT NULL,                 -- '' = no organization
    id               VARBINARY(4000) NOT NULL,
    id_key           BINARY(32) AS (UNHEX(SHA2(id, 256))) STORED,
    type             VARBINARY(800) NOT NULL,
    payload          LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- JSON text
    state            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,               -- counted at claim time
    max_attempts     BIGINT NOT NULL DEFAULT 5,               -- set by the claiming worker
    last_error       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    result           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,     -- JSON text
    created_at       BIGINT NOT NULL,                         -- epoch ms, the server's clock
    updated_at       BIGINT NOT NULL,
    run_at           BIGINT NOT NULL,                         -- due instant
    finished_at      BIGINT NULL,
    lease_token      BIGINT NOT NULL DEFAULT 0,               -- fencing token, +1 per claim
    lease_expires_at BIGINT NULL,
    lease_owner      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    cancel_requested TINYINT NOT NULL DEFAULT 0,
    PRIMARY KEY (seq),
    UNIQUE KEY gnl_jobs_org_id (org, id_key),
    -- A lane's due jobs of one type, oldest first (InnoDB appends seq): the claim reads it in
    -- order, so no filesort and no lock on rows it does not take.
    KEY gnl_jobs_due (org, state, type, run_at),
    -- Expired leases.
    KEY gnl_jobs_lease (state, lease_expires_at),
    -- Listings: a lane in enqueue order.
    KEY gnl_jobs_lane_seq (org, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per organization (the no-organization lane included) and job type: a claim reads
-- the rows of the types its worker has handlers for, so a lane whose jobs are of other types
-- costs it nothing. next_run_at is a lower bound of the earliest pending run_at of the lane's
-- jobs of that type (NULL: none pending); served_at orders the organizations: the smallest has
-- waited longest. It is the organization's turn ticket: a claim that serves the organization
-- writes it on the organization's rows it holds, and a new row takes it from the others. The
-- row of type '' (no job has it) is an organization's lock for an enqueue's max_depth check.
-- due <> 0: the lane is in the turn (its next_run_at had come when a claim last looked at it).
-- A claim takes lanes from the turn index alone, so lanes whose jobs are all due later cost it
-- nothing; lanes not due wait in gnl_lanes_next, and a claim moves those whose next_run_at has
-- come into the turn (an enqueue only lowers next_run_at). MySQL has no partial indexes:
-- due_turn is served_at for lanes in the turn (else NULL), wait_at next_run_at for the others.
CREATE TABLE IF NOT EXISTS gnl_lanes (
    org         VARBINARY(800) NOT NULL,
    type        VARBINARY(800) NOT NULL,
    next_run_at BIGINT NULL,
    served_at   BIGINT NOT NULL DEFAULT 0,
    due         TINYINT NOT NULL DEFAULT 0,
    due_turn    BIGINT AS (IF(due <> 0, served_at, NULL)) STORED,
    wait_at     BIGINT AS (IF(due <> 0, NULL, next_run_at)) STORED,
    PRIMARY KEY (org, type),
    KEY gnl_lanes_turn (type, due_turn, org),
    KEY gnl_lanes_next (type, wait_at),
    KEY gnl_lanes_served (served_at)                         -- the latest turn ticket
) ENGINE=InnoDB;

-- Journaled steps: the first result recorded for (run_id, name) is kept.
CREATE TABLE IF NOT EXISTS gnl_steps (
    step_key   BINARY(32) NOT NULL,                           -- SHA-256 of (run_id, name)
    run_id     MEDIUMBLOB NOT NULL,
    name       MEDIUMBLOB NOT NULL,
    result     LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (step_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

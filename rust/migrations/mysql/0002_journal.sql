-- gnl schema 2 (MySQL / MariaDB): durable runs. A run's record (gnl_runs), its steps keyed
-- (run_id, name, n) (gnl_run_steps, which replaces schema 1's gnl_steps keyed (run_id, name):
-- its rows become n = 0), and leased locks with fencing tokens (gnl_locks).
-- DDL commits as it goes: every statement is idempotent, so a migration cut off half-way is
-- simply run again (gnl_steps is created empty again before it is copied and dropped).
-- Run ids, step names and lock keys may be longer than an InnoDB key: rows are keyed by their
-- SHA-256 (run_key, name_key, lock_key), and every lookup also compares the text itself.

CREATE TABLE IF NOT EXISTS gnl_runs (
    run_key          BINARY(32) NOT NULL,                   -- SHA-256 of run_id
    run_id           MEDIUMBLOB NOT NULL,
    workflow         MEDIUMBLOB NOT NULL,
    preset           VARCHAR(16),                            -- NULL or 'critical'
    state            VARCHAR(16) NOT NULL,                   -- running suspended done failed
    input            LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    result           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    error            LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    scheduled_for    BIGINT,
    wake_at          BIGINT,
    lease_owner      MEDIUMBLOB,
    lease_expires_at BIGINT,
    due_at           BIGINT,                                 -- when the waker resumes it
    token            BIGINT NOT NULL,                        -- fencing token, +1 per execution
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (run_key),
    KEY gnl_runs_due (due_at),
    KEY gnl_runs_listed (created_at, run_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS gnl_run_steps (
    run_key     BINARY(32) NOT NULL,                        -- SHA-256 of run_id
    name_key    BINARY(32) NOT NULL,                        -- SHA-256 of name
    n           INT NOT NULL,
    run_id      MEDIUMBLOB NOT NULL,
    name        MEDIUMBLOB NOT NULL,
    position    INT NOT NULL,
    state       VARCHAR(8) NOT NULL,                        -- intent (at_most_once) | done
    result      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    token       BIGINT NOT NULL DEFAULT 0,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT,
    PRIMARY KEY (run_key, name_key, n)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS gnl_steps (
    step_key   BINARY(32) NOT NULL,
    run_id     MEDIUMBLOB NOT NULL,
    name       MEDIUMBLOB NOT NULL,
    result     LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (step_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT IGNORE INTO gnl_run_steps
    (run_key, name_key, n, run_id, name, position, state, result, started_at, finished_at)
    SELECT UNHEX(SHA2(run_id, 256)), UNHEX(SHA2(name, 256)), 0, run_id, name, 0, 'done', result,
           created_at, created_at
    FROM gnl_steps;
DROP TABLE IF EXISTS gnl_steps;

CREATE TABLE IF NOT EXISTS gnl_locks (
    lock_key   BINARY(32) NOT NULL,                         -- SHA-256 of the key
    lock_name  MEDIUMBLOB NOT NULL,
    owner      MEDIUMBLOB NOT NULL,
    token      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (lock_key)
) ENGINE=InnoDB;

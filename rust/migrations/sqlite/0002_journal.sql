-- gnl schema 2 (SQLite): durable runs. A run's record (gnl_runs), its steps keyed
-- (run_id, name, n) (gnl_run_steps, which replaces schema 1's gnl_steps keyed (run_id, name):
-- its rows become n = 0), and leased locks with fencing tokens (gnl_locks).

CREATE TABLE gnl_runs (
    run_id           TEXT    NOT NULL PRIMARY KEY,
    workflow         TEXT    NOT NULL,
    preset           TEXT,                              -- NULL or 'critical'
    state            TEXT    NOT NULL,                  -- running suspended done failed
    input            TEXT,                              -- JSON
    result           TEXT,                              -- JSON, once done
    error            TEXT,                              -- once failed
    scheduled_for    INTEGER,
    wake_at          INTEGER,                           -- suspended: when its sleep ends
    lease_owner      TEXT,                              -- running: the executing process
    lease_expires_at INTEGER,
    due_at           INTEGER,                           -- when the waker resumes it (NULL: never)
    token            INTEGER NOT NULL,                  -- fencing token, +1 per execution
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX gnl_runs_due ON gnl_runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX gnl_runs_listed ON gnl_runs (created_at, run_id);

CREATE TABLE gnl_run_steps (
    run_id      TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    n           INTEGER NOT NULL,                       -- earlier calls of `name` in the run
    position    INTEGER NOT NULL,                       -- its place among the run's steps
    state       TEXT    NOT NULL,                       -- intent (at_most_once, running) | done
    result      TEXT,                                   -- JSON, once done
    token       INTEGER NOT NULL DEFAULT 0,             -- the intent's writer
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (run_id, name, n)
);
INSERT INTO gnl_run_steps (run_id, name, n, position, state, result, started_at, finished_at)
    SELECT run_id, name, 0, 0, 'done', result, created_at, created_at FROM gnl_steps;
DROP TABLE gnl_steps;

CREATE TABLE gnl_locks (
    lock_key   TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

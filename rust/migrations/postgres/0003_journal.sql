-- gnl schema 3 (Postgres): durable runs. A run's record (gnl_runs), its steps keyed
-- (run_id, name, n) (gnl_run_steps, which replaces schema 1's gnl_steps keyed (run_id, name):
-- its rows become n = 0), and leased locks with fencing tokens (gnl_locks).

CREATE TABLE gnl_runs (
    run_id           text COLLATE "C" NOT NULL PRIMARY KEY,
    workflow         text COLLATE "C" NOT NULL,
    preset           text,                                   -- NULL or 'critical'
    state            text NOT NULL,                          -- running suspended done failed
    input            text,                                   -- JSON
    result           text,                                   -- JSON, once done
    error            text,                                   -- once failed
    scheduled_for    bigint,
    wake_at          bigint,                                 -- suspended: when its sleep ends
    lease_owner      text,                                   -- running: the executing process
    lease_expires_at bigint,
    due_at           bigint,                                 -- when the waker resumes it
    token            bigint NOT NULL,                        -- fencing token, +1 per execution
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL
);
CREATE INDEX gnl_runs_due ON gnl_runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX gnl_runs_listed ON gnl_runs (created_at, run_id);

CREATE TABLE gnl_run_steps (
    run_id      text COLLATE "C" NOT NULL,
    name        text COLLATE "C" NOT NULL,
    n           bigint NOT NULL,                             -- earlier calls of `name` in the run
    position    bigint NOT NULL,                             -- its place among the run's steps
    state       text NOT NULL,                               -- intent (at_most_once) | done
    result      text,                                        -- JSON, once done
    token       bigint NOT NULL DEFAULT 0,                   -- the intent's writer
    started_at  bigint NOT NULL,
    finished_at bigint,
    PRIMARY KEY (run_id, name, n)
);
INSERT INTO gnl_run_steps (run_id, name, n, position, state, result, started_at, finished_at)
    SELECT run_id, name, 0, 0, 'done', result, created_at, created_at FROM gnl_steps;
DROP TABLE gnl_steps;

CREATE TABLE gnl_locks (
    lock_key   text COLLATE "C" NOT NULL PRIMARY KEY,
    owner      text NOT NULL,
    token      bigint NOT NULL,
    expires_at bigint NOT NULL
);

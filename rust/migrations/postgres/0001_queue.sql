-- gnl schema 1 (Postgres): the queue and the step journal. Tables live in the connection's
-- current schema (the first existing schema of search_path).
-- JSON (payloads, results) is stored as text, as gnl wrote it: gnl's encoder checks it strictly
-- before it is sent, so the server's json parser would only check it again, at ~15% of a bulk
-- enqueue's time. Cast it (`payload::jsonb`) to query it in SQL. MySQL and SQLite store it so too.
-- Text that gnl compares or sorts (org, id, type) uses the "C" collation: byte order, the
-- same order as SQLite's and MySQL's binary comparisons.

CREATE TABLE gnl_jobs (
    seq              bigint GENERATED ALWAYS AS IDENTITY,             -- enqueue order, never reused
    org              text COLLATE "C" NOT NULL,                       -- '' = no organization
    id               text COLLATE "C" NOT NULL,
    type             text COLLATE "C" NOT NULL,
    payload          text   NOT NULL,                                 -- JSON text (see below)
    state            text   NOT NULL,                                 -- pending running done dead canceled
    attempts         bigint NOT NULL DEFAULT 0,                       -- counted at claim time
    max_attempts     bigint NOT NULL DEFAULT 5,                       -- set by the claiming worker
    last_error       text,
    result           text,                                            -- JSON text
    created_at       bigint NOT NULL,                                 -- epoch ms, the server's clock
    updated_at       bigint NOT NULL,
    run_at           bigint NOT NULL,                                 -- due instant
    finished_at      bigint,
    lease_token      bigint NOT NULL DEFAULT 0,                       -- fencing token, +1 per claim
    lease_expires_at bigint,
    lease_owner      text,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- The key: a lane in enqueue order (listings), and the row of a (org, seq) every write
    -- names. One index serves both; a job row has three btree indexes in all (this, the id
    -- and the due index), each of which every insert and every state change writes.
    CONSTRAINT gnl_jobs_pkey PRIMARY KEY (org, seq),
    CONSTRAINT gnl_jobs_org_id UNIQUE (org, id)
);
-- A lane's due jobs, oldest first.
CREATE INDEX gnl_jobs_due ON gnl_jobs (org, run_at, seq) WHERE state = 'pending';
-- Expired leases.
CREATE INDEX gnl_jobs_lease ON gnl_jobs (lease_expires_at) WHERE state = 'running';

-- One row per organization (the no-organization lane included).
-- next_run_at is a lower bound of the lane's earliest pending run_at (NULL: nothing pending);
-- served_at orders the lanes: the smallest has waited longest.
CREATE TABLE gnl_lanes (
    org         text COLLATE "C" PRIMARY KEY,
    next_run_at bigint,
    served_at   bigint NOT NULL DEFAULT 0
);
CREATE INDEX gnl_lanes_turn ON gnl_lanes (served_at, org) WHERE next_run_at IS NOT NULL;
CREATE INDEX gnl_lanes_next ON gnl_lanes (next_run_at) WHERE next_run_at IS NOT NULL;
-- The latest turn ticket (a claim's tickets follow it).
CREATE INDEX gnl_lanes_served ON gnl_lanes (served_at);

-- Journaled steps: the first result recorded for (run_id, name) is kept.
CREATE TABLE gnl_steps (
    run_id     text COLLATE "C" NOT NULL,
    name       text COLLATE "C" NOT NULL,
    result     text   NOT NULL,                                       -- JSON text
    created_at bigint NOT NULL,
    PRIMARY KEY (run_id, name)
);

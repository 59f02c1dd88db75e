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
    -- true: enqueued due at the enqueue's clock (no run_at, no delay), in its lane's enqueue
    -- order; while pending it is found from the lane's head (gnl_lanes.head) along the key.
    -- false (every other pending job: enqueued with a run_at or a delay, retried, taken back
    -- from an expired lease): found by gnl_jobs_due. A row
    -- written by hand keeps the default, which the due index always finds.
    in_order         boolean NOT NULL DEFAULT false,
    -- The key: a lane in enqueue order (listings, and the pending jobs due at enqueue from
    -- the lane's head), and the row of a (org, seq) every write names. An enqueue writes two
    -- btree entries per job (this and the id); a job with a run_at or delay, a third (the due
    -- index).
    CONSTRAINT gnl_jobs_pkey PRIMARY KEY (org, seq),
    -- A job's id in its organization. Keyed id first: it serves only equality lookups (an id
    -- and its org), and id-first entries compare on their first column and truncate to it
    -- in the inner pages; org-first cost a bulk enqueue ~15% more server time.
    CONSTRAINT gnl_jobs_id_org UNIQUE (id, org)
);
-- A lane's pending jobs that are not in enqueue order (due later, retried, taken back), oldest
-- due first. Jobs due at enqueue are not in it: each index entry costs a bulk enqueue about
-- a quarter of its time, and the key already holds them in order.
CREATE INDEX gnl_jobs_due ON gnl_jobs (org, run_at, seq) WHERE state = 'pending' AND NOT in_order;
-- Expired leases.
CREATE INDEX gnl_jobs_lease ON gnl_jobs (lease_expires_at) WHERE state = 'running';

-- One row per organization (the no-organization lane included).
-- next_run_at is a lower bound of the lane's earliest pending run_at (NULL: nothing pending);
-- served_at orders the lanes: the smallest has waited longest.
-- head: every pending in_order job of the lane has seq >= head. Only a claim, holding the
-- lane's row lock, moves it: to the first in_order job it sees pending, or past the last job
-- it sees. An enqueue holds enqueue locks (transaction advisory locks that claims never take:
-- its lanes' ('gnl_lane:<schema>:<org>') under a shared gnl-wide lock, or, over 32 lanes, the
-- gnl-wide one ('gnl_lanes:<schema>') exclusively; keys are hashtextextended(key, 0)) from before its jobs get
-- seqs until it commits, so a lane's jobs become visible in seq order and none can appear
-- behind a head that was moved past what a claim saw.
CREATE TABLE gnl_lanes (
    org         text COLLATE "C" PRIMARY KEY,
    next_run_at bigint,
    served_at   bigint NOT NULL DEFAULT 0,
    head        bigint NOT NULL DEFAULT 0
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

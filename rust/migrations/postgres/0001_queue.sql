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
    -- While running: the lease's end (renewals move it) and its record (gnl_leases.id of the
    -- last claim). 0 until the first claim, never NULL: a claim's new row version is then no
    -- wider than the one it replaces, so it always fits in the room the fillfactor left.
    lease_expires_at bigint NOT NULL DEFAULT 0,
    lease_id         bigint NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- false exactly while the job is in gnl_jobs_due: pending, and enqueued with a run_at or a
    -- delay, retried, or taken back from an expired lease. true: pending in its lane's enqueue
    -- order (enqueued due at the enqueue's clock: found from the lane's head,
    -- gnl_lanes.head, along the key), or not pending at all (whatever leaves pending sets it).
    -- A row written by hand keeps the default, which the due index always finds.
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
)
-- Half of each page is left free at insert so that a claim and its outcome can write the
-- job's new row versions beside the old ones: with no indexed column changed (the indexes
-- below read only org, seq, id, run_at and in_order), such updates are HOT, adding no index
-- entry. (No free room: each of the two updates wrote an entry in every index, ~35% of a
-- drain's server time.) The cost: a table of finished jobs takes twice the pages, and a bulk
-- enqueue ~6% more server time.
WITH (fillfactor = 50);
-- A lane's pending jobs that are not in enqueue order (due later, retried, taken back), oldest
-- due first. Jobs due at enqueue are not in it: each index entry costs a bulk enqueue about
-- a quarter of its time, and the key already holds them in order. Its predicate reads
-- in_order alone (not state), so that claiming and finishing an in_order job stay HOT.
CREATE INDEX gnl_jobs_due ON gnl_jobs (org, type, run_at, seq) WHERE NOT in_order;

-- Lease records: one per claim, naming every job that claim took (their (org, seq) keys), until
-- none of them is running under it. They are how expired leases are found: a record whose
-- expires_at has passed names the jobs to look at, and each of those still running under it
-- (lease_id) whose own lease_expires_at has passed is taken back. A record's expires_at is
-- the earliest lease_expires_at of its running jobs (a claim, a renewal and a reclaim keep it
-- so), so each job's lease stays its own. (An index on the jobs' lease column made every
-- claim, renewal and outcome rewrite each job's index entries: no update could be HOT.)
-- remaining counts the record's jobs not yet finished by their holder; the outcome that
-- brings it to 0 deletes the record, and an expired record without a running job is deleted
-- when expired leases are looked for. Lock order: job rows, then lane rows, then lease records.
CREATE SEQUENCE gnl_lease_ids;
CREATE TABLE gnl_leases (
    id         bigint PRIMARY KEY,
    expires_at bigint NOT NULL,                                       -- epoch ms, the server's clock
    owner      text   NOT NULL,                                       -- the worker's name
    remaining  bigint NOT NULL,
    orgs       text[] NOT NULL,                                       -- with seqs: the jobs' keys
    seqs       bigint[] NOT NULL
);
CREATE INDEX gnl_leases_expiry ON gnl_leases (expires_at);

-- One row per organization (the no-organization lane included) and job type: a claim reads
-- the rows of the types its worker has handlers for, so a lane whose jobs are of other types
-- costs it nothing. next_run_at is a lower bound of the earliest pending run_at of the lane's
-- jobs of that type (NULL: none pending); served_at orders the organizations: the smallest has
-- waited longest. It is the organization's turn ticket: a claim that serves the organization
-- writes it on the organization's rows it holds, and a new row takes it from the others.
-- head: every pending in_order job of the organization of that type has seq >= head. Only a
-- claim, holding the row's lock, moves it: to the first in_order job of the type it sees
-- pending, or past the organization's last job. A new row starts at its first job (an
-- enqueue of one statement) or at the organization's highest head (every job of the
-- enqueue comes after it). An enqueue holds enqueue locks (transaction advisory locks that claims never take:
-- its lanes' ('gnl_lane:<schema>:<org>') under a shared gnl-wide lock, or, over 32 lanes, the
-- gnl-wide one ('gnl_lanes:<schema>') exclusively; keys are hashtextextended(key, 0)) from before its jobs get
-- seqs until it commits, so a lane's jobs become visible in seq order and none can appear
-- behind a head that was moved past what a claim saw.
-- due: the lane is in the turn (its next_run_at had come when a claim last looked at it). A
-- claim takes lanes from the turn index alone, so lanes whose jobs are all due later cost it
-- nothing; lanes not due wait in gnl_lanes_next, and a claim moves those whose next_run_at has
-- come into the turn (an enqueue only lowers next_run_at).
CREATE TABLE gnl_lanes (
    org         text COLLATE "C" NOT NULL,
    type        text COLLATE "C" NOT NULL,
    next_run_at bigint,
    served_at   bigint NOT NULL DEFAULT 0,
    head        bigint NOT NULL DEFAULT 0,
    due         boolean NOT NULL DEFAULT false,
    PRIMARY KEY (org, type)
);
CREATE INDEX gnl_lanes_turn ON gnl_lanes (type, served_at, org) WHERE due;
CREATE INDEX gnl_lanes_next ON gnl_lanes (type, next_run_at) WHERE NOT due AND next_run_at IS NOT NULL;
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

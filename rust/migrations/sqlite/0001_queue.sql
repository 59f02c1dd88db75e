-- gnl schema 1 (SQLite): the queue and the step journal.

CREATE TABLE gnl_jobs (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT, -- enqueue order, never reused
    org              TEXT    NOT NULL,                  -- '' = no organization
    id               TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,                  -- JSON
    state            TEXT    NOT NULL,                  -- pending running done dead canceled
    attempts         INTEGER NOT NULL DEFAULT 0,        -- counted at claim time
    max_attempts     INTEGER NOT NULL DEFAULT 5,        -- set by the claiming worker
    last_error       TEXT,
    result           TEXT,                              -- JSON
    created_at       INTEGER NOT NULL,                  -- epoch ms
    updated_at       INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,                  -- due instant
    finished_at      INTEGER,
    lease_token      INTEGER NOT NULL DEFAULT 0,        -- fencing token, +1 per claim
    lease_expires_at INTEGER,
    lease_owner      TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    UNIQUE (org, id)
);
-- A lane's due jobs of one type, oldest first.
CREATE INDEX gnl_jobs_due ON gnl_jobs (org, type, run_at, seq) WHERE state = 'pending';
-- Expired leases.
CREATE INDEX gnl_jobs_lease ON gnl_jobs (lease_expires_at) WHERE state = 'running';
-- Listings: a lane in enqueue order.
CREATE INDEX gnl_jobs_lane_seq ON gnl_jobs (org, seq);

-- One row per organization (the no-organization lane included) and job type: a claim reads
-- the rows of the types its worker has handlers for, so a lane whose jobs are of other types
-- costs it nothing. next_run_at is a lower bound of the earliest pending run_at of the lane's
-- jobs of that type (NULL: none pending); served_at orders the organizations: the smallest has
-- waited longest. It is the organization's turn ticket, the same in all its rows (a claim
-- that serves the organization writes them all; a new row takes it from the others), so
-- organizations are served in turn whatever their number of types.
-- due = 1: the lane is in the turn (its next_run_at had come when a claim last looked at it);
-- a claim takes lanes from the turn index alone, so lanes whose jobs are all due later cost it
-- nothing. Lanes with due = 0 wait in gnl_lanes_next; a claim moves those whose next_run_at
-- has come into the turn (an enqueue only lowers next_run_at).
CREATE TABLE gnl_lanes (
    org         TEXT    NOT NULL,
    type        TEXT    NOT NULL,
    next_run_at INTEGER,
    served_at   INTEGER NOT NULL DEFAULT 0,
    due         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (org, type)
);
CREATE INDEX gnl_lanes_turn ON gnl_lanes (type, served_at, org) WHERE due = 1;
CREATE INDEX gnl_lanes_next ON gnl_lanes (type, next_run_at) WHERE due = 0 AND next_run_at IS NOT NULL;
-- The newest turn ticket (tickets strictly increase).
CREATE INDEX gnl_lanes_served ON gnl_lanes (served_at);

-- Journaled steps: the first result recorded for (run_id, name) is kept.
CREATE TABLE gnl_steps (
    run_id     TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    result     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, name)
);

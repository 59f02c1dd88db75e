-- gnl schema 11 (Postgres): a claim that waits for its lanes instead of skipping them. A
-- worker whose last claim came back full from fewer organizations than jobs (one lane, or a
-- few) keeps a second claim in flight beside the first, as it does over many lanes (one job an
-- organization, `per_org` 1); over few lanes that second claim found every lane locked by the
-- first (SKIP LOCKED) and came back empty, so such a worker had one claim in flight and took C
-- jobs per claim round trip. `per_org` < 0 now asks for a claim whose pick waits for the
-- lanes a claim in flight holds (FOR UPDATE, no SKIP LOCKED): it runs in the server right
-- behind that one, once it committed, and takes the next jobs of the same lanes (the serve is a
-- later statement: its snapshot sees the first claim's jobs as taken). The waiting pick reads
-- each lane's newest row (a locked row is re-read after the wait), skips a lane that is no
-- longer due, and reads the newest ticket once it holds its lanes (a statement after the pick),
-- so its tickets follow the first claim's. It waits only while it holds no lane lock (no
-- lane written by its outcomes, expired leases or turn update before the pick, and only in
-- its first pass; else it skips as before), and locks its lanes in (org, type) order: two
-- claims that wait cannot deadlock. The claim is otherwise uncapped (a quantum at a time, as
-- per_org 0). The rest of the function is 0010's (the same signature: replaced in
-- place, so a worker of the previous release keeps claiming).

CREATE OR REPLACE FUNCTION gnl_claim(
    d_seq bigint[], d_tok bigint[], d_res text[],                 -- done: seq, token, result
    f_seq bigint[], f_tok bigint[], f_err text[], f_delay bigint[], -- failed: ..., error, retry delay
    reclaim boolean,                                             -- take back expired leases
    lim bigint, max_att bigint, ttl bigint, holder text,         -- the claim (lim 0: none)
    d_org text[], f_org text[],                                  -- the outcomes' organizations
    types text[],                                                -- the job types to claim
    per_org bigint)                                              -- at most this many jobs an
                                                                 -- organization (0: no cap;
                                                                 -- < 0: no cap, wait for
                                                                 -- the lanes)
RETURNS TABLE (seq bigint, lease_token bigint, org text, id text, type text, payload text,
               attempts bigint, run_at bigint)
LANGUAGE plpgsql VOLATILE
-- Plans are made once per session (planning the claim statement anew cost ~0.7 ms a call),
-- and are index plans whatever the table sizes were when they were made: a plan made while
-- a table was small must not keep scanning it once it is big.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
-- Never compiled by the JIT: over a big table the generic plans' estimates pass
-- jit_above_cost, and compiling the claim statement took ~100-130 ms a call (1,000,000 jobs
-- over 10,000 organizations) for a claim whose work is a few milliseconds.
SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    now_ms bigint := floor(extract(epoch from statement_timestamp()) * 1000)::bigint;
    lanes text[];                                                   -- the lanes read: org,
    ltypes text[];                                                  -- type, head, and the
    heads bigint[];                                                 -- org's place in turn
    ranks bigint[];
    nl bigint;                                                      -- organizations in turn
    top bigint;                                                     -- the pick's newest ticket
    ahead bigint;                                                   -- lanes in turn before
                                                                    -- the pick's first
    lid bigint;
    ended bigint[] := '{}';                                         -- the finished jobs' lease ids
    expired boolean;
    due_org text[] := '{}';                                         -- jobs due again: lane, run_at
    due_type text[] := '{}';
    due_at bigint[] := '{}';
    quantum constant bigint := 4;                                   -- see the pick below
    min_orgs constant bigint := 16;
    want bigint := lim;                                             -- jobs still to take
    norgs bigint;                                                   -- organizations a pass serves
    got bigint;
    pass int := 0;
    marked bigint := 0;                                             -- lanes this call put in turn
BEGIN
    -- Outcomes. Each write is conditional on (seq, token, state running): a stale holder's
    -- late outcome changes nothing.
    IF cardinality(d_seq) > 0 THEN
        WITH u AS (
            UPDATE gnl_jobs g SET
                state = CASE WHEN g.cancel_requested THEN 'canceled' ELSE 'done' END,
                result = o.res, finished_at = now_ms, updated_at = now_ms,
                lease_expires_at = 0
            FROM unnest(d_seq, d_tok, d_res, d_org) AS o(seq, tok, res, org)
            WHERE g.org = o.org AND g.seq = o.seq AND g.lease_token = o.tok AND g.state = 'running'
            RETURNING g.lease_id
        )
        SELECT ended || coalesce(array_agg(u.lease_id), '{}') INTO ended FROM u;
    END IF;
    IF cardinality(f_seq) > 0 THEN
        WITH f AS (
            UPDATE gnl_jobs g SET
                state = CASE WHEN g.cancel_requested THEN 'canceled'
                             WHEN g.attempts >= g.max_attempts THEN 'dead' ELSE 'pending' END,
                in_order = g.cancel_requested OR g.attempts >= g.max_attempts,
                -- A canceled job keeps the cancel's reason (cancel_job wrote it).
                last_error = CASE WHEN g.cancel_requested THEN coalesce(g.last_error, o.err)
                                  ELSE o.err END,
                updated_at = now_ms,
                lease_expires_at = 0,
                run_at = CASE WHEN NOT g.cancel_requested AND g.attempts < g.max_attempts
                              THEN now_ms + greatest(o.delay, 0) ELSE g.run_at END,
                finished_at = CASE WHEN NOT g.cancel_requested AND g.attempts < g.max_attempts
                                   THEN NULL ELSE now_ms END
            FROM unnest(f_seq, f_tok, f_err, f_delay, f_org) AS o(seq, tok, err, delay, org)
            WHERE g.org = o.org AND g.seq = o.seq AND g.lease_token = o.tok AND g.state = 'running'
            RETURNING g.org, g.type, g.state, g.run_at, g.lease_id
        )
        SELECT ended || coalesce(array_agg(f.lease_id), '{}'),
               coalesce(array_agg(f.org) FILTER (WHERE f.state = 'pending'), '{}'),
               coalesce(array_agg(f.type) FILTER (WHERE f.state = 'pending'), '{}'),
               coalesce(array_agg(f.run_at) FILTER (WHERE f.state = 'pending'), '{}')
        INTO ended, due_org, due_type, due_at FROM f;
    END IF;
    -- Expired leases (their holders stopped renewing): due again at once, or dead. A lease
    -- record that has expired names the jobs to look at; each is taken back when it is still
    -- running under that record and its own lease_expires_at has passed (a renewal writes it
    -- first: under the job's row lock it tells a lease just renewed from an expired one).
    -- Then (after the outcomes' counts below) each expired record gets the earliest lease
    -- of its jobs still running under it, or is deleted when none is.
    expired := reclaim AND (SELECT min(e.expires_at) FROM gnl_leases e) < now_ms;
    IF expired THEN
        WITH e AS (
            SELECT g.org, g.seq, x.owner FROM gnl_leases x
            CROSS JOIN LATERAL unnest(x.orgs, x.seqs) AS k(org, seq)
            JOIN gnl_jobs g ON g.org = k.org AND g.seq = k.seq
            WHERE x.expires_at < now_ms AND g.lease_id = x.id
              AND g.state = 'running' AND g.lease_expires_at < now_ms
            FOR UPDATE OF g SKIP LOCKED
        ),
        r AS (
            UPDATE gnl_jobs g SET
                state = CASE WHEN g.cancel_requested THEN 'canceled'
                             WHEN g.attempts >= g.max_attempts THEN 'dead' ELSE 'pending' END,
                in_order = g.cancel_requested OR g.attempts >= g.max_attempts,
                last_error = 'lease expired: the worker ' || e.owner ||
                             ' stopped renewing attempt ' || g.attempts ||
                             ' (crashed, stopped or cut off)',
                finished_at = CASE WHEN NOT g.cancel_requested AND g.attempts < g.max_attempts
                                   THEN NULL ELSE now_ms END,
                lease_expires_at = 0, updated_at = now_ms
            FROM e
            WHERE g.org = e.org AND g.seq = e.seq
              AND g.state = 'running' AND g.lease_expires_at < now_ms
            RETURNING g.org, g.type, g.state, g.run_at
        )
        SELECT due_org || coalesce(array_agg(r.org) FILTER (WHERE r.state = 'pending'), '{}'),
               due_type || coalesce(array_agg(r.type) FILTER (WHERE r.state = 'pending'), '{}'),
               due_at || coalesce(array_agg(r.run_at) FILTER (WHERE r.state = 'pending'), '{}')
        INTO due_org, due_type, due_at FROM r;
    END IF;
    -- The lanes of the jobs due again (failed and retried, or taken back) learn of them, in
    -- one upsert in (org, type) order (two, one per kind, could take two lanes in opposite
    -- orders). Their lanes exist (the jobs were enqueued into them).
    IF cardinality(due_org) > 0 THEN
        INSERT INTO gnl_lanes AS x (org, type, next_run_at, served_at)
        SELECT d.org, d.type, min(d.at), 0 FROM unnest(due_org, due_type, due_at) AS d(org, type, at)
        GROUP BY d.org, d.type ORDER BY d.org, d.type
        ON CONFLICT (org, type) DO UPDATE SET next_run_at = least(x.next_run_at, excluded.next_run_at);
    END IF;
    -- The finished jobs' lease records count them; a record with none left is deleted. The
    -- last writes of the call that may wait: lease records come after job rows and lane rows,
    -- and everything below takes its locks with SKIP LOCKED. One statement: the records are
    -- locked in id order (FOR UPDATE reads each one's newest remaining), then each is either
    -- deleted or counted down.
    IF cardinality(ended) > 0 THEN
        WITH e AS (
            SELECT y.id, y.remaining - f.n AS rest FROM gnl_leases y
            JOIN (SELECT u.id, count(*) AS n FROM unnest(ended) AS u(id) GROUP BY u.id) f
              ON f.id = y.id
            ORDER BY y.id FOR UPDATE OF y
        ),
        gone AS (
            DELETE FROM gnl_leases x USING e WHERE x.id = e.id AND e.rest <= 0
        )
        UPDATE gnl_leases x SET remaining = e.rest FROM e WHERE x.id = e.id AND e.rest > 0;
    END IF;
    IF expired THEN
        WITH y AS (
            SELECT z.id, (SELECT min(g.lease_expires_at) FROM unnest(z.orgs, z.seqs) AS k(org, seq)
                          JOIN gnl_jobs g ON g.org = k.org AND g.seq = k.seq
                          WHERE g.lease_id = z.id AND g.state = 'running') AS ends
            FROM gnl_leases z WHERE z.expires_at < now_ms
            FOR UPDATE SKIP LOCKED
        ),
        gone AS (
            DELETE FROM gnl_leases x USING y WHERE x.id = y.id AND y.ends IS NULL
        )
        UPDATE gnl_leases x SET expires_at = y.ends FROM y WHERE x.id = y.id AND y.ends IS NOT NULL;
    END IF;
    IF lim <= 0 OR cardinality(types) = 0 THEN
        RETURN;
    END IF;

    -- Waiting lanes of the claim's types whose next_run_at has come join the turn, with the
    -- tickets they had (busy ones are skipped: a later claim moves them). Then, per type, the
    -- lanes in the turn that waited longest, locked (busy ones are skipped); of those, the
    -- first lim organizations by their earliest lane, with all their lanes read. Lanes whose
    -- jobs are all due later, or of other types, are in neither read.
    UPDATE gnl_lanes x SET due = true FROM (
        SELECT w.org, w.type FROM gnl_lanes w
        WHERE NOT w.due AND w.type = ANY (types) AND w.next_run_at <= now_ms
        FOR UPDATE SKIP LOCKED) w
    WHERE x.org = w.org AND x.type = w.type;
    GET DIAGNOSTICS marked = ROW_COUNT;
    -- At most two passes. The first serves ceil(lim / quantum) organizations, at least
    -- min_orgs (at most lim; lim with a per-organization cap); when they held fewer jobs than the batch, the second serves the
    -- next lim - taken organizations in turn (this statement's snapshot sees the first's
    -- tickets: its lanes served now sort after every other) an equal share of what is left.
    -- Each pass has its own lease record.
    LOOP
    pass := pass + 1;
    norgs := CASE WHEN pass = 1 AND per_org <= 0
                  THEN least(want, greatest(min_orgs, (want + quantum - 1) / quantum)) ELSE want END;
    -- A claim waits for lanes only while it holds none: not when its outcomes or expired
    -- leases made it lock lanes (the due jobs' upsert) or it put lanes in the turn (the
    -- update above), and not in a second pass. A claim that waits while holding a lane could
    -- deadlock with one that holds the lane it waits for and waits for its own.
    IF per_org < 0 AND pass = 1 AND marked = 0 AND cardinality(due_org) = 0 THEN
        -- Waits for the lanes a claim in flight holds (see the header): the first norgs lanes
        -- in turn as this statement's snapshot reads them, locked in (org, type) order (the
        -- order every lane lock that waits takes: two waiting claims whose snapshots read the
        -- turn differently cannot deadlock) and read at their newest rows; one that is no
        -- longer due once it is locked is left out.
        WITH c AS (
            SELECT y.org, y.type, y.served_at, y.head FROM gnl_lanes y
            WHERE (y.org, y.type) IN (
                SELECT x.org, x.type FROM unnest(types) AS t(type)
                CROSS JOIN LATERAL (
                    SELECT w.org, w.type FROM gnl_lanes w
                    WHERE w.due AND w.type = t.type
                    ORDER BY w.served_at, w.org LIMIT norgs) x)
              AND y.due
            ORDER BY y.org, y.type
            FOR UPDATE
        ),
        o AS (
            SELECT c.org, min(c.served_at) AS at FROM c GROUP BY c.org ORDER BY 2, 1 LIMIT norgs
        ),
        r AS (
            SELECT o.org, o.at, row_number() OVER (ORDER BY o.at, o.org) AS rank FROM o
        )
        SELECT array_agg(c.org ORDER BY r.rank, c.type), array_agg(c.type ORDER BY r.rank, c.type),
               array_agg(c.head ORDER BY r.rank, c.type), array_agg(r.rank ORDER BY r.rank, c.type),
               max(r.rank)
        INTO lanes, ltypes, heads, ranks, nl FROM c JOIN r ON r.org = c.org;
        -- The newest ticket, read once the lanes are held (a new snapshot: the tickets of the
        -- claim it waited for are in it); no lane in turn is held by another claim now.
        SELECT coalesce(max(z.served_at), 0) INTO top FROM gnl_lanes z;
        ahead := 0;
    ELSE
        WITH m AS (
            -- The newest ticket this statement's snapshot sees (one seek of gnl_lanes_served).
            SELECT coalesce(max(z.served_at), 0) AS top FROM gnl_lanes z
        ),
        c AS (
            -- In turn order as this statement's snapshot reads it, each lane locked only while its
            -- newest row still holds the ticket the snapshot read (the lock's recheck compares the
            -- newest row with that value): a lane that a concurrent claim served since is skipped,
            -- and so is one locked by a claim in flight. The scan goes on to the next lane in turn.
            SELECT x.org, x.type, x.served_at, x.head FROM unnest(types) AS t(type)
            CROSS JOIN LATERAL (
                SELECT k.org, k.type, k.served_at, k.head FROM gnl_lanes w
                CROSS JOIN LATERAL (
                    SELECT y.org, y.type, y.served_at, y.head FROM gnl_lanes y
                    WHERE y.org = w.org AND y.type = w.type AND y.served_at = w.served_at AND y.due
                    FOR UPDATE SKIP LOCKED) k
                WHERE w.due AND w.type = t.type
                ORDER BY w.served_at, w.org LIMIT norgs) x
        ),
        o AS (
            SELECT c.org, min(c.served_at) AS at FROM c GROUP BY c.org ORDER BY 2, 1 LIMIT norgs
        ),
        r AS (
            SELECT o.org, o.at, row_number() OVER (ORDER BY o.at, o.org) AS rank FROM o
        )
        SELECT array_agg(c.org ORDER BY r.rank, c.type), array_agg(c.type ORDER BY r.rank, c.type),
               array_agg(c.head ORDER BY r.rank, c.type), array_agg(r.rank ORDER BY r.rank, c.type),
               max(r.rank), (SELECT m.top FROM m),
               -- The lanes of the claim's types before its first one in turn, as this snapshot
               -- reads them: those a claim in flight holds (skipped above), so this claim's
               -- tickets follow that one's (see the tickets below).
               (SELECT sum((SELECT count(*) FROM gnl_lanes z
                            WHERE z.due AND z.type = t.type AND (z.served_at, z.org) < (f.at, f.org)))
                FROM unnest(types) AS t(type), (SELECT r.at, r.org FROM r WHERE r.rank = 1) f)
        INTO lanes, ltypes, heads, ranks, nl, top, ahead FROM c JOIN r ON r.org = c.org;
    END IF;
    IF lanes IS NULL THEN
        RETURN;
    END IF;
    lid := nextval('gnl_lease_ids');

    -- Each organization in turn gets an equal share of what the pass takes (the first ones the
    -- rest), at most per_org when that is set:
    -- the oldest due jobs of its locked lanes, marked running with a new fencing token under
    -- one new lease record. A lane's candidates come from two places: its type's in_order jobs
    -- along the key from its head, and the others from the due index; the earliest due of all
    -- the organization's lanes are taken. Then the lanes: the lanes of an organization that got
    -- a job get its next turn ticket: after the newest ticket the pick saw (or the store's
    -- clock in 1/4096 ms, so a new organization's ticket 0 sorts first), plus the lanes in
    -- turn before this claim's first (`ahead`: a claim in flight holds them, and its tickets
    -- are drawn from the same newest one), plus the organization's place in this claim. So
    -- tickets increase in the order the organizations were served, and claims within one
    -- millisecond, or in flight at once, do not tie. One that got nothing keeps its ticket. Every locked lane's head moves to its first in_order job of its type
    -- still pending (none: past the organization's last job), and its next_run_at becomes its
    -- earliest pending run_at (NULL: nothing pending); it stays in the turn while that has
    -- come. A head never passes a job still being enqueued: enqueues into one organization
    -- commit in seq order (their enqueue locks, migration 0001), so every seq below one this
    -- statement sees is visible to it too.
    RETURN QUERY
    WITH l AS (
        SELECT u.org, u.type,
               least(want / nl + (u.r <= want % nl)::int, CASE WHEN per_org > 0 THEN per_org ELSE want END)
                   AS share,
               u.r - 1 AS i, u.head
        FROM unnest(lanes, ltypes, heads, ranks) AS u(org, type, head, r)
    ),
    a AS (
        SELECT j.seq, j.run_at, l.org, l.i, l.share FROM l CROSS JOIN LATERAL (
            SELECT g.seq, g.run_at FROM gnl_jobs g
            WHERE g.org = l.org AND g.seq >= l.head AND g.state = 'pending' AND g.in_order
              AND g.type = l.type AND g.run_at <= now_ms
            ORDER BY g.seq LIMIT l.share
            FOR UPDATE SKIP LOCKED) j
    ),
    b AS (
        SELECT j.seq, j.run_at, l.org, l.i, l.share FROM l CROSS JOIN LATERAL (
            SELECT g.seq, g.run_at FROM gnl_jobs g
            WHERE g.org = l.org AND g.type = l.type AND g.state = 'pending' AND NOT g.in_order
              AND g.run_at <= now_ms
            ORDER BY g.run_at, g.seq LIMIT l.share
            FOR UPDATE SKIP LOCKED) j
    ),
    p AS (
        SELECT q.seq, q.org, q.i FROM (
            SELECT u.*, row_number() OVER (PARTITION BY u.i ORDER BY u.run_at, u.seq) AS rank
            FROM (SELECT * FROM a UNION ALL SELECT * FROM b) u) q
        WHERE q.rank <= q.share
    ),
    c AS (
        UPDATE gnl_jobs g SET state = 'running', attempts = g.attempts + 1,
            max_attempts = max_att, lease_token = g.lease_token + 1,
            lease_expires_at = now_ms + ttl, lease_id = lid, updated_at = now_ms,
            in_order = true
        FROM p WHERE g.org = p.org AND g.seq = p.seq
        RETURNING g.seq, g.lease_token, g.org, g.id, g.type, g.payload,
                  g.attempts, g.run_at, p.i
    ),
    ls AS (
        INSERT INTO gnl_leases (id, expires_at, owner, remaining, orgs, seqs)
        SELECT lid, now_ms + ttl, holder, count(*), array_agg(c.org), array_agg(c.seq) FROM c
        HAVING count(*) > 0
    ),
    t AS (
        -- The jobs taken, and the organizations (their places in turn) that got one.
        SELECT ARRAY(SELECT p.seq FROM p) AS taken, ARRAY(SELECT DISTINCT p.i FROM p) AS served
    ),
    h AS (
        -- Per lane, in one pass over the lanes (no join of the lanes with themselves): whether
        -- its organization got a job, the first in_order job of its type still pending, else
        -- the seq after the organization's last job.
        SELECT l.org, l.type, l.i, l.i = ANY (t.served) AS served, f.run_at,
               coalesce(f.seq, (SELECT max(g.seq) + 1 FROM gnl_jobs g WHERE g.org = l.org), l.head)
                   AS head,
               (SELECT g.run_at FROM gnl_jobs g
                WHERE g.org = l.org AND g.type = l.type AND g.state = 'pending' AND NOT g.in_order
                  AND g.seq <> ALL (t.taken)
                ORDER BY g.run_at LIMIT 1) AS later
        FROM l CROSS JOIN t LEFT JOIN LATERAL (
            SELECT g.seq, g.run_at FROM gnl_jobs g
            WHERE g.org = l.org AND g.seq >= l.head AND g.state = 'pending' AND g.in_order
              AND g.type = l.type AND g.seq <> ALL (t.taken)
            ORDER BY g.seq LIMIT 1) f ON true
    ),
    s AS (
        UPDATE gnl_lanes x SET
            served_at = CASE WHEN NOT h.served THEN x.served_at ELSE
                greatest(now_ms * 4096, top + 1) + ahead + h.i END,
            head = h.head,
            next_run_at = least(h.run_at, h.later),
            due = coalesce(least(h.run_at, h.later) <= now_ms, false)
        FROM h
        WHERE x.org = h.org AND x.type = h.type
    )
    SELECT c.seq, c.lease_token, c.org, c.id, c.type, c.payload, c.attempts, c.run_at
    FROM c ORDER BY c.i, c.run_at, c.seq;
    GET DIAGNOSTICS got = ROW_COUNT;
    want := want - got;
    EXIT WHEN want <= 0 OR pass = 2 OR per_org > 0 OR nl < norgs;
    END LOOP;
END
$fn$;

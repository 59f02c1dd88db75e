-- gnl schema 5 (SQLite): a consumer's in-flight span (docs/DECISIONS.md "Events: the in-flight
-- span"). A fetched batch of fresh events is kept on the consumer row instead of a 'wait' mark
-- per event: every event in (cursor_seq, span_hi] with no mark and deliver_at <= span_at was
-- delivered once and not settled yet (span_n of them; 0: no span). A settle that accepts the
-- batch writes no mark; marks stay for the exceptions (retry-waiting, quarantined, accepted
-- behind a held cursor, a dead holder's unsettled events).

ALTER TABLE gnl_consumers ADD COLUMN span_hi INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gnl_consumers ADD COLUMN span_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gnl_consumers ADD COLUMN span_n  INTEGER NOT NULL DEFAULT 0;

-- gnl schema 4 (SQLite): the event log. A counter row per topic (gnl_topics: each emitting
-- transaction bumps it, so seqs are gapless among committed events), the log (gnl_events),
-- per consumer (topic, name) its cursor (gnl_consumers), marks for delivered events past the
-- cursor (gnl_event_marks: 'wait' = delivered, not accepted; 'ok' = accepted; 'dead' =
-- quarantined) and quarantine records (gnl_dead_events).

CREATE TABLE gnl_topics (
    topic    TEXT    NOT NULL PRIMARY KEY,
    last_seq INTEGER NOT NULL                          -- the last seq given out
);

CREATE TABLE gnl_events (
    topic      TEXT    NOT NULL,
    seq        INTEGER NOT NULL,                       -- 1-based, gapless per topic
    id         TEXT    NOT NULL,
    org        TEXT    NOT NULL,                       -- '' = no organization
    payload    TEXT    NOT NULL,                       -- JSON
    deliver_at INTEGER NOT NULL,                       -- not delivered before
    emitted_at INTEGER NOT NULL,
    PRIMARY KEY (topic, seq),
    UNIQUE (topic, id)
);

CREATE TABLE gnl_consumers (
    topic        TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    cursor_seq   INTEGER NOT NULL,                     -- every seq <= cursor is passed
    token        INTEGER NOT NULL,                     -- the fencing token of its lease holder
    heartbeat_at INTEGER,
    PRIMARY KEY (topic, name)
);

CREATE TABLE gnl_event_marks (
    topic    TEXT    NOT NULL,
    name     TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    state    TEXT    NOT NULL,                         -- wait ok dead
    attempts INTEGER NOT NULL,                         -- counted at delivery
    due_at   INTEGER NOT NULL,                         -- wait: delivered again from then
    error    TEXT,
    PRIMARY KEY (topic, name, seq)
);

CREATE TABLE gnl_dead_events (
    topic       TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    attempts    INTEGER NOT NULL,
    error       TEXT    NOT NULL,
    at          INTEGER NOT NULL,                      -- when it was quarantined
    handed_back INTEGER NOT NULL DEFAULT 0,            -- 1: retry_dead_event, not redelivered yet
    PRIMARY KEY (topic, name, seq)
);

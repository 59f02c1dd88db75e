-- gnl schema 5 (Postgres): the event log. A counter row per topic (gnl_topics: each emitting
-- transaction locks and bumps it, so seqs are assigned in commit order and gapless among
-- committed events), the log (gnl_events), per consumer (topic, name) its cursor
-- (gnl_consumers), marks for delivered events past the cursor (gnl_event_marks: 'wait' =
-- delivered, not accepted; 'ok' = accepted; 'dead' = quarantined) and quarantine records
-- (gnl_dead_events).

CREATE TABLE gnl_topics (
    topic    text   NOT NULL COLLATE "C" PRIMARY KEY,
    last_seq bigint NOT NULL
);

CREATE TABLE gnl_events (
    topic      text   NOT NULL COLLATE "C",
    seq        bigint NOT NULL,
    id         text   NOT NULL COLLATE "C",
    org        text   NOT NULL COLLATE "C",
    payload    text   NOT NULL,
    deliver_at bigint NOT NULL,
    emitted_at bigint NOT NULL,
    PRIMARY KEY (topic, seq),
    UNIQUE (topic, id)
);

CREATE TABLE gnl_consumers (
    topic        text   NOT NULL COLLATE "C",
    name         text   NOT NULL COLLATE "C",
    cursor_seq   bigint NOT NULL,
    token        bigint NOT NULL,
    heartbeat_at bigint,
    PRIMARY KEY (topic, name)
);

CREATE TABLE gnl_event_marks (
    topic    text   NOT NULL COLLATE "C",
    name     text   NOT NULL COLLATE "C",
    seq      bigint NOT NULL,
    state    text   NOT NULL,
    attempts bigint NOT NULL,
    due_at   bigint NOT NULL,
    error    text,
    PRIMARY KEY (topic, name, seq)
);

CREATE TABLE gnl_dead_events (
    topic       text    NOT NULL COLLATE "C",
    name        text    NOT NULL COLLATE "C",
    seq         bigint  NOT NULL,
    attempts    bigint  NOT NULL,
    error       text    NOT NULL,
    at          bigint  NOT NULL,
    handed_back boolean NOT NULL DEFAULT false,
    PRIMARY KEY (topic, name, seq)
);

-- gnl schema 4 (MySQL / MariaDB): the event log. A counter row per topic (gnl_topics: each
-- emitting transaction locks and bumps it, so seqs are assigned in commit order and gapless
-- among committed events), the log (gnl_events), per consumer (topic, name) its cursor
-- (gnl_consumers), marks for delivered events past the cursor (gnl_event_marks: 'wait' =
-- delivered, not accepted; 'ok' = accepted; 'dead' = quarantined) and quarantine records
-- (gnl_dead_events). DDL commits as it goes: every statement is idempotent.
-- Topics and consumer names are at most 200 characters (800 bytes, a key); an event id may be
-- 1,000 characters, so its uniqueness is kept on (topic, SHA-256 of id).

CREATE TABLE IF NOT EXISTS gnl_topics (
    topic    VARBINARY(800) NOT NULL,
    last_seq BIGINT NOT NULL,
    PRIMARY KEY (topic)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS gnl_events (
    topic      VARBINARY(800) NOT NULL,
    seq        BIGINT NOT NULL,
    id         VARBINARY(4000) NOT NULL,
    id_key     BINARY(32) AS (UNHEX(SHA2(id, 256))) STORED,
    org        VARBINARY(800) NOT NULL,
    payload    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    deliver_at BIGINT NOT NULL,
    emitted_at BIGINT NOT NULL,
    PRIMARY KEY (topic, seq),
    UNIQUE KEY gnl_events_id (topic, id_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS gnl_consumers (
    topic        VARBINARY(800) NOT NULL,
    name         VARBINARY(800) NOT NULL,
    cursor_seq   BIGINT NOT NULL,
    token        BIGINT NOT NULL,
    heartbeat_at BIGINT,
    PRIMARY KEY (topic, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS gnl_event_marks (
    topic    VARBINARY(800) NOT NULL,
    name     VARBINARY(800) NOT NULL,
    seq      BIGINT NOT NULL,
    state    VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts BIGINT NOT NULL,
    due_at   BIGINT NOT NULL,
    error    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    PRIMARY KEY (topic, name, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS gnl_dead_events (
    topic       VARBINARY(800) NOT NULL,
    name        VARBINARY(800) NOT NULL,
    seq         BIGINT NOT NULL,
    attempts    BIGINT NOT NULL,
    error       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    at          BIGINT NOT NULL,
    handed_back TINYINT NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, name, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

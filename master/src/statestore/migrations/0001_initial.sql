-- The state store's first schema (docs/internals.md#the-state-store).
-- Times are unix seconds (commands) or milliseconds (nodes), taken from
-- the database; generation ids are lowercase hex; lists are JSON arrays.

-- One row per environment: the rollout commands' current state.
CREATE TABLE rollout_commands (
    environment TEXT PRIMARY KEY,
    clock BIGINT NOT NULL,
    origin TEXT NOT NULL,
    halted_at BIGINT,
    halt_reason TEXT,
    promoted TEXT,
    withdrawn TEXT NOT NULL DEFAULT '[]',
    waived TEXT,
    promoted_before TEXT NOT NULL DEFAULT '[]'
);

-- One row per command (and per automatic halt, and per import).
CREATE TABLE rollout_history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    environment TEXT NOT NULL,
    action TEXT NOT NULL,
    issued_by TEXT NOT NULL,
    at BIGINT NOT NULL,
    halted_at BIGINT,
    halt_reason TEXT,
    promoted TEXT,
    withdrawn TEXT NOT NULL DEFAULT '[]',
    waived TEXT
);
CREATE INDEX rollout_history_env ON rollout_history (environment, id);

-- Generations a master has kept, per environment (oldest first by seq).
CREATE TABLE rollout_seen (
    environment TEXT NOT NULL,
    generation TEXT NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (environment, generation)
);

-- The inventory: the last thing heard from each node.
CREATE TABLE node_reports (
    certname TEXT PRIMARY KEY,
    environment TEXT NOT NULL,
    generation TEXT,
    loads_ok BIGINT NOT NULL,
    loads_failed BIGINT NOT NULL,
    failed_plugins TEXT NOT NULL DEFAULT '[]',
    last_seen_ms BIGINT NOT NULL,
    source TEXT NOT NULL
);
CREATE INDEX node_reports_generation ON node_reports (environment, generation);
CREATE INDEX node_reports_last_seen ON node_reports (last_seen_ms);

-- Which replica served which generation to which node, and when.
CREATE TABLE served (
    certname TEXT NOT NULL,
    environment TEXT NOT NULL,
    generation TEXT NOT NULL,
    replica TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    PRIMARY KEY (certname, environment, generation)
);

-- Small facts about the store itself (this master's origin name).
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

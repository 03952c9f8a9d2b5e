-- Control-plane schema (SQLite). Integers are BIGINT (64-bit), booleans 0/1, maps and lists JSON text,
-- enums their stable text form (ate_core::ActorState::as_str and friends).

CREATE TABLE atespaces (
    name        TEXT PRIMARY KEY NOT NULL,
    created_ms  BIGINT NOT NULL
);

CREATE TABLE templates (
    namespace   TEXT NOT NULL REFERENCES atespaces(name),
    name        TEXT NOT NULL,
    spec        TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);

CREATE TABLE actors (
    atespace        TEXT NOT NULL REFERENCES atespaces(name),
    name            TEXT NOT NULL,
    uid             TEXT NOT NULL,
    template        TEXT NOT NULL,
    state           TEXT NOT NULL,
    worker_selector TEXT NOT NULL,
    worker_id       TEXT,
    epoch           BIGINT NOT NULL,
    generation      BIGINT NOT NULL,
    attached_node   TEXT,
    last_error      TEXT NOT NULL,
    created_ms      BIGINT NOT NULL,
    updated_ms      BIGINT NOT NULL,
    PRIMARY KEY (atespace, name)
);
CREATE INDEX actors_template ON actors (template);
CREATE INDEX actors_worker ON actors (worker_id);

CREATE TABLE snapshots (
    atespace        TEXT NOT NULL,
    name            TEXT NOT NULL,
    generation      BIGINT NOT NULL,
    uuid            TEXT NOT NULL,
    fidelity        TEXT NOT NULL,
    template        TEXT NOT NULL,
    sandbox_class   TEXT NOT NULL,
    node            TEXT NOT NULL,
    boot_id         TEXT NOT NULL,
    local_path      TEXT NOT NULL,
    durable_uri     TEXT NOT NULL,
    durable_status  TEXT,
    size_bytes      BIGINT NOT NULL,
    checksum        TEXT NOT NULL,
    reason          TEXT NOT NULL,
    created_ms      BIGINT NOT NULL,
    PRIMARY KEY (atespace, name, generation),
    FOREIGN KEY (atespace, name) REFERENCES actors (atespace, name) ON DELETE CASCADE
);
CREATE INDEX snapshots_uuid ON snapshots (uuid);

-- A tag holds a copy of the tagged snapshot row (columns prefixed s_), so it outlives the actor.
CREATE TABLE tags (
    atespace          TEXT NOT NULL REFERENCES atespaces(name),
    name              TEXT NOT NULL,
    created_ms        BIGINT NOT NULL,
    s_atespace        TEXT NOT NULL,
    s_name            TEXT NOT NULL,
    s_generation      BIGINT NOT NULL,
    s_uuid            TEXT NOT NULL,
    s_fidelity        TEXT NOT NULL,
    s_template        TEXT NOT NULL,
    s_sandbox_class   TEXT NOT NULL,
    s_node            TEXT NOT NULL,
    s_boot_id         TEXT NOT NULL,
    s_local_path      TEXT NOT NULL,
    s_durable_uri     TEXT NOT NULL,
    s_durable_status  TEXT,
    s_size_bytes      BIGINT NOT NULL,
    s_checksum        TEXT NOT NULL,
    s_reason          TEXT NOT NULL,
    s_created_ms      BIGINT NOT NULL,
    PRIMARY KEY (atespace, name)
);
CREATE INDEX tags_uuid ON tags (s_uuid);

CREATE TABLE workers (
    id                  TEXT PRIMARY KEY NOT NULL,
    node                TEXT NOT NULL,
    addresses           TEXT NOT NULL,
    identity            TEXT NOT NULL,
    labels              TEXT NOT NULL,
    sandbox_class       TEXT NOT NULL,
    can_restore_memory  BOOLEAN NOT NULL,
    cpu_millis          BIGINT NOT NULL,
    memory_bytes        BIGINT NOT NULL,
    slots               BIGINT NOT NULL,
    epoch               BIGINT NOT NULL,
    status              TEXT NOT NULL,
    last_heartbeat_ms   BIGINT NOT NULL,
    node_address        TEXT NOT NULL,
    boot_id             TEXT NOT NULL
);

-- One row per bound actor; a worker's used capacity is the SUM/COUNT over its rows.
CREATE TABLE actor_assignments (
    atespace      TEXT NOT NULL,
    name          TEXT NOT NULL,
    worker_id     TEXT NOT NULL REFERENCES workers(id),
    cpu_millis    BIGINT NOT NULL,
    memory_bytes  BIGINT NOT NULL,
    PRIMARY KEY (atespace, name),
    FOREIGN KEY (atespace, name) REFERENCES actors (atespace, name) ON DELETE CASCADE
);
CREATE INDEX actor_assignments_worker ON actor_assignments (worker_id);

CREATE TABLE leases (
    key         TEXT PRIMARY KEY NOT NULL,
    holder      TEXT NOT NULL,
    expires_ms  BIGINT NOT NULL
);

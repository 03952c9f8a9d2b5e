-- Join tokens: a machine presents one to get its node and worker certificates from the api's CA.
-- Only a SHA-256 of the secret is kept; `used_by` is a JSON array of the nodes that joined with it.
CREATE TABLE join_tokens (
    id            TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    description   TEXT NOT NULL DEFAULT '',
    created_ms    BIGINT NOT NULL,
    expires_ms    BIGINT NOT NULL,
    used_by       TEXT NOT NULL DEFAULT '[]'
);

-- Where an actor's newest generation is still kept frozen in place (a placement preference every
-- api replica sees; a stale row only costs a preference, the worker checks the generation).
CREATE TABLE frozen_copies (
    atespace   TEXT NOT NULL,
    name       TEXT NOT NULL,
    worker_id  TEXT NOT NULL,
    generation BIGINT NOT NULL,
    PRIMARY KEY (atespace, name)
);

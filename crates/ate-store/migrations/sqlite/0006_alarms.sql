-- Actors' alarms, one per actor: at next_attempt_ms the api replicas' delivery loop claims the
-- row (moving next_attempt_ms to the end of a lease, so no other replica delivers it meanwhile)
-- and POSTs to the actor's path, retried with backoff until a 2xx or it gives up (failed, kept
-- until the actor sets another alarm or deletes it). `seq` tells a delivery's own alarm from one
-- set again meanwhile; it is taken from actors.alarm_seq, which outlives a deleted alarm, so a
-- delete then set never reuses a seq a delivery in flight may hold.
ALTER TABLE actors ADD COLUMN alarm_seq BIGINT NOT NULL DEFAULT 0;

CREATE TABLE alarms (
    atespace         TEXT NOT NULL,
    name             TEXT NOT NULL,
    seq              BIGINT NOT NULL,
    due_ms           BIGINT NOT NULL,
    path             TEXT NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_ms  BIGINT NOT NULL,
    last_error       TEXT NOT NULL DEFAULT '',
    failed           BOOLEAN NOT NULL DEFAULT FALSE,
    set_ms           BIGINT NOT NULL,
    PRIMARY KEY (atespace, name),
    FOREIGN KEY (atespace, name) REFERENCES actors (atespace, name) ON DELETE CASCADE
);
-- The claim: not failed and due, oldest first.
CREATE INDEX alarms_due ON alarms (failed, next_attempt_ms);

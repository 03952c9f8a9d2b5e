-- Actor events (issue 33): one row per change of an actor's state or worker, written in the
-- change's own transaction; served by `ate get events` and the watches, deleted after the api's
-- --event-retention. from_state / to_state / worker_id are '' when there is none.
CREATE TABLE actor_events (
    id BIGSERIAL PRIMARY KEY,
    time_ms BIGINT NOT NULL,
    atespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL,
    kind TEXT NOT NULL,
    reason TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    generation BIGINT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX actor_events_by_actor ON actor_events (atespace, name, id);
CREATE INDEX actor_events_by_time ON actor_events (time_ms);

-- Fencing token of the actor's current (or last) activation: taken, strictly increasing, in every
-- bind that places the actor on a worker. The router sends it to atunnel with each request, and a
-- worker serves only the copy that holds it.
ALTER TABLE actors ADD COLUMN activation BIGINT NOT NULL DEFAULT 0;

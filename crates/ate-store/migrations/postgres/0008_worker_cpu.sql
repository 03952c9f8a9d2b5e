-- CPU overcommit and real use (issue 38). workers.cpu_millis stays what admission books
-- templates' CPU against (the machine's CPU × the worker's --cpu-overcommit); cpu_physical_millis
-- is the machine's CPU before overcommit (0 for a worker registered before: the same as
-- cpu_millis) and cpu_usage_millis what its actors really used lately, written by heartbeats;
-- placement prefers the least busy worker by it.
ALTER TABLE workers ADD COLUMN cpu_physical_millis BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN cpu_usage_millis BIGINT NOT NULL DEFAULT 0;

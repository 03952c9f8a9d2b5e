-- Atespace quotas (issue 34): the most an atespace's actors may hold at once, counted over
-- their worker assignments (as capacity admission counts them) and checked in the same bind
-- transaction. 0: no limit.
ALTER TABLE atespaces ADD COLUMN quota_running_actors BIGINT NOT NULL DEFAULT 0;
ALTER TABLE atespaces ADD COLUMN quota_cpu_millis BIGINT NOT NULL DEFAULT 0;
ALTER TABLE atespaces ADD COLUMN quota_memory_bytes BIGINT NOT NULL DEFAULT 0;

-- Restore capabilities (ate_core::capability), JSON arrays of `<kind>:<value>` strings. A worker's
-- are what it can restore (`memory:criu`, `userns:off`, …; '[]' for a worker registered before:
-- derived from can_restore_memory); a generation's are what restoring it needs ('[]' for one
-- written before: a MEMORY generation then needs `memory:criu`). The scheduler places an actor
-- only on a worker that offers everything its newest generation needs. Tags hold a copy of the
-- snapshot row, so they carry the column too.
ALTER TABLE workers ADD COLUMN capabilities TEXT NOT NULL DEFAULT '[]';
ALTER TABLE snapshots ADD COLUMN requires TEXT NOT NULL DEFAULT '[]';
ALTER TABLE tags ADD COLUMN s_requires TEXT NOT NULL DEFAULT '[]';

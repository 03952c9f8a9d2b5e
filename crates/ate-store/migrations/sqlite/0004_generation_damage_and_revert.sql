-- A copy of a generation found damaged when a restore read it (its content does not match the
-- manifest): why, per copy ('' = never found damaged). A resume uses only copies not found
-- damaged; tags hold a copy of the row, so they carry the same columns.
ALTER TABLE snapshots ADD COLUMN local_damage TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN durable_damage TEXT NOT NULL DEFAULT '';
ALTER TABLE tags ADD COLUMN s_local_damage TEXT NOT NULL DEFAULT '';
ALTER TABLE tags ADD COLUMN s_durable_damage TEXT NOT NULL DEFAULT '';
-- A revert to an older generation skips every newer one: kept, never chosen by a resume (until a
-- revert to it or to a newer one). Not copied into tags.
ALTER TABLE snapshots ADD COLUMN skipped BOOLEAN NOT NULL DEFAULT FALSE;

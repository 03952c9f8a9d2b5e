-- An atespace's callers allow list: the atespaces whose actors may call its actors, joined with
-- ',' (atespace names contain no comma), '*' for every atespace; '' for none besides its own.
ALTER TABLE atespaces ADD COLUMN callers_allow TEXT NOT NULL DEFAULT '';

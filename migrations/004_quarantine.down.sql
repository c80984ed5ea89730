ALTER TABLE file_intake DROP COLUMN release_override, DROP COLUMN replay_of;
DROP TABLE intake_audit;
DROP TABLE intake_quarantine;

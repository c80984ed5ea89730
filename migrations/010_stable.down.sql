DROP TABLE intake_record_claim;
DELETE FROM file_intake WHERE state = 'put_back';
ALTER TABLE file_intake DROP CONSTRAINT file_intake_state_check;
ALTER TABLE file_intake ADD CONSTRAINT file_intake_state_check CHECK (state IN (
    'claimed', 'spooled', 'applying', 'applied', 'archived', 'duplicate',
    'quarantined', 'failed_terminal', 'outcome_unknown', 'discarded'));
ALTER TABLE file_intake DROP COLUMN listed_mtime;
DROP TABLE intake_ready_seen;

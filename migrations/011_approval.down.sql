-- Refuses while a file waits for approval: an older intake would not know
-- the state (approve or reject those files first).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM file_intake WHERE state = 'awaiting_approval') THEN
        RAISE EXCEPTION 'files are awaiting approval: approve or reject them before migrating down';
    END IF;
END $$;
DROP INDEX file_intake_live_path;
CREATE UNIQUE INDEX file_intake_live_path ON file_intake (partner_id, claimed_path)
    WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown');
ALTER TABLE file_intake DROP CONSTRAINT file_intake_state_check;
ALTER TABLE file_intake ADD CONSTRAINT file_intake_state_check CHECK (state IN (
    'claimed', 'spooled', 'applying', 'applied', 'archived', 'duplicate',
    'quarantined', 'failed_terminal', 'outcome_unknown', 'discarded', 'put_back'));
ALTER TABLE file_intake DROP COLUMN IF EXISTS approved_plan_hash, DROP COLUMN IF EXISTS plan_decision,
    DROP COLUMN IF EXISTS planned_at, DROP COLUMN IF EXISTS plan_sample, DROP COLUMN IF EXISTS plan_counts,
    DROP COLUMN IF EXISTS plan_hash;

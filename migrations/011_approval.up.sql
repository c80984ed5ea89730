-- Plans and approval (issue 14 item 3). A feed with an approval policy has
-- each file planned against its target before apply: the counts of what
-- it would do (plan_counts), a hash over the file's sha256, the feed's
-- mapping and those counts (plan_hash), and a sample of the changes by key
-- and column for ops (plan_sample: values, shown only on an ops terminal;
-- cleared when the file is decided). A file that needs a human waits in
-- awaiting_approval: it holds no lease (not a live state: no heartbeat, no
-- takeover), still owns its claimed path in processing/, and blocks no
-- other file. plan_decision is the ops decision the next run of the file
-- acts on (approved: apply if a fresh plan still has approved_plan_hash;
-- rejected: quarantine with reason plan_rejected).
ALTER TABLE file_intake ADD COLUMN plan_hash text,
    ADD COLUMN plan_counts jsonb,
    ADD COLUMN plan_sample jsonb,
    ADD COLUMN planned_at timestamptz,
    ADD COLUMN plan_decision text CHECK (plan_decision IN ('approved', 'rejected')),
    ADD COLUMN approved_plan_hash text;

ALTER TABLE file_intake DROP CONSTRAINT file_intake_state_check;
ALTER TABLE file_intake ADD CONSTRAINT file_intake_state_check CHECK (state IN (
    'claimed', 'spooled', 'applying', 'applied', 'archived', 'duplicate',
    'quarantined', 'failed_terminal', 'outcome_unknown', 'discarded', 'put_back',
    'awaiting_approval'));

-- A file waiting for approval still owns its place in processing/: no
-- adoption or second row may take it.
DROP INDEX file_intake_live_path;
CREATE UNIQUE INDEX file_intake_live_path ON file_intake (partner_id, claimed_path)
    WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown', 'awaiting_approval');

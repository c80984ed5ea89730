ALTER TABLE intake_quarantine DROP COLUMN IF EXISTS batch_owner;

ALTER TABLE intake_worker DROP COLUMN partners, DROP COLUMN drained_at;

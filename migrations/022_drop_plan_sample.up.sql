-- A waiting plan's changes are read from intake_plan_change (migration
-- 021) by the console and `intake plan show` alike; the plan's sample of
-- its first changes (migration 011) is no longer written nor read.
ALTER TABLE file_intake DROP COLUMN plan_sample;

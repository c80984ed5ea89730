DROP INDEX IF EXISTS file_intake_awaiting;
DROP INDEX IF EXISTS intake_quarantine_open_held;
DROP TABLE IF EXISTS intake_plan_change_column;
DROP TABLE IF EXISTS intake_plan_change;

DROP TABLE IF EXISTS intake_plan_change_column;
DROP TABLE IF EXISTS intake_plan_change;

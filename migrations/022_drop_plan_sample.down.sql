ALTER TABLE file_intake ADD COLUMN plan_sample jsonb;

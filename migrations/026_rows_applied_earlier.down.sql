ALTER TABLE file_intake DROP COLUMN IF EXISTS rows_applied_earlier;

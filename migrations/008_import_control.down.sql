DROP TABLE IF EXISTS intake_snapshot_key;
ALTER TABLE file_intake DROP COLUMN IF EXISTS feed_sha256, DROP COLUMN IF EXISTS rows_deleted;

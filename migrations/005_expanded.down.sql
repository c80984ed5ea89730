ALTER TABLE file_intake DROP COLUMN data_sha256, DROP COLUMN data_size;

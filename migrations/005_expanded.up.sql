-- A compressed file's expanded bytes: hashed and spooled like any file; the
-- batch identity and every row come from them, the archive keeps the
-- original bytes (content_sha256).
ALTER TABLE file_intake ADD COLUMN data_sha256 text, ADD COLUMN data_size bigint;

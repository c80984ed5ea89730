-- Import control (issue 14).
-- rows_deleted: rows a snapshot file deleted (or marked) because its key
-- was absent from the file; they are not rows of the file, so the totals
-- (applied + unchanged + rejected + conflict = rows_total) stay as they are.
-- feed_sha256: the hash of the feed configuration that planned the file;
-- every chunk is applied under that mapping or not at all.
ALTER TABLE file_intake ADD COLUMN rows_deleted bigint NOT NULL DEFAULT 0,
    ADD COLUMN feed_sha256 text;

-- The keys a snapshot file has applied so far, written in each chunk's
-- transaction; the file's last transaction deletes the target rows whose
-- key is not here, then these rows.
CREATE TABLE intake_snapshot_key (
    intake_id bigint NOT NULL,
    key       text   NOT NULL,
    PRIMARY KEY (intake_id, key)
);

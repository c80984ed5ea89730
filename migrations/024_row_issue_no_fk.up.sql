-- intake_row_issue keeps no foreign key to file_intake: its rows are
-- written only in a transaction that writes the file's row under its
-- fencing token (the plan, a chunk, a replay's hold-back), and file_intake
-- rows are never deleted. The key check cost one look-up per row (about
-- 3-5 µs; 0.3-0.5 s for a file with 100k rejected rows), on the cores the
-- file's COPY shares. intake_snapshot_key has none for the same reason.
ALTER TABLE intake_row_issue DROP CONSTRAINT intake_row_issue_intake_id_fkey;

-- Poison files (issue 12): a file whose run fails is retried on its own
-- backoff, never ahead of the partner's other files, and within a budget
-- of attempts and time; past it the file fails for good. last_error holds
-- the error reduced to codes (SQLSTATE, constraint, column), never values.
ALTER TABLE file_intake ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN first_failed_at timestamptz,
    ADD COLUMN next_attempt_at timestamptz,
    ADD COLUMN last_error text;

-- A row the target refused (reason target_refused) says why in codes:
-- the SQLSTATE and, where PostgreSQL names them, constraint and column.
ALTER TABLE intake_row_issue ADD COLUMN detail text;

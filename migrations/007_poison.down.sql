ALTER TABLE intake_row_issue DROP COLUMN detail;
ALTER TABLE file_intake DROP COLUMN attempts, DROP COLUMN first_failed_at,
    DROP COLUMN next_attempt_at, DROP COLUMN last_error;

ALTER TABLE file_intake DROP COLUMN rows_delete_kept;
DROP INDEX file_intake_one_live_replay;
DROP INDEX intake_audit_request;
ALTER TABLE intake_audit DROP COLUMN request_id;

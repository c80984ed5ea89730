DROP FUNCTION intake_purge_audit(text, timestamptz);
DROP TRIGGER intake_audit_no_truncate ON intake_audit;
DROP TRIGGER intake_audit_guard ON intake_audit;
DROP FUNCTION intake_audit_guard();
ALTER TABLE intake_audit DROP COLUMN db_user;

-- receipt_pending: the latest decision on the file (a discard) is not yet
-- published to the partner. receipt_path still names the receipt the
-- earlier decision published (the hold's), wherever the reports dir was
-- then, and the publication replaces it. A discard recorded before this
-- column cleared receipt_path instead.
ALTER TABLE file_intake ADD COLUMN receipt_pending boolean NOT NULL DEFAULT false;
UPDATE file_intake SET receipt_pending = true WHERE state = 'discarded' AND receipt_path IS NULL;
-- The roles that may write receipt_path (the ops role, by grants.sql's
-- column list) may write receipt_pending: a discard writes both. A
-- column-list grant does not reach a column added after it.
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT x.grantee::regrole
        FROM pg_catalog.pg_attribute a, pg_catalog.aclexplode(a.attacl) x
        WHERE a.attrelid = 'file_intake'::regclass AND a.attname = 'receipt_path'
          AND x.privilege_type = 'UPDATE' AND x.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT UPDATE (receipt_pending) ON file_intake TO %s', r);
    END LOOP;
END
$$;

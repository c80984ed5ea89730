-- rows_applied_earlier: the rows a file's runs applied before ops
-- released it. A release starts the file over (its counts cleared, its
-- chunks apply again and count what an earlier run wrote as unchanged);
-- should it be held or discarded again before a chunk applies, what its
-- partner reads still says those rows stand.
ALTER TABLE file_intake ADD COLUMN rows_applied_earlier bigint NOT NULL DEFAULT 0;
-- The roles that may write rows_applied (the ops role, by grants.sql's
-- column list: a release clears it) may write rows_applied_earlier: a
-- release writes both. A column-list grant does not reach a column added
-- after it.
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT x.grantee::regrole
        FROM pg_catalog.pg_attribute a, pg_catalog.aclexplode(a.attacl) x
        WHERE a.attrelid = 'file_intake'::regclass AND a.attname = 'rows_applied'
          AND x.privilege_type = 'UPDATE' AND x.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT UPDATE (rows_applied_earlier) ON file_intake TO %s', r);
    END LOOP;
END
$$;

-- intake_claim_id: the intake id a claim allocated for a file, kept from
-- before the claim's RENAME until its row is recorded. Ids decide which
-- of two files writing one key wins, so a file claimed and renamed whose
-- row was then not recorded (the claimer crashed, or its section failed)
-- is adopted under the id its claim allocated, by whichever process
-- adopts it: its place among the partner's claims, not a fresh id above
-- the files claimed after it. Keyed by the path the file was renamed to;
-- a move of such a file into another worker's processing dir copies it
-- first. A row left by a claim that never renamed its file (a crash
-- between the two) names a path no file reached; the next claim or move
-- to that path replaces it, and retention deletes it.
CREATE TABLE intake_claim_id (
    partner_id   text        NOT NULL,
    claimed_path text        NOT NULL,
    intake_id    bigint      NOT NULL,
    reserved_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, claimed_path)
);
CREATE INDEX intake_claim_id_age ON intake_claim_id (partner_id, reserved_at);
-- The roles grants.sql set up before this table get its rights here (a
-- table's grants do not reach a table made after them): the daemon's
-- role (INSERT on file_intake, the table's own grant: the ops role's is
-- a column list) keeps and drops ids, and the purge role (EXECUTE on
-- intake_purge_audit) deletes the old ones; the ops role has no use for
-- them.
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT x.grantee::regrole
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) x
        WHERE c.oid = 'file_intake'::regclass AND x.privilege_type = 'INSERT'
          AND x.grantee <> 0 AND x.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON intake_claim_id TO %s', r);
    END LOOP;
    FOR r IN SELECT DISTINCT x.grantee::regrole
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) x
        WHERE p.oid = 'intake_purge_audit(text, timestamptz)'::regprocedure AND x.privilege_type = 'EXECUTE'
          AND x.grantee <> 0 AND x.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, DELETE ON intake_claim_id TO %s', r);
    END LOOP;
END
$$;

-- The audit is append-only and records who wrote each row as the
-- database knows them. db_user is the session's login role
-- (session_user: SET ROLE does not change it), written by the guard
-- below whatever an INSERT gives; rows recorded before this migration
-- have none (NULL), rather than the name of the role that migrated.
ALTER TABLE intake_audit ADD COLUMN db_user text;
ALTER TABLE intake_audit ALTER COLUMN db_user SET DEFAULT session_user;

-- The guard of intake_audit, a row trigger before INSERT, UPDATE and
-- DELETE and a statement trigger before TRUNCATE:
--  * INSERT: db_user is session_user; at is the transaction's time unless
--    the table's owner inserts (a restore, a test of retention);
--  * UPDATE: refused, for every role (the owner included: rewriting a
--    recorded action needs the trigger disabled, a deliberate act);
--  * DELETE and TRUNCATE: refused unless the current role is the table's
--    owner, which, for the roles intake grants, is only the case inside
--    intake_purge_audit (SECURITY DEFINER, owned by the owner): retention
--    is the one way audit rows go.
-- Grants alone would not do: a role granted UPDATE or DELETE on the
-- table keeps them until they are revoked; the guard refuses whatever was
-- granted.
CREATE FUNCTION intake_audit_guard() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog AS $$
DECLARE
    tbl_owner name := (SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID);
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.db_user := session_user;
        IF current_user <> tbl_owner THEN
            NEW.at := pg_catalog.now();
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP IN ('DELETE', 'TRUNCATE') AND current_user = tbl_owner THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'intake_audit is append-only: % refused for role % (retention deletes old rows through intake_purge_audit)', TG_OP, session_user
        USING ERRCODE = 'insufficient_privilege';
END
$$;
REVOKE EXECUTE ON FUNCTION intake_audit_guard() FROM PUBLIC;

CREATE TRIGGER intake_audit_guard BEFORE INSERT OR UPDATE OR DELETE ON intake_audit
    FOR EACH ROW EXECUTE FUNCTION intake_audit_guard();
CREATE TRIGGER intake_audit_no_truncate BEFORE TRUNCATE ON intake_audit
    FOR EACH STATEMENT EXECUTE FUNCTION intake_audit_guard();

-- Retention of the audit: the partner's rows recorded before cutoff,
-- deleted as the table's owner. EXECUTE is granted to the purge role only
-- (`intake grants`); it returns how many rows went. search_path is the
-- migration's (the ledger's schema), fixed at creation: a caller's path
-- cannot point the DELETE elsewhere (a temporary table of the caller's
-- named intake_audit would only take the DELETE away from the real one,
-- in the caller's own session).
CREATE FUNCTION intake_purge_audit(partner text, cutoff timestamptz) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM intake_audit WHERE partner_id = partner AND at < cutoff;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
REVOKE EXECUTE ON FUNCTION intake_purge_audit(text, timestamptz) FROM PUBLIC;

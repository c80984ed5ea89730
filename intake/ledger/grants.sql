-- The rights of intake's three kinds of database role, each only what its
-- job runs (the statements in intake/ledger and intake/target):
--
--   daemon_role  `intake run` (poll, apply, reconcile, expected deliveries,
--                webhooks, its scheduled purge of spool and row issues),
--                and `intake replay` applied by the command itself;
--   ops_role     `intake status`, `audit`, `quarantine`, `plan show`,
--                `approve`, `reject`, `replay` (recorded, handed to a
--                daemon), `expect ack`, `notify`: reads the ledger and
--                makes decisions; best a NOLOGIN group granted to each
--                person (GRANT intake_ops TO alice), so the audit's
--                db_user names the person;
--   purge_role   `intake purge`: retention, the audit's included (no
--                other role may delete audit rows: migration 016).
--
-- The roles must exist (CREATE ROLE … LOGIN PASSWORD …, see
-- docs/install.md); apply this as the owner of intake's tables after
-- `intake migrate`. `intake grants` prints it with the names filled in
-- (and the target tables of a config); with psql:
--   psql -v database=intake -v schema=intake -v daemon_role=intake \
--        -v ops_role=intake_ops -v purge_role=intake_purge \
--        -v four_eyes=false -f grants.sql
-- Applying it again is harmless. It grants, and revokes nothing: a role
-- set up by an earlier guide keeps what it had until it is revoked
-- (REVOKE ALL ON ALL TABLES IN SCHEMA … FROM …, then apply this).
--
-- An ops decision is a set of UPDATEs the ops role runs itself, so it
-- holds UPDATE on the columns of file_intake the decisions write (state,
-- lease, fencing token, plan decision, …). It cannot rewrite what a file
-- is (partner, feed, name, batch, hashes, sizes, row total, replay
-- origin), insert a file other than a replay handed to a daemon, delete
-- files, or change or delete an audit row; and
-- every write it makes is audited first: row-level security (the end of
-- this file) lets it change a row only in a transaction that has already
-- appended an audit row as the same login naming that row's file (or, for
-- a delivery window or a webhook delivery, the partner or the request). A
-- plain UPDATE file_intake outside the commands changes nothing.

GRANT CONNECT, TEMPORARY ON DATABASE :"database" TO :"daemon_role";
GRANT CONNECT ON DATABASE :"database" TO :"ops_role", :"purge_role";
GRANT USAGE ON SCHEMA :"schema" TO :"daemon_role", :"ops_role", :"purge_role";

-- The schema check every start, /readyz and the ops commands run.
GRANT SELECT ON :"schema".intake_schema_migrations TO :"daemon_role", :"ops_role", :"purge_role";

-- daemon_role. Upserts (INSERT … ON CONFLICT DO UPDATE) need UPDATE;
-- deliveries go with their event through the foreign key's cascade,
-- which runs as the owner. The identity columns need no sequence grant
-- for an INSERT, but a claim takes its intake id ahead of its row
-- (nextval, under the partner's claim lock).
GRANT USAGE ON SEQUENCE :"schema".file_intake_intake_id_seq TO :"daemon_role";
GRANT SELECT, INSERT, UPDATE ON
    :"schema".file_intake, :"schema".intake_worker, :"schema".intake_partner_poll,
    :"schema".intake_reconcile_run, :"schema".intake_quarantine, :"schema".intake_site_profile,
    :"schema".intake_feed_expect, :"schema".intake_feed_late, :"schema".intake_outbox_delivery
    TO :"daemon_role";
-- the chunk ledger: written with each chunk, never changed
GRANT SELECT, INSERT ON :"schema".intake_chunk TO :"daemon_role";
-- rows issues of a chunk's retry, the reconciler's findings replaced each
-- run, a snapshot's keys once applied, a batch binding given back,
-- readiness and claim records forgotten, delivered events; the ids of
-- claims kept until their rows are recorded (intake_claim_id)
GRANT SELECT, INSERT, DELETE ON
    :"schema".intake_row_issue, :"schema".intake_finding, :"schema".intake_snapshot_key,
    :"schema".intake_batch
    TO :"daemon_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON
    :"schema".intake_outbox, :"schema".intake_ready_seen, :"schema".intake_record_claim,
    :"schema".intake_claim_id
    TO :"daemon_role";
-- a plan's changes, replaced by a re-plan
GRANT SELECT, INSERT, DELETE ON :"schema".intake_plan_change, :"schema".intake_plan_change_column TO :"daemon_role";
-- the audit: appended to (a plan awaiting approval, a replay), never read
-- back, never changed
GRANT INSERT ON :"schema".intake_audit TO :"daemon_role";

-- ops_role: reads everything `intake status`, `audit`, `quarantine list`,
-- `plan show` and `notify dead` show.
GRANT SELECT ON
    :"schema".file_intake, :"schema".intake_batch, :"schema".intake_chunk, :"schema".intake_row_issue,
    :"schema".intake_worker, :"schema".intake_partner_poll, :"schema".intake_finding,
    :"schema".intake_reconcile_run, :"schema".intake_quarantine, :"schema".intake_audit,
    :"schema".intake_snapshot_key, :"schema".intake_site_profile, :"schema".intake_feed_expect,
    :"schema".intake_feed_late, :"schema".intake_outbox, :"schema".intake_outbox_delivery,
    :"schema".intake_ready_seen, :"schema".intake_record_claim, :"schema".intake_plan_change,
    :"schema".intake_plan_change_column
    TO :"ops_role";
-- decisions: a release sends a held file back with a new fencing token
-- and expired lease, its counts and plan cleared; a discard closes it and
-- records its receipt; approve and reject record the plan decision
GRANT UPDATE (state, reason, release_override, fencing_token, worker_id, lease_until, claimed_path,
        manifest_name, archive_path, receipt_path, receipt_pending, rejects_path, finished_at, updated_at,
        rows_applied, rows_unchanged, rows_rejected, rows_conflict, rows_deleted, rows_delete_kept, rows_applied_earlier, chunks_done, feed_sha256,
        plan_hash, plan_counts, planned_at, plan_decision, approved_plan_hash,
        attempts, first_failed_at, next_attempt_at, last_error)
    ON :"schema".file_intake TO :"ops_role";
GRANT UPDATE (state, decided_at, decided_by, decision) ON :"schema".intake_quarantine TO :"ops_role";
-- a batch conflict released with the new bytes winning
GRANT UPDATE (intake_id, content_sha256, bound_at) ON :"schema".intake_batch TO :"ops_role";
-- a released file starts over: its row issues, chunks and snapshot keys go
GRANT DELETE ON :"schema".intake_row_issue, :"schema".intake_chunk, :"schema".intake_snapshot_key TO :"ops_role";
-- a decided plan's changes go
GRANT DELETE ON :"schema".intake_plan_change, :"schema".intake_plan_change_column TO :"ops_role";
-- a late delivery window acknowledged
GRANT UPDATE (acked_at, acked_by, ack_reason) ON :"schema".intake_feed_late TO :"ops_role";
-- a dead webhook delivery sent again
GRANT UPDATE (state, dead_at, budget_from, next_attempt_at, lease_until, leased_by)
    ON :"schema".intake_outbox_delivery TO :"ops_role";
GRANT INSERT ON :"schema".intake_audit TO :"ops_role";
-- a replay requested (`intake replay` as the ops role): recorded as a new
-- spooled row whose lease has already ended, for the next reconcile run
-- to take over and a daemon to apply; its id is taken ahead, for the
-- audit row that must come first
GRANT USAGE ON SEQUENCE :"schema".file_intake_intake_id_seq TO :"ops_role";
GRANT INSERT (intake_id, partner_id, feed, remote_name, claimed_path, listed_size, batch_id, content_sha256,
        size_bytes, data_sha256, data_size, state, worker_id, lease_until, replay_of, release_override)
    ON :"schema".file_intake TO :"ops_role";

-- purge_role: which spooled bytes a file still needs (held for ops: its
-- quarantine record open), the row issues and snapshot keys of finished
-- files, the plan changes of files no longer awaiting approval, claim ids
-- no file reached, and the audit through intake_purge_audit (the one way
-- audit rows go).
GRANT SELECT ON :"schema".file_intake, :"schema".intake_quarantine TO :"purge_role";
GRANT SELECT, DELETE ON :"schema".intake_row_issue, :"schema".intake_snapshot_key,
    :"schema".intake_plan_change, :"schema".intake_plan_change_column, :"schema".intake_claim_id TO :"purge_role";
GRANT EXECUTE ON FUNCTION :"schema".intake_purge_audit(text, timestamptz) TO :"purge_role";

-- Row-level security: every write of the ops role audited first. The
-- audit's trigger (migration 016) writes session_user and the
-- transaction's now() into each row the ops role appends, so "an audit
-- row at now() by session_user" exists only in a transaction that has
-- appended one. The daemon's and the purge role's policies let them do
-- what their grants say; the tables' owner (who migrates) is not subject
-- to row-level security. Dropped and created again, so applying this
-- again is harmless.
-- Tables the daemon writes with COPY cannot have it (intake_row_issue).
ALTER TABLE :"schema".file_intake ENABLE ROW LEVEL SECURITY;
ALTER TABLE :"schema".intake_quarantine ENABLE ROW LEVEL SECURITY;
ALTER TABLE :"schema".intake_batch ENABLE ROW LEVEL SECURITY;
ALTER TABLE :"schema".intake_chunk ENABLE ROW LEVEL SECURITY;
ALTER TABLE :"schema".intake_snapshot_key ENABLE ROW LEVEL SECURITY;
ALTER TABLE :"schema".intake_feed_late ENABLE ROW LEVEL SECURITY;
ALTER TABLE :"schema".intake_outbox_delivery ENABLE ROW LEVEL SECURITY;

DROP POLICY IF EXISTS intake_daemon ON :"schema".file_intake;
CREATE POLICY intake_daemon ON :"schema".file_intake TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".file_intake;
CREATE POLICY intake_read ON :"schema".file_intake FOR SELECT TO :"ops_role", :"purge_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".file_intake;
CREATE POLICY intake_ops_audited ON :"schema".file_intake FOR UPDATE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = file_intake.partner_id
        AND a.intake_id = file_intake.intake_id AND a.at = pg_catalog.now() AND a.db_user = session_user))
    WITH CHECK (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = file_intake.partner_id
        AND a.intake_id = file_intake.intake_id AND a.at = pg_catalog.now() AND a.db_user = session_user));
-- a replay the ops role requests: a spooled row handed over at birth,
-- after its audit row
DROP POLICY IF EXISTS intake_ops_replay ON :"schema".file_intake;
CREATE POLICY intake_ops_replay ON :"schema".file_intake FOR INSERT TO :"ops_role"
    WITH CHECK (replay_of IS NOT NULL AND state = 'spooled' AND lease_until < pg_catalog.now()
        AND EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = file_intake.partner_id
        AND a.intake_id = file_intake.intake_id AND a.action = 'replay' AND a.at = pg_catalog.now() AND a.db_user = session_user));
-- the receipt of a discard, published by the command right after its
-- decision: a discarded file stays discarded
DROP POLICY IF EXISTS intake_ops_discarded ON :"schema".file_intake;
CREATE POLICY intake_ops_discarded ON :"schema".file_intake FOR UPDATE TO :"ops_role"
    USING (state = 'discarded') WITH CHECK (state = 'discarded');

DROP POLICY IF EXISTS intake_daemon ON :"schema".intake_quarantine;
CREATE POLICY intake_daemon ON :"schema".intake_quarantine TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".intake_quarantine;
CREATE POLICY intake_read ON :"schema".intake_quarantine FOR SELECT TO :"ops_role", :"purge_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".intake_quarantine;
CREATE POLICY intake_ops_audited ON :"schema".intake_quarantine FOR UPDATE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = intake_quarantine.partner_id
        AND a.intake_id = intake_quarantine.intake_id AND a.at = pg_catalog.now() AND a.db_user = session_user))
    WITH CHECK (true);

DROP POLICY IF EXISTS intake_daemon ON :"schema".intake_batch;
CREATE POLICY intake_daemon ON :"schema".intake_batch TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".intake_batch;
CREATE POLICY intake_read ON :"schema".intake_batch FOR SELECT TO :"ops_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".intake_batch;
CREATE POLICY intake_ops_audited ON :"schema".intake_batch FOR UPDATE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = intake_batch.partner_id
        AND a.at = pg_catalog.now() AND a.db_user = session_user))
    WITH CHECK (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = intake_batch.partner_id
        AND a.intake_id = intake_batch.intake_id AND a.at = pg_catalog.now() AND a.db_user = session_user));

-- intake_row_issue has no row-level security: the daemon writes it with
-- COPY, which PostgreSQL refuses on a table with row-level security. The
-- ops role may delete a file's row issues (a release does: its next plan
-- makes them again), and nothing else there.

DROP POLICY IF EXISTS intake_daemon ON :"schema".intake_chunk;
CREATE POLICY intake_daemon ON :"schema".intake_chunk TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".intake_chunk;
CREATE POLICY intake_read ON :"schema".intake_chunk FOR SELECT TO :"ops_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".intake_chunk;
CREATE POLICY intake_ops_audited ON :"schema".intake_chunk FOR DELETE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = intake_chunk.partner_id
        AND a.intake_id = intake_chunk.intake_id AND a.at = pg_catalog.now() AND a.db_user = session_user));

DROP POLICY IF EXISTS intake_daemon ON :"schema".intake_snapshot_key;
CREATE POLICY intake_daemon ON :"schema".intake_snapshot_key TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".intake_snapshot_key;
CREATE POLICY intake_read ON :"schema".intake_snapshot_key FOR SELECT TO :"ops_role", :"purge_role" USING (true);
DROP POLICY IF EXISTS intake_purge ON :"schema".intake_snapshot_key;
CREATE POLICY intake_purge ON :"schema".intake_snapshot_key FOR DELETE TO :"purge_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".intake_snapshot_key;
CREATE POLICY intake_ops_audited ON :"schema".intake_snapshot_key FOR DELETE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.intake_id = intake_snapshot_key.intake_id
        AND a.at = pg_catalog.now() AND a.db_user = session_user));

DROP POLICY IF EXISTS intake_daemon ON :"schema".intake_feed_late;
CREATE POLICY intake_daemon ON :"schema".intake_feed_late TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".intake_feed_late;
CREATE POLICY intake_read ON :"schema".intake_feed_late FOR SELECT TO :"ops_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".intake_feed_late;
CREATE POLICY intake_ops_audited ON :"schema".intake_feed_late FOR UPDATE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.partner_id = intake_feed_late.partner_id
        AND a.action = 'expect_ack' AND a.at = pg_catalog.now() AND a.db_user = session_user))
    WITH CHECK (true);

DROP POLICY IF EXISTS intake_daemon ON :"schema".intake_outbox_delivery;
CREATE POLICY intake_daemon ON :"schema".intake_outbox_delivery TO :"daemon_role" USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS intake_read ON :"schema".intake_outbox_delivery;
CREATE POLICY intake_read ON :"schema".intake_outbox_delivery FOR SELECT TO :"ops_role" USING (true);
DROP POLICY IF EXISTS intake_ops_audited ON :"schema".intake_outbox_delivery;
CREATE POLICY intake_ops_audited ON :"schema".intake_outbox_delivery FOR UPDATE TO :"ops_role"
    USING (EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.action = 'notify_redeliver_request'
        AND a.at = pg_catalog.now() AND a.db_user = session_user))
    WITH CHECK (true);

-- Four eyes (the config's ops.four_eyes, `intake grants --four-eyes`):
-- an approval by the login role that released the file from quarantine
-- or requested it as a replay is refused by the database, whatever the
-- config of the CLI that runs it. The rule is intake_ops_policy's one row,
-- which only the owner changes (here); the restrictive policy below
-- refuses an ops role's UPDATE of a file in a transaction that audited
-- its approval when the same login audited its release or replay.
UPDATE :"schema".intake_ops_policy SET four_eyes = :'four_eyes'::boolean;
GRANT SELECT ON :"schema".intake_ops_policy TO :"daemon_role", :"ops_role";
DROP POLICY IF EXISTS intake_ops_four_eyes ON :"schema".file_intake;
CREATE POLICY intake_ops_four_eyes ON :"schema".file_intake AS RESTRICTIVE FOR UPDATE TO :"ops_role"
    USING (true)
    WITH CHECK (NOT (SELECT p.four_eyes FROM :"schema".intake_ops_policy p)
        OR NOT EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.intake_id = file_intake.intake_id
            AND a.action = 'approve' AND a.at = pg_catalog.now() AND a.db_user = session_user)
        OR NOT EXISTS (SELECT 1 FROM :"schema".intake_audit a WHERE a.intake_id = file_intake.intake_id
            AND a.action IN ('release', 'replay') AND a.db_user = session_user));

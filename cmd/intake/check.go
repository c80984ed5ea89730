package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/internal/names"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// checkCommand is `intake check`.
func checkCommand() *cobra.Command {
	return withConfig(&cobra.Command{
		Use:     "check --config FILE",
		Short:   "validate the config, probe every partner, the database and target tables",
		Example: "intake check --config /etc/intake/intake.yaml",
	}, "", cmdCheck)
}

// cmdCheck validates the config and probes each partner, the database and
// the target tables. It exits non-zero naming what to fix.
func cmdCheck(path string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, "FAIL config:", err)
		return 2 // a config error, as for every command
	}
	fmt.Fprintf(stdout, "ok   config %s (%d partners, worker %s)\n", path, len(cfg.Partners), cfg.WorkerID)
	if unset := unsetEnvs(cfg); len(unset) > 0 {
		// The daemon would stop at each of these, some only when a
		// partner is first polled or a webhook first sent: name them all
		// now, before any site is dialled.
		for _, u := range unset {
			fmt.Fprintf(stdout, "FAIL %s: environment variable %s is not set\n", u.key, u.env)
		}
		return 2 // a config error, as at the daemon's start
	}
	for _, g := range partners.SharedAccounts(cfg.Partners) {
		ids := make([]string, len(g))
		for k, i := range g {
			ids[k] = cfg.Partners[i].ID
		}
		s := cfg.Partners[g[0]].SFTP
		fmt.Fprintf(stdout, "warn partners %s share one SFTP account (%s@%s): each can read, replace and link to the others' files; give each partner an account of its own (docs/install.md)\n",
			strings.Join(ids, ", "), inert.Text(s.User), inert.Text(s.Address))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	failed := 0
	fail := func(what string, err error) {
		failed++
		fmt.Fprintf(stdout, "FAIL %s: %s\n", what, inert.Lines(err.Error())) // a site's text may be in it
	}
	type resolved struct {
		id   string
		site partners.Site
	}
	var sites []resolved // each partner's tree as its server resolves it
	type measured struct {
		id      string
		site    partners.Site
		profile partners.Profile
	}
	var profiles []measured // kept once the database is reached
	overlaps := func() {
		// two partners on one tree under different spellings ("." and the
		// home directory, a link, a host name and its address)
		for i := range sites {
			for j := i + 1; j < len(sites); j++ {
				if partners.SiteOverlaps(sites[i].site, sites[j].site) {
					fail("partners "+sites[i].id+" and "+sites[j].id, fmt.Errorf(
						"one tree on their server, or one inside the other, as the server resolves them (%s and %s): each would take the other's files; the daemon refuses both (reason site_shared)",
						inert.Quote(sites[i].site.Root), inert.Quote(sites[j].site.Root))) // the server's words
				}
			}
		}
	}
	for i := range cfg.Partners {
		p := &cfg.Partners[i]
		if p.SFTP.LegacyAlgorithms {
			fmt.Fprintf(stdout, "warn partner %s sftp.legacy_algorithms: SHA-1 SSH algorithms (diffie-hellman-group14-sha1, hmac-sha1, ssh-rsa signatures) are offered to its site; remove it once the site's server offers SHA-2\n", p.ID)
		}
		if usesPGP(p) {
			if err := intake.CheckPGPKeys(p); err != nil {
				fail("partner "+p.ID+" pgp keys", err)
			} else {
				fmt.Fprintf(stdout, "ok   partner %s pgp keys: readable, secret keys unlocked\n", p.ID)
			}
		}
		if p.Records() {
			// claim: record: the site is read-only by design; it must let
			// ready/ be listed and read, nothing more
			a, err := sftpconn.ProbeAccess(ctx, p, false)
			switch {
			case err != nil:
				fail("partner "+p.ID, err)
			case a.List != partners.CanYes || a.Read == partners.CanNo:
				fail("partner "+p.ID, fmt.Errorf("claim: record needs ready/ listable and readable; access: %s", a))
			default:
				fmt.Fprintf(stdout, "ok   partner %s: host key pinned, login, ready/ listable and readable (claim: record; access: %s)\n", p.ID, a)
			}
			continue
		}
		prof, site, perr := sftpconn.ProbeSite(ctx, p, cfg.WorkerID)
		if perr != nil {
			fail("partner "+p.ID, perr)
		} else {
			renames := "rename never overwrites"
			if prof.RenameOverwrites {
				renames = "rename overwrites: intake makes sure of each rename's target first and moves nothing into ready/"
			}
			fmt.Fprintf(stdout, "ok   partner %s: host key pinned, login, directories writable, %s\n", p.ID, renames)
			if site != (partners.Site{}) {
				sites = append(sites, resolved{p.ID, site})
			}
		}
		if perr == nil || errors.Is(perr, partners.ErrRenameOverwrites) {
			// measured: what the server does, refused or not
			fmt.Fprintf(stdout, "     partner %s server profile: %s\n", p.ID, prof)
			if site != (partners.Site{}) {
				profiles = append(profiles, measured{p.ID, site, prof})
			}
		}
		if sftpconn.IsHostKeyMismatch(perr) {
			continue // nothing more is asked of a site that is not the pinned one
		}
		// what the account may do in ready/, and which modes that fits
		a, err := sftpconn.ProbeAccess(ctx, p, perr == nil && !prof.EmptyDirPersists)
		if err != nil {
			if perr == nil {
				fail("partner "+p.ID+" access", err)
			}
			continue
		}
		fmt.Fprintf(stdout, "     partner %s access in ready/: %s; fits %s\n", p.ID, a, a.Fits())
		if a.Left != "" {
			fmt.Fprintf(stdout, "     partner %s: could not delete the probe file %s; delete it by hand\n", p.ID, a.Left)
		}
	}
	overlaps()
	url, err := cfg.DatabaseURL()
	if err != nil {
		fail("database", err)
		return 2 // database.url_env names an unset variable: a config error
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		fail("database url", err)
		return 2 // a URL that does not parse: a config error
	}
	migrations.SetSearchPath(pc.ConnConfig) // the daemon's path: what check reads resolves as the daemon's statements do
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fail("database", err)
		return 1
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		fail("database", err)
		return 1
	}
	if err := migrations.Current(ctx, pool); err != nil {
		fail("database schema", err)
	} else {
		fmt.Fprintln(stdout, "ok   database reachable, schema current")
		// the profiles measured above, with the limits only check
		// measures: `intake status` shows them, the daemon respects
		// the channels a connection
		l := ledger.New(pool, 0)
		for _, m := range profiles {
			if err := l.RecordCheckedProfile(ctx, m.id, m.site.Key(), m.profile); err != nil {
				fmt.Fprintf(stdout, "warn partner %s: its server profile is not kept: %s\n", m.id, inert.Lines(err.Error()))
			}
		}
	}
	writers, err := pathWriters(ctx, pool)
	switch {
	case err != nil:
		fail("database search_path", err)
	case len(writers) > 0:
		for _, w := range writers {
			fmt.Fprintf(stdout, "FAIL database: %s may create in schema %s, on intake's search_path (%s): a function or operator it creates there can run as intake's role; REVOKE CREATE ON SCHEMA %s FROM %s\n",
				w.role, w.schema, migrations.SearchPath, w.schemaIdent, w.roleIdent)
			failed++
		}
	default:
		fmt.Fprintf(stdout, "ok   database: no role but its owner may create in a schema on intake's search_path (%s)\n", migrations.SearchPath)
	}
	if err := roleWarnings(ctx, pool, stdout); err != nil {
		fail("database role", err)
	}
	chk := target.NewChecker(pool)        // each table's catalog read once
	calls := map[string][]untrustedCall{} // by the feed's target, as written
	for i := range cfg.Partners {
		p := &cfg.Partners[i]
		for j := range p.Feeds {
			f := &p.Feeds[j]
			plan, err := target.Check(ctx, pool, f)
			if err != nil {
				fail(fmt.Sprintf("partner %s feed %s", p.ID, f.Name), err)
				continue
			}
			fmt.Fprintf(stdout, "ok   partner %s feed %s: target %s has the columns and unique index intake needs\n", p.ID, f.Name, f.Target)
			failed += compareColumns(ctx, chk, p.ID, f, stdout)
			cs, seen := calls[f.Target]
			if !seen {
				if cs, err = untrustedCalls(ctx, pool, f.Target, cfg.Database.TrustedFunctionOwners); err != nil {
					fail(fmt.Sprintf("partner %s feed %s: functions its target calls", p.ID, f.Name), err)
					continue
				}
				calls[f.Target] = cs
			}
			for _, c := range cs {
				fmt.Fprintf(stdout, "FAIL partner %s feed %s: target %s: %s calls %s, owned by %s, not in database.trusted_function_owners: it runs as intake's role, with its rights on the ledger, the audit and every partner's tables\n",
					p.ID, f.Name, f.Target, c.by, c.function, c.owner)
				failed++
			}
			if len(cs) == 0 {
				fmt.Fprintf(stdout, "ok   partner %s feed %s: target %s calls no function but pg_catalog's, information_schema's and trusted owners' from triggers, defaults, CHECKs or indexes\n", p.ID, f.Name, f.Target)
			}
			if plan.Binary {
				fmt.Fprintf(stdout, "     rows travel as COPY binary")
			} else {
				fmt.Fprintf(stdout, "     rows travel as COPY text (slower), for %s", strings.Join(plan.TextColumns, ", "))
			}
			if plan.RangeProbe {
				fmt.Fprintln(stdout, "; chunks of clustered keys are matched by index range")
			} else {
				fmt.Fprintln(stdout, "; keys are matched one by one (the unique index does not start with partner_id and the first key)")
			}
			if len(plan.KeysCompared) > 0 {
				fmt.Fprintf(stdout, "     the target compares key %s its own way: every chunk is deduplicated in SQL, replays get no look-up of unchanged rows\n", strings.Join(plan.KeysCompared, ", "))
			}
		}
	}
	if failed > 0 {
		fmt.Fprintf(stdout, "%d problem(s) found\n", failed)
		return 1
	}
	return 0
}

// pathWriter is a role other than a schema's owner that may create in
// the schema.
type pathWriter struct {
	schema, schemaIdent string
	role, roleIdent     string // PUBLIC for every role
}

// pathWriters lists, for every schema on the session's search_path but
// pg_catalog (the pool's is the daemon's: migrations.SearchPath), the
// roles other than its owner that hold CREATE on it, PUBLIC included.
// Such a role can plant a function or operator there that a statement of
// intake's resolves to and runs as intake's role.
func pathWriters(ctx context.Context, pool *pgxpool.Pool) ([]pathWriter, error) {
	rs, err := pool.Query(ctx, `SELECT n.nspname::text, pg_catalog.quote_ident(n.nspname::text),
		    coalesce(r.rolname::text, 'PUBLIC'), CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname::text) END
		FROM pg_catalog.pg_namespace n
		CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n'::"char", n.nspowner))) a
		LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
		WHERE n.nspname = ANY (pg_catalog.current_schemas(false)) AND n.nspname <> 'pg_catalog'
		  AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
		ORDER BY 1, 3`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(row pgx.CollectableRow) (pathWriter, error) {
		var w pathWriter
		err := row.Scan(&w.schema, &w.schemaIdent, &w.role, &w.roleIdent)
		return w, err
	})
}

// untrustedCall is a function a target table calls, from a trigger, a
// column default, a CHECK (the table's or a column's domain's) or an
// index expression or predicate, whose owner intake does not trust.
type untrustedCall struct {
	by       string // what calls it: "trigger t", "default of column c", …
	function string // as regprocedure prints it: schema-qualified unless on the path, with its argument types
	owner    string
}

// untrustedCalls lists the functions a target table calls as intake's
// role when a row is written, that are neither in pg_catalog or
// information_schema nor owned by a role in trusted. What an object calls
// is read from pg_depend, where PostgreSQL records each function and
// operator its expression uses (an operator stands for its function):
// a trigger's function and WHEN clause, a default or generated column,
// a CHECK constraint of the table or of a domain (over domains) of its
// columns, an index's expressions and predicate; of the table and, for a
// partitioned table, of every partition, where rows land.
func untrustedCalls(ctx context.Context, pool *pgxpool.Pool, table string, trusted []string) ([]untrustedCall, error) {
	if trusted == nil {
		trusted = []string{}
	}
	schema, name := names.SplitTarget(table)
	rs, err := pool.Query(ctx, `WITH RECURSIVE
		t AS (SELECT pg_catalog.to_regclass($1::text)::oid AS rel),
		rels AS (SELECT rel FROM t UNION SELECT p.relid::pg_catalog.oid FROM t, pg_catalog.pg_partition_tree(t.rel::pg_catalog.regclass) p),
		doms AS (
			SELECT ty.oid FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
			WHERE a.attrelid IN (SELECT rel FROM rels) AND a.attnum > 0 AND NOT a.attisdropped AND ty.typtype = 'd'
			UNION
			SELECT b.oid FROM doms JOIN pg_catalog.pg_type ty ON ty.oid = doms.oid JOIN pg_catalog.pg_type b ON b.oid = ty.typbasetype
			WHERE b.typtype = 'd'),
		uses AS (
			SELECT 'trigger ' || pg_catalog.quote_ident(tg.tgname::text)
			       || CASE WHEN tg.tgrelid <> (SELECT rel FROM t) THEN ' on partition ' || tg.tgrelid::pg_catalog.regclass::text ELSE '' END AS by,
			       d.refclassid, d.refobjid
			FROM pg_catalog.pg_trigger tg
			JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass AND d.objid = tg.oid
			WHERE tg.tgrelid IN (SELECT rel FROM rels) AND NOT tg.tgisinternal AND tg.tgparentid = 0
			UNION ALL
			SELECT 'default of column ' || pg_catalog.quote_ident(a.attname::text)
			       || CASE WHEN ad.adrelid <> (SELECT rel FROM t) THEN ' of partition ' || ad.adrelid::pg_catalog.regclass::text ELSE '' END,
			       d.refclassid, d.refobjid
			FROM pg_catalog.pg_attrdef ad
			JOIN pg_catalog.pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
			JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass AND d.objid = ad.oid
			WHERE ad.adrelid IN (SELECT rel FROM rels)
			UNION ALL
			SELECT CASE WHEN c.contypid = 0 THEN 'CHECK constraint ' || pg_catalog.quote_ident(c.conname::text)
			                 || CASE WHEN c.conrelid <> (SELECT rel FROM t) THEN ' of partition ' || c.conrelid::pg_catalog.regclass::text ELSE '' END
			            ELSE 'CHECK constraint ' || pg_catalog.quote_ident(c.conname::text) || ' of domain ' || c.contypid::pg_catalog.regtype::text END,
			       d.refclassid, d.refobjid
			FROM pg_catalog.pg_constraint c
			JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.objid = c.oid
			WHERE c.contype = 'c' AND (c.conrelid IN (SELECT rel FROM rels) OR c.contypid IN (SELECT oid FROM doms))
			UNION ALL
			SELECT 'index ' || i.indexrelid::pg_catalog.regclass::text, d.refclassid, d.refobjid
			FROM pg_catalog.pg_index i
			JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid = i.indexrelid
			WHERE i.indrelid IN (SELECT rel FROM rels)),
		called AS (
			SELECT u.by, u.refobjid AS fn FROM uses u WHERE u.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
			UNION
			SELECT u.by, o.oprcode::pg_catalog.oid FROM uses u JOIN pg_catalog.pg_operator o ON o.oid = u.refobjid
			WHERE u.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass)
		SELECT c.by, p.oid::pg_catalog.regprocedure::text, r.rolname::text
		FROM called c
		JOIN pg_catalog.pg_proc p ON p.oid = c.fn
		JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
		WHERE p.pronamespace NOT IN ('pg_catalog'::pg_catalog.regnamespace, 'information_schema'::pg_catalog.regnamespace)
		  AND r.rolname::text <> ALL ($2::text[])
		ORDER BY 1, 2`, pgx.Identifier{schema, name}.Sanitize(), trusted)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(row pgx.CollectableRow) (untrustedCall, error) {
		var c untrustedCall
		err := row.Scan(&c.by, &c.function, &c.owner)
		return c, err
	})
}

// compareColumns prints what the target could refuse of the values the
// feed accepts (FAIL) and what cannot be decided statically (warn), and
// returns how many failures it printed.
func compareColumns(ctx context.Context, chk *target.Checker, partner string, f *partners.Feed, stdout io.Writer) int {
	what := fmt.Sprintf("partner %s feed %s", partner, f.Name)
	findings, err := chk.Compare(ctx, partner, f) // the target loaded: target.Check said so
	if err != nil {
		fmt.Fprintf(stdout, "FAIL %s: %v\n", what, err)
		return 1
	}
	fails := 0
	if f.Mode == partners.ModeSnapshot && f.DeleteGuard != nil && f.DeleteGuard.Off {
		fmt.Fprintf(stdout, "warn %s: a snapshot without a delete guard (delete_guard.off): a truncated or partial file deletes every row it lacks, with no one asked\n", what)
	}
	for _, g := range findings {
		if g.Fail {
			fails++
			fmt.Fprintf(stdout, "FAIL %s %s\n", what, g)
		} else {
			fmt.Fprintf(stdout, "warn %s %s\n", what, g)
		}
	}
	if fails == 0 {
		fmt.Fprintf(stdout, "ok   %s: every value the feed accepts fits its target column\n", what)
	}
	return fails
}

// usesPGP: a feed of p has pgp.
func usesPGP(p *partners.Config) bool {
	for i := range p.Feeds {
		if p.Feeds[i].PGP != nil {
			return true
		}
	}
	return false
}

// unsetEnv is a *_env key of the config whose variable is unset or empty.
type unsetEnv struct{ key, env string }

// unsetEnvs lists every environment variable the config names (the
// database URL, SFTP passwords, PGP passphrases, webhook secrets) that is
// not set, by its key in the config.
func unsetEnvs(cfg *config.File) []unsetEnv {
	var out []unsetEnv
	need := func(key, env string) {
		if env != "" && os.Getenv(env) == "" {
			out = append(out, unsetEnv{key, env})
		}
	}
	if cfg.Database.URL == "" {
		need("database.url_env", cfg.Database.URLEnv)
	}
	webhooks := func(prefix string, ns []partners.Notify) {
		for j, n := range ns {
			need(fmt.Sprintf("%snotify[%d].secret_env", prefix, j), n.SecretEnv)
			for k, e := range n.SecretEnvs {
				need(fmt.Sprintf("%snotify[%d].secret_envs[%d]", prefix, j, k), e)
			}
		}
	}
	webhooks("", cfg.Notify)
	for i, p := range cfg.Partners {
		prefix := fmt.Sprintf("partners[%d] (id %s).", i, p.ID)
		need(prefix+"sftp.password_env", p.SFTP.PasswordEnv)
		for k, f := range p.Feeds {
			if f.PGP != nil {
				need(fmt.Sprintf("%sfeeds[%d] (feed %s).pgp.passphrase_env", prefix, k, f.Name), f.PGP.PassphraseEnv)
			}
		}
		webhooks(prefix, p.Notify)
	}
	return out
}

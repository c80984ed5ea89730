package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/names"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/partners"
)

// Default role names of `intake grants`.
const (
	defaultDaemonRole = "intake"
	defaultOpsRole    = "intake_ops"
	defaultPurgeRole  = "intake_purge"
)

// grantsCommand is `intake grants`.
func grantsCommand() *cobra.Command {
	var f grantsFlags
	cmd := &cobra.Command{
		Use:     "grants --database NAME [--config FILE] [--daemon-role R] [--ops-role R] [--purge-role R] [--four-eyes]",
		Short:   "print the SQL that gives the daemon's, the ops and the purge role only the rights their jobs need",
		Example: "intake grants --database intake --ops-role intake_ops | psql -d intake -U intake_owner",
	}
	fs := cmd.Flags()
	fs.StringVar(&f.path, "config", "", "config file (YAML): adds the daemon's grants on its feeds' target tables, and the database name of its URL")
	fs.StringVar(&f.database, "database", "", "the database intake's tables are in; with --config, its URL's database unless given")
	fs.StringVar(&f.daemon, "daemon-role", defaultDaemonRole, "the role intake run connects as")
	fs.StringVar(&f.opsRole, "ops-role", defaultOpsRole, "the role of the ops commands (a NOLOGIN group granted to each person, best)")
	fs.StringVar(&f.purge, "purge-role", defaultPurgeRole, "the role intake purge connects as")
	fs.BoolVar(&f.fourEyes, "four-eyes", false, "the database refuses an approval by whoever released or requested the file (default: the config's ops.four_eyes)")
	return runs(cmd, func(_ []string, stdout, stderr io.Writer) int { return cmdGrants(f, cmd.Example, stdout, stderr) })
}

// grantsFlags are intake grants' flags.
type grantsFlags struct {
	path, database, daemon, opsRole, purge string
	fourEyes                               bool
}

// cmdGrants prints the SQL that gives the daemon's, the ops and the purge
// role their rights (intake/ledger/grants.sql), and with --config the
// daemon's rights on the config's target tables. It connects to nothing.
func cmdGrants(f grantsFlags, example string, stdout, stderr io.Writer) int {
	var cfg *config.File
	if f.path != "" {
		var err error
		if cfg, err = config.Load(f.path); err != nil {
			fmt.Fprintln(stderr, "intake grants:", err)
			return 2
		}
		f.fourEyes = f.fourEyes || cfg.Ops.FourEyes
		if f.database == "" {
			if url, err := cfg.DatabaseURL(); err == nil {
				if cc, err := pgx.ParseConfig(url); err == nil {
					f.database = cc.Database
				}
			}
		}
	}
	if f.database == "" {
		fmt.Fprintf(stderr, "intake grants: give --database NAME (or --config with a database URL that names one)\ne.g. %s\n", example)
		return 2
	}
	roles := ledger.GrantRoles{Database: f.database, Schema: migrations.Schema, Daemon: f.daemon, Ops: f.opsRole, Purge: f.purge, FourEyes: f.fourEyes}
	sql, err := ledger.Grants(roles)
	if err != nil {
		fmt.Fprintln(stderr, "intake grants:", err)
		return 2
	}
	fmt.Fprint(stdout, sql)
	if cfg != nil {
		t, err := targetGrants(cfg.Partners, f.daemon)
		if err != nil {
			fmt.Fprintln(stderr, "intake grants:", err)
			return 2
		}
		fmt.Fprint(stdout, t)
	}
	return 0
}

// targetGrants is the daemon's rights on the target tables of parts'
// feeds (docs/target-tables.md): rows are read (plans, the merge's
// guard), inserted and updated (ON CONFLICT … DO UPDATE); deleted only by
// a snapshot feed without deleted_at. An unqualified table is public's
// (names.SplitTarget).
func targetGrants(parts []partners.Config, daemon string) (string, error) {
	role, err := ledger.QuoteIdent(daemon)
	if err != nil {
		return "", fmt.Errorf("daemon-role: %w", err)
	}
	type table struct{ schema, name string }
	deletes := map[table]bool{}
	for _, p := range parts {
		for _, f := range p.Feeds {
			schema, name := names.SplitTarget(f.Target)
			t := table{schema, name}
			deletes[t] = deletes[t] || (f.Mode == partners.ModeSnapshot && f.DeletedAt == "")
		}
	}
	tables := make([]table, 0, len(deletes))
	for t := range deletes {
		tables = append(tables, t)
	}
	sort.Slice(tables, func(i, j int) bool {
		return tables[i].schema < tables[j].schema || tables[i].schema == tables[j].schema && tables[i].name < tables[j].name
	})
	var b strings.Builder
	b.WriteString("\n-- The target tables of the config's feeds: rows read (plans, the merge's\n" +
		"-- guard), inserted and updated (ON CONFLICT … DO UPDATE); deleted by a\n" +
		"-- snapshot feed without deleted_at only.\n")
	schemas := map[string]bool{}
	for _, t := range tables {
		s, err := ledger.QuoteIdent(t.schema)
		if err != nil {
			return "", fmt.Errorf("target %s.%s: %w", t.schema, t.name, err)
		}
		n, err := ledger.QuoteIdent(t.name)
		if err != nil {
			return "", fmt.Errorf("target %s.%s: %w", t.schema, t.name, err)
		}
		if !schemas[t.schema] && t.schema != migrations.Schema {
			schemas[t.schema] = true
			fmt.Fprintf(&b, "GRANT USAGE ON SCHEMA %s TO %s;\n", s, role)
		}
		privs := "SELECT, INSERT, UPDATE"
		if deletes[t] {
			privs += ", DELETE"
		}
		fmt.Fprintf(&b, "GRANT %s ON %s.%s TO %s;\n", privs, s, n, role)
	}
	return b.String(), nil
}

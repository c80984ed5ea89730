package target_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Compare names, per feed column, what the target could refuse of
// the values the feed accepts (failures), and what it cannot decide
// (warnings), against tables created in a real PostgreSQL.
func TestCompareTargetNamesWhatCouldBeRefused(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	mustExec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	mustExec(`CREATE TABLE ref (code text PRIMARY KEY)`)
	mustExec(`CREATE TYPE mood AS ENUM ('new', 'paid')`)
	mustExec(`CREATE DOMAIN shortish AS varchar(40) CHECK (VALUE <> '')`)
	text := func(n int) partners.Column { return partners.Column{Name: "v", Type: partners.TypeText, MaxLength: n} }
	tests := []struct {
		name  string
		col   partners.Column
		ddl   string // the column v, and what else the table has
		fails []string
		warns []string
	}{
		{"a matching target is clean", text(64), "v text", nil, nil},
		{"varchar shorter than max_length", text(64), "v varchar(8)", []string{"character varying(8): holds 8 characters, the feed accepts up to 64"}, nil},
		{"varchar as long as max_length", text(8), "v varchar(8)", nil, nil},
		{"char shorter than max_length", text(64), "v char(10)", []string{"character(10)"}, nil},
		{"a text column without max_length gets the default", partners.Column{Name: "v", Type: partners.TypeText}, "v varchar(255)",
			[]string{"the feed accepts up to 4096", "without max_length"}, nil},
		{"an email into a varchar too short for one", partners.Column{Name: "v", Type: partners.TypeEmail}, "v varchar(100)", []string{"254"}, nil},
		{"enum values fit a varchar", partners.Column{Name: "v", Type: partners.TypeEnum, Values: []string{"new", "shipped"}}, "v varchar(7)", nil, nil},
		{"numeric scale below the feed's", partners.Column{Name: "v", Type: partners.TypeDecimal, Scale: 4, Precision: 5}, "v numeric(5,2)",
			[]string{"numeric(5,2): rounds to 2 digits after the point, the feed accepts 4"}, nil},
		{"a decimal without precision into numeric(p,s)", partners.Column{Name: "v", Type: partners.TypeDecimal, Scale: 2}, "v numeric(12,2)",
			[]string{"holds 10 digits before the point, the feed accepts 100", "no precision; declare precision: 12 or less"}, nil},
		{"a decimal with a precision that fits", partners.Column{Name: "v", Type: partners.TypeDecimal, Scale: 2, Precision: 12}, "v numeric(12,2)", nil, nil},
		{"a decimal into unbounded numeric", partners.Column{Name: "v", Type: partners.TypeDecimal, Scale: 6}, "v numeric", nil, nil},
		{"an integer into smallint", partners.Column{Name: "v", Type: partners.TypeInteger}, "v smallint", []string{"smallint: out of range for values of 19 digits"}, nil},
		{"an integer into integer", partners.Column{Name: "v", Type: partners.TypeInteger}, "v integer", []string{"integer: out of range", "declare precision: 9 or less"}, nil},
		{"an integer of 9 digits into integer", partners.Column{Name: "v", Type: partners.TypeInteger, Precision: 9}, "v integer", nil, nil},
		{"an integer into bigint", partners.Column{Name: "v", Type: partners.TypeInteger}, "v bigint", nil, nil},
		{"an integer into numeric(10,0)", partners.Column{Name: "v", Type: partners.TypeInteger}, "v numeric(10,0)", []string{"holds 10 digits before the point, the feed accepts 19"}, nil},
		{"a decimal with a fraction into integer", partners.Column{Name: "v", Type: partners.TypeDecimal, Scale: 2}, "v bigint", []string{"digits after the point"}, nil},
		{"NOT NULL for a column that is not required", text(64), "v text NOT NULL", []string{"NOT NULL but the feed column is not required"}, nil},
		{"NOT NULL for a required column", partners.Column{Name: "v", Type: partners.TypeText, MaxLength: 5, Required: true}, "v text NOT NULL", nil, nil},
		{"text into an integer column", text(10), "v integer", []string{"integer: a text value is not valid input of that type"}, nil},
		{"a date into an integer column", partners.Column{Name: "v", Type: partners.TypeDate}, "v int", []string{"a date value is not valid input"}, nil},
		{"text into uuid", text(36), "v uuid", []string{"type incompatibility"}, nil},
		{"a timestamp into a date drops the time", partners.Column{Name: "v", Type: partners.TypeTimestamp}, "v date", nil, []string{"time of day"}},
		{"a decimal into double precision rounds", partners.Column{Name: "v", Type: partners.TypeDecimal, Scale: 2}, "v double precision", nil, []string{"binary floating point"}},
		{"an enum into an enum type lacking a value", partners.Column{Name: "v", Type: partners.TypeEnum, Values: []string{"new", "paid", "shipped"}}, "v mood",
			[]string{"enum type without the feed's values shipped"}, nil},
		{"an enum into an enum type with every value", partners.Column{Name: "v", Type: partners.TypeEnum, Values: []string{"paid"}}, "v mood", nil, nil},
		{"a CHECK constraint and a foreign key are warnings only", text(64), "v text CHECK (v <> 'x') REFERENCES ref (code)", nil,
			[]string{"CHECK constraint t_v_check", "foreign key t_v_fkey references ref"}},
		{"another unique index is a warning", text(64), "v text UNIQUE", nil, []string{"unique index t_v_key other than (partner_id, k)"}},
		{"a domain: its base type is compared, its CHECK is a warning", text(64), "v shortish",
			[]string{"shortish: holds 40 characters"}, []string{"of domain shortish"}},
		{"a NOT NULL column the feed does not write", text(64), "v text, extra text NOT NULL", []string{"column extra: is NOT NULL without a default"}, nil},
		{"a NOT NULL column with a default", text(64), "v text, extra text NOT NULL DEFAULT 'x', id bigint GENERATED ALWAYS AS IDENTITY", nil, nil},
		{"a table CHECK on no column is a warning", text(64), "v text, CHECK (true)", nil, []string{"CHECK constraint"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := fmt.Sprintf("t%d", i)
			ddl := strings.ReplaceAll(tt.ddl, "t_v_", table+"_v_")
			mustExec(fmt.Sprintf(`CREATE TABLE %s (partner_id text NOT NULL, k text NOT NULL, %s, last_intake_id bigint NOT NULL,
				intake_row_hash bigint, UNIQUE (partner_id, k))`, table, ddl))
			f := &partners.Feed{Name: "f", Pattern: `x`, Target: table, Key: []string{"k"},
				Columns: []partners.Column{{Name: "k", Type: partners.TypeText, Required: true, MaxLength: 16}, tt.col}}
			f.SetDefaults()
			if err := f.Validate("f", partners.ReadinessRename); err != nil {
				t.Fatal(err)
			}
			got, err := target.Compare(ctx, pool, "acme", f)
			if err != nil {
				t.Fatal(err)
			}
			var fails, warns []string
			for _, g := range got {
				if g.Fail {
					fails = append(fails, g.String())
				} else {
					warns = append(warns, g.String())
				}
			}
			match := func(kind string, got, want []string) {
				t.Helper()
				if len(want) == 0 && len(got) > 0 {
					t.Fatalf("%s: got %q, want none", kind, got)
				}
				all := strings.Join(got, "\n")
				for _, w := range want {
					if !strings.Contains(all, w) {
						t.Fatalf("%s: got %q, want one with %q", kind, got, w)
					}
				}
			}
			match("failures", fails, tt.fails)
			var want []string
			for _, w := range tt.warns {
				want = append(want, strings.ReplaceAll(w, "t_v_", table+"_v_"))
			}
			match("warnings", warns, want)
			for _, g := range fails {
				if !strings.HasPrefix(g, "column ") {
					t.Fatalf("failure %q names no column", g)
				}
			}
		})
	}
}

// partner_id must hold the partner's id: a varchar shorter than it refuses
// every row.
func TestCompareTargetChecksThePartnerIDColumn(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE p (partner_id varchar(4) NOT NULL, k text NOT NULL, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k))`); err != nil {
		t.Fatal(err)
	}
	f := &partners.Feed{Name: "f", Pattern: `x`, Target: "p", Key: []string{"k"},
		Columns: []partners.Column{{Name: "k", Type: partners.TypeText, Required: true, MaxLength: 16}}}
	f.SetDefaults()
	if err := f.Validate("f", partners.ReadinessRename); err != nil {
		t.Fatal(err)
	}
	for partner, fail := range map[string]bool{"acme": false, "globex": true} {
		got, err := target.Compare(ctx, pool, partner, f)
		if err != nil {
			t.Fatal(err)
		}
		if failed := len(got) == 1 && got[0].Fail && got[0].Column == "partner_id"; failed != fail || (!fail && len(got) > 0) {
			t.Fatalf("partner %s: got %+v", partner, got)
		}
	}
}

// Without intake_row_hash a target still loads (tables made before the
// guard keep working) but Compare warns that outside edits are
// overwritten; a hash column of another type is refused.
func TestCompareWarnsOfAMissingRowHash(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE nohash (partner_id text NOT NULL, k text NOT NULL, v text, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k));
		CREATE TABLE badhash (partner_id text NOT NULL, k text NOT NULL, v text, last_intake_id bigint NOT NULL, intake_row_hash bytea, UNIQUE (partner_id, k))`); err != nil {
		t.Fatal(err)
	}
	feed := func(table string) *partners.Feed {
		f := &partners.Feed{Name: "f", Pattern: `x`, Target: table, Key: []string{"k"},
			Columns: []partners.Column{{Name: "k", Type: partners.TypeText, Required: true, MaxLength: 16}, {Name: "v", Type: partners.TypeText}}}
		f.SetDefaults()
		return f
	}
	got, err := target.Compare(ctx, pool, "acme", feed("nohash"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Fail || !strings.Contains(got[0].String(), "has no column intake_row_hash bigint: edits made outside intake are not told") {
		t.Fatalf("got %v, want one warning naming intake_row_hash", got)
	}
	if plan, err := target.Check(ctx, pool, feed("nohash")); err != nil || plan.Guard {
		t.Fatalf("check without the column: %+v, %v; want it loaded, unguarded", plan, err)
	}
	if _, err := target.Check(ctx, pool, feed("badhash")); err == nil || !strings.Contains(err.Error(), "intake_row_hash is bytea: it must be bigint") {
		t.Fatalf("check with a bytea hash column: %v", err)
	}
}

// queryCount counts the statements a pool sends.
type queryCount struct{ n atomic.Int64 }

func (q *queryCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A Checker finds for every partner's feed what a fresh Compare finds
// (what it read of a table for one feed serves every other feed of the
// table), names every kind of constraint on the columns a feed writes and
// none on those it does not (a domain's CHECK included), and reads each
// target table's catalog once however many feeds write it; a feed column
// or partner_id the table lacks is an error, not a panic.
func TestACheckerReadsEachTableOnce(t *testing.T) {
	url, pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE TYPE tone AS ENUM ('new', 'paid');
		CREATE DOMAIN short AS varchar(40) CHECK (VALUE <> '');
		CREATE DOMAIN unused AS text CHECK (VALUE <> 'x');
		CREATE TABLE ref (code text PRIMARY KEY);
		CREATE TABLE a (partner_id text NOT NULL, k text NOT NULL, s short, e tone, r text REFERENCES ref (code),
			n int CHECK (n > 0), u text UNIQUE, z unused, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k));
		CREATE FUNCTION nop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
		CREATE TRIGGER a_nop BEFORE INSERT ON a FOR EACH ROW EXECUTE FUNCTION nop();
		CREATE TABLE b (partner_id varchar(6) NOT NULL, k text NOT NULL, v varchar(8), last_intake_id bigint NOT NULL, UNIQUE (partner_id, k))`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var count queryCount
	cfg.ConnConfig.Tracer = &count
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close()
	key := partners.Column{Name: "k", Type: partners.TypeText, Required: true, MaxLength: 16}
	feedA := []partners.Column{{Name: "s", Type: partners.TypeText, MaxLength: 64}, {Name: "e", Type: partners.TypeEnum, Values: []string{"new", "gone"}},
		{Name: "r", Type: partners.TypeText}, {Name: "n", Type: partners.TypeInteger}, {Name: "u", Type: partners.TypeText}}
	feed := func(table string, cols []partners.Column) *partners.Feed {
		f := &partners.Feed{Name: "f", Pattern: `x`, Target: table, Key: []string{"k"}, Columns: append([]partners.Column{key}, cols...)}
		f.SetDefaults()
		if err := f.Validate("f", partners.ReadinessRename); err != nil {
			t.Fatal(err)
		}
		return f
	}
	chk := target.NewChecker(traced)
	var perTable int64
	for i := range 30 {
		partner := fmt.Sprintf("partner-%d", i)
		f := feed("a", feedA[:i%len(feedA)+1]) // the feeds write different columns of a
		if i%3 == 0 {
			f = feed("b", []partners.Column{{Name: "v", Type: partners.TypeText, MaxLength: 4 + i%8}})
		}
		want, err := target.Compare(ctx, pool, partner, f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := chk.Compare(ctx, partner, f)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("partner %s on %s: the Checker found\n%v\nCompare found\n%v", partner, f.Target, got, want)
		}
		if len(want) == 0 && f.Target == "a" {
			t.Fatalf("partner %s: no finding on a, whose every extra column bears one: the comparison proves little", partner)
		}
		if i == 1 {
			perTable = count.n.Load() // a and b each read once by now
		}
	}
	// the feed writing every column of a: each constraint named once
	all, err := chk.Compare(ctx, "acme", feed("a", feedA))
	if err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprint(all)
	for _, want := range []string{"column e: is tone, an enum type", "CHECK constraint short_check of domain short", "foreign key a_r_fkey references ref",
		"CHECK constraint a_n_check", "unique index a_u_key", "trigger a_nop"} {
		if strings.Count(text, want) != 1 {
			t.Errorf("findings for every column of a: %q appears %d times in\n%v", want, strings.Count(text, want), all)
		}
	}
	one, err := chk.Compare(ctx, "acme", feed("a", nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := fmt.Sprint(one); strings.Contains(text, "short") || strings.Contains(text, "unused") || strings.Contains(text, "a_r_fkey") || !strings.Contains(text, "trigger a_nop") {
		t.Errorf("the feed writing the key alone: %v; want the trigger only of the constraints", one)
	}
	if n := count.n.Load(); n != perTable || n == 0 {
		t.Fatalf("the Checker sent %d statements for 30 feeds, %d after its first two tables: want each table read once", n, perTable)
	}
	if _, err := chk.Compare(ctx, "late", feed("b", []partners.Column{{Name: "missing", Type: partners.TypeText}})); err == nil || !strings.Contains(err.Error(), "missing column missing") {
		t.Fatalf("a feed column the table lacks: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE nopartner (k text NOT NULL, last_intake_id bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := chk.Compare(ctx, "late", feed("nopartner", nil)); err == nil || !strings.Contains(err.Error(), "missing column partner_id") {
		t.Fatalf("a table without partner_id: %v", err)
	}
}

// A partner_id of a nondeterministic collation (its column's, or its
// unique index's, which arbitrates ON CONFLICT) could hold two partners'
// ids equal, and they would write each other's rows: such a target is
// refused; a deterministic collation of its own is fine.
func TestATargetWhosePartnerIDComparesLooselyIsRefused(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE COLLATION IF NOT EXISTS loose (provider = icu, locale = 'und-u-ka-shifted-ks-level1', deterministic = false);
		CREATE TABLE loose_p (partner_id text COLLATE loose NOT NULL, k text NOT NULL, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k));
		CREATE TABLE c_p (partner_id text COLLATE "C" NOT NULL, k text NOT NULL, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k));
		CREATE TABLE idx_p (partner_id text NOT NULL, k text NOT NULL, last_intake_id bigint NOT NULL);
		CREATE UNIQUE INDEX ON idx_p (partner_id COLLATE loose, k)`); err != nil {
		t.Fatal(err)
	}
	var same bool
	if err := pool.QueryRow(ctx, `SELECT 'acme-1' = 'acme_1' COLLATE loose`).Scan(&same); err != nil || !same {
		t.Fatalf("the collation does not hold the two ids equal (%v, %v): the test proves nothing", same, err)
	}
	for table, refused := range map[string]bool{"loose_p": true, "c_p": false, "idx_p": true} {
		f := &partners.Feed{Name: "f", Pattern: `x`, Target: table, Key: []string{"k"},
			Columns: []partners.Column{{Name: "k", Type: partners.TypeText, Required: true, MaxLength: 16}}}
		f.SetDefaults()
		_, err := target.Load(ctx, pool, f)
		var te *target.Error
		if got := errors.As(err, &te) && strings.Contains(te.Detail, "nondeterministic collation"); got != refused || (!refused && err != nil) {
			t.Fatalf("%s: Load = %v, want refused %v", table, err, refused)
		}
	}
}

// Keys compared under the unique indexes that arbitrate ON CONFLICT: two
// of different nondeterministic collations on one key are refused (which
// is coarser is not known, and either may refuse what the other's dedupe
// let by); an index left invalid (a CREATE UNIQUE INDEX CONCURRENTLY that
// failed, on the very duplicates it would forbid) arbitrates nothing and
// is not read.
func TestKeyCollationsComeFromTheIndexesThatArbitrate(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE COLLATION IF NOT EXISTS ci2 (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
		`CREATE COLLATION IF NOT EXISTS ci1 (provider = icu, locale = 'und-u-ks-level1', deterministic = false)`,
		`CREATE TABLE two_ci (partner_id text NOT NULL, k text NOT NULL, last_intake_id bigint NOT NULL)`,
		`CREATE UNIQUE INDEX ON two_ci (partner_id, k COLLATE ci1)`,
		`CREATE UNIQUE INDEX ON two_ci (partner_id, k COLLATE ci2)`,
		`CREATE TABLE half_ci (partner_id text NOT NULL, k text NOT NULL, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k))`,
		`INSERT INTO half_ci VALUES ('acme', 'a', 1), ('acme', 'A', 1)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// fails on 'a' and 'A', leaving the index invalid
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY half_ci_ci ON half_ci (partner_id, k COLLATE ci2)`); err == nil {
		t.Fatal("the concurrent index was built: the test proves nothing")
	}
	var valid bool
	if err := pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'half_ci_ci'::regclass`).Scan(&valid); err != nil || valid {
		t.Fatalf("the failed index is not left invalid (%v, %v): the test proves nothing", valid, err)
	}
	feed := func(table string) *partners.Feed {
		f := &partners.Feed{Name: "f", Pattern: `x`, Target: table, Key: []string{"k"},
			Columns: []partners.Column{{Name: "k", Type: partners.TypeText, Required: true, MaxLength: 16}}}
		f.SetDefaults()
		return f
	}
	_, err := target.Load(ctx, pool, feed("two_ci"))
	var te *target.Error
	if !errors.As(err, &te) || !strings.Contains(te.Detail, "two nondeterministic collations") {
		t.Fatalf("two_ci: Load = %v, want refused", err)
	}
	plan, err := target.Check(ctx, pool, feed("half_ci"))
	if err != nil || len(plan.KeysCompared) != 0 {
		t.Fatalf("half_ci: Check = %+v, %v, want its keys exact (the invalid index not read)", plan, err)
	}
}

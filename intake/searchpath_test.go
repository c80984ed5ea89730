package intake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// lookAlikes are functions a role that may create in public plants there,
// each named like a built-in intake calls and each an exact match for a
// call written unqualified with an integer literal or a narrower type
// (hash_record_extended(record, integer) beats pg_catalog's (record,
// bigint) even with pg_catalog first on the path), or a looser signature
// for the lock functions. Each writes its name into side when called.
const lookAlikes = `
CREATE TABLE public.side (fn text NOT NULL);
GRANT INSERT ON public.side TO PUBLIC;
CREATE FUNCTION public.hash_record_extended(record, integer) RETURNS bigint LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('hash_record_extended'); RETURN 0; END$$;
CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('hashtextextended'); RETURN 42; END$$;
CREATE FUNCTION public.pg_advisory_xact_lock(numeric) RETURNS void LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('pg_advisory_xact_lock'); END$$;
CREATE FUNCTION public.pg_advisory_lock(numeric) RETURNS void LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('pg_advisory_lock'); END$$;
CREATE FUNCTION public.pg_try_advisory_lock(numeric) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('pg_try_advisory_lock'); RETURN true; END$$;
CREATE FUNCTION public.pg_advisory_unlock(numeric) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('pg_advisory_unlock'); RETURN true; END$$;
CREATE FUNCTION public.jsonb_build_object(text, text) RETURNS jsonb LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('jsonb_build_object(text, text)'); RETURN '{}'; END$$;
CREATE FUNCTION public.jsonb_build_object(VARIADIC text[]) RETURNS jsonb LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('jsonb_build_object(VARIADIC text[])'); RETURN '{}'; END$$;
CREATE FUNCTION public.jsonb_build_object(text, bigint, text, text, text, text, text, text, text, text, text, bigint,
    text, bigint, text, bigint, text, bigint, text, bigint, text, integer) RETURNS jsonb LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('jsonb_build_object(a file event''s payload)'); RETURN '{}'; END$$;
CREATE FUNCTION public.jsonb_build_array(text, text) RETURNS jsonb LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('jsonb_build_array'); RETURN '[]'; END$$;
CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('unnest(text[])'); RETURN QUERY SELECT * FROM pg_catalog.unnest($1); END$$;
CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('unnest(bigint[])'); RETURN QUERY SELECT * FROM pg_catalog.unnest($1); END$$;
CREATE FUNCTION public.quote_ident(name) RETURNS text LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('quote_ident'); RETURN pg_catalog.quote_ident($1::text); END$$;
CREATE FUNCTION public.cardinality(smallint[]) RETURNS integer LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('cardinality'); RETURN pg_catalog.cardinality($1); END$$;
CREATE FUNCTION public.power(integer, integer) RETURNS double precision LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('power'); RETURN 1; END$$;
CREATE FUNCTION public.pg_terminate_backend(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.side VALUES ('pg_terminate_backend'); RETURN false; END$$;
`

// A role that may create in a schema on the daemon's path (GRANT CREATE
// ON SCHEMA public, the default before PostgreSQL 15) plants look-alikes
// of the built-ins intake calls; files then land through the daemon on
// the pool it runs with (intake.PoolConfig). None of the look-alikes
// runs: the rows carry the row hash PostgreSQL's own
// hash_record_extended gives them, and the worker ids' advisory locks are
// the keys pg_catalog's hashtextextended gives, one per worker id.
func TestLookAlikeBuiltinsInASchemaOnThePathNeverRun(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	var db string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	attacker := "attacker_" + db
	exec(t, admin, fmt.Sprintf(`CREATE ROLE %[1]s NOLOGIN; GRANT CREATE, USAGE ON SCHEMA public TO %[1]s;
		SET ROLE %[1]s; %[2]s RESET ROLE`, attacker, lookAlikes))
	t.Cleanup(func() {
		admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, attacker))
	})

	daemonPool := func(worker string) *pgxpool.Pool {
		pc, err := intake.PoolConfig(url, worker, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		testenv.ClosePoolAtCleanup(t, pool)
		return pool
	}
	noneRan := func(when string) {
		t.Helper()
		if ran := testenv.Strings(t, admin, `SELECT DISTINCT fn FROM public.side ORDER BY 1`); len(ran) != 0 {
			t.Errorf("%s: look-alikes in public ran as the daemon's role: %v", when, ran)
		}
	}
	poll := func(r *rig, when string) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := r.d.PollOnce(pctx, "sp"); err != nil {
			noneRan(when)
			t.Fatalf("%s: %v", when, err)
		}
	}
	site := testenv.NewSite(t, "sp")
	r := newRig(t, daemonPool("w1"), "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("S", 5))
	poll(r, "first file")
	// the second file changes three rows of the first: the merge reads
	// the stored rows' hashes
	site.Drop(t, "orders-2.csv", header+
		"S-1,c1@example.com,99.00,shipped,2026-11-02T10:00:00Z,1\n"+
		"S-2,c2@example.com,20.02,paid,2026-11-03T10:00:00Z,\n"+
		"S-3,changed@example.com,30.03,paid,2026-11-04T10:00:00Z,3\n"+
		"S-4,c4@example.com,40.04,paid,2026-11-05T10:00:00Z,4\n")
	poll(r, "second file")
	// the third has a rejected row: its rejected_rows event's payload
	site.Drop(t, "orders-3.csv", header+
		"S-6,c6@example.com,60.06,paid,2026-11-07T10:00:00Z,6\n"+
		"S-7,c7@example.com,70.07,lost,2026-11-08T10:00:00Z,7\n")
	poll(r, "third file")
	noneRan("three files")
	fs := files(t, admin, "sp")
	if len(fs) != 3 || fs[0].State != "archived" || fs[1].State != "archived" || fs[2].State != "archived" ||
		fs[0].Applied != 5 || fs[1].Applied != 3 || fs[1].Unchanged != 1 || fs[2].Applied != 1 || fs[2].Rejected != 1 {
		t.Errorf("files %+v, want all archived: 5 applied; 3 applied and 1 unchanged; 1 applied and 1 rejected", fs)
	}
	if got := testenv.Strings(t, admin, `SELECT event || ' ' || coalesce(payload->>'rows_rejected', 'none') FROM intake_outbox WHERE partner_id = 'sp'`); len(got) != 1 || got[0] != "rejected_rows 1" {
		t.Errorf("events %v, want the third file's rejected_rows with its payload", got)
	}
	// intake's row hash: pg_catalog's hash of the send form of the
	// feed's columns other than the key
	if bad := testenv.Strings(t, admin, `SELECT order_id FROM orders WHERE partner_id = 'sp'
		AND intake_row_hash IS DISTINCT FROM pg_catalog.hash_record_extended(
		    ROW(pg_catalog.record_send(ROW(email, amount, status, placed_at, qty))), 0::int8)
		ORDER BY order_id`); len(bad) != 0 {
		t.Errorf("rows %v carry a row hash other than PostgreSQL's", bad)
	}
	if n := count(t, admin, `SELECT count(*) FROM orders WHERE partner_id = 'sp'`); n != 6 {
		t.Errorf("%d rows landed, want 6", n)
	}
	if a, _ := amountOf(t, admin, "orders", "sp", "S-1"); a != "99.00" {
		t.Errorf("S-1 amount %s, want the second file's 99.00", a)
	}

	// a second worker id in the same database holds a lock of its own key
	r2 := newRig(t, daemonPool("w2"), "w2", site)
	if err := intake.HoldWorkerID(ctx, r2.d); err != nil {
		t.Errorf("worker w2 beside w1: %v", err)
	}
	keys := testenv.Strings(t, admin, `SELECT ((l.classid::int8 << 32) | l.objid::int8)::text FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = pg_catalog.current_database())
		ORDER BY 1`)
	want := testenv.Strings(t, admin, `SELECT pg_catalog.hashtextextended('partner-intake/worker/' || w, 0::int8)::text
		FROM pg_catalog.unnest(ARRAY['w1', 'w2']::text[]) w ORDER BY 1`)
	if fmt.Sprint(keys) != fmt.Sprint(want) || want[0] == want[1] {
		t.Errorf("advisory locks held %v, want the worker ids' keys %v", keys, want)
	}
	noneRan("a second worker id")
}

package intake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// An intake waits for its retry with its bytes in the spool after its
// file left processing/ (removed by hand), and the partner delivers a new
// file under the same name. The new file is claimed to the path the
// waiting intake still owns ("new_claim"), or lands there otherwise
// ("placed_there"). It must never be archived as the waiting intake's
// file, nor left without an intake of its own: the waiting intake ends
// without an archive copy (its bytes are in the spool), and the new file
// is claimed or adopted under an intake of its own (here a batch conflict:
// the same name with other bytes, held for ops with its receipt).
//
// On a server whose RENAME overwrites, the new file claimed to the busy
// path is not put back into ready/ (where the partner may publish the
// same name meanwhile): it waits in processing/ and is adopted once the
// path is free, with the same outcome.
func TestANewFileUnderABusyClaimPathGetsAnIntakeOfItsOwn(t *testing.T) {
	for _, overwrites := range []bool{false, true} {
		for _, how := range []string{"new_claim", "placed_there"} {
			t.Run(fmt.Sprintf("%s, rename overwrites %v", how, overwrites), func(t *testing.T) { busyClaimPath(t, how, overwrites) })
		}
	}
}

func busyClaimPath(t *testing.T, how string, overwrites bool) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "busy")
	if overwrites {
		var srv *sftpd.Server
		srv, site = testenv.NewInProcessSite(t, "busy")
		srv.RenameOverwrites()
	}
	r := newRig(t, pool, "w1", site)
	const name = "orders-20261101.csv"
	site.Drop(t, name, goodRows("A", 3))
	if err := fault.Set("apply:mid_chunk=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "busy"); err == nil {
		t.Fatal("the first file's apply went through")
	}
	fault.Set("")
	fs := files(t, pool, "busy")
	if len(fs) != 1 || fs[0].State != "applying" {
		t.Fatalf("rows %+v, want the first file applying", fs)
	}
	first := fs[0].ID
	// it waits for its next attempt; its file leaves processing/
	execArgs(t, pool, `UPDATE file_intake SET next_attempt_at = now() + interval '1 hour' WHERE intake_id = $1`, first)
	claimed := filepath.Join(site.Root, "processing", "w1", name)
	if err := os.Remove(claimed); err != nil {
		t.Fatal(err)
	}

	second := goodRows("B", 2)
	switch how {
	case "new_claim":
		site.Drop(t, name, second)
		r.poll("busy")
		if overwrites {
			// never moved into ready/: it waits at the path, not adopted
			// while the first intake owns it
			if got := site.Files(t, "ready"); len(got) != 0 {
				t.Fatalf("ready/ holds %v, want the new file kept in processing/", got)
			}
			if got := site.Read(t, filepath.Join("processing", "w1", name)); got != second {
				t.Fatalf("the busy path holds %q, want the new file", got)
			}
			break
		}
		if got := site.Files(t, filepath.Join("processing", "w1")); len(got) != 0 {
			t.Fatalf("processing/w1 holds %v: the new file sits at the busy path", got)
		}
		if got := site.Files(t, "ready"); len(got) != 1 {
			t.Fatalf("ready/ holds %v, want the new file waiting there", got)
		}
	case "placed_there":
		if err := os.WriteFile(claimed, []byte(second), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// the first intake's retry falls due; then the polls go on
	execArgs(t, pool, `UPDATE file_intake SET next_attempt_at = now() WHERE intake_id = $1`, first)
	r.poll("busy")
	r.poll("busy")
	fs = files(t, pool, "busy")
	// the same batch with other bytes: the new file is held as a batch
	// conflict under its own intake, its bytes in quarantine/
	if len(fs) != 2 || fs[0].ID != first || fs[0].State != "archived" || fs[0].Archive != "" ||
		fs[1].State != "quarantined" || fs[1].Reason != "batch_conflict" || fs[1].Archive == "" {
		t.Fatalf("rows %+v, want the first archived without an archive copy, the new file held under an intake of its own", fs)
	}
	if got := site.Read(t, site.Rel(t, fs[1].Archive)); got != second {
		t.Fatal("the new file's intake holds other bytes than the new file's")
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'busy' AND last_intake_id = $1`, first); n != 3 {
		t.Fatalf("%d rows of the first file in the target, want 3", n)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}

// A file of the name a poll resumes waits in ready/ for the next poll,
// which claims it under an intake of its own: claimed beside the resumed
// run (whose file left processing/), it lands at the path that run
// archives from, and, the same size and mtime as the earlier file was
// listed with, is archived as that file, never applied.
func TestAFileOfTheNameAPollResumesWaitsForTheNextPoll(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "busy")
	r := newRig(t, pool, "w1", site)
	const name = "orders-20261101.csv"
	site.Drop(t, name, goodRows("A", 3))
	st, err := os.Stat(filepath.Join(site.Root, "ready", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := fault.Set("apply:mid_chunk=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "busy"); err == nil {
		t.Fatal("the first file's apply went through")
	}
	fault.Set("")
	first := files(t, pool, "busy")[0].ID
	if err := os.Remove(filepath.Join(site.Root, "processing", "w1", name)); err != nil {
		t.Fatal(err)
	}
	waitDue(t, pool, "busy")
	// the new file as the first was listed: same size, same mtime
	second := goodRows("B", 3)
	site.Drop(t, name, second)
	if err := os.Chtimes(filepath.Join(site.Root, "ready", name), st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}

	// the resumed run waits before its archive while the claims go on; a
	// claim of the name would wait right after its rename
	resume := r.pollPaused("busy", "apply:after_commit", "claim:after_rename")
	skipped := func() float64 {
		return testutil.ToFloat64(r.d.Metrics().Skipped.WithLabelValues("busy", "claim_target_busy"))
	}
	claimed := false
	waitFor(t, "the claims to pass over the resumed name", func() bool {
		select {
		case <-fault.Paused("claim:after_rename"):
			claimed = true
			return true
		default:
			return skipped() == 1
		}
	})
	if claimed {
		// the resumed run archives from the path the new file was just
		// renamed to, then the claim records it
		fault.Resume("apply:after_commit")
		waitFor(t, "the resumed run to end", func() bool { return files(t, pool, "busy")[0].State == "archived" })
		fault.Resume("claim:after_rename")
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	fault.Set("")
	r.poll("busy")
	fs := files(t, pool, "busy")
	if len(fs) != 2 || fs[0].ID != first || fs[0].State != "archived" || fs[0].Archive != "" ||
		fs[1].State != "quarantined" || fs[1].Reason != "batch_conflict" || site.Read(t, site.Rel(t, fs[1].Archive)) != second {
		t.Fatalf("rows %+v, want the first archived without an archive copy, the new file held under an intake of its own", fs)
	}
}

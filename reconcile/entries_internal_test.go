package reconcile

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Every row that judges an entry by its row's state names every state of
// the ledger: a state added to the ledger and to no row's table fails here.
func TestEveryEntryRowNamesEveryState(t *testing.T) {
	for name, e := range map[string]entries{"quarantine": quarantineEntries, "archive": archiveEntries} {
		for _, s := range ledger.States() {
			if _, ok := e[s]; !ok {
				t.Errorf("the %s row does not say whether a row in state %s may have an entry there", name, s)
			}
		}
		if len(e) != len(ledger.States()) {
			t.Errorf("the %s row names %d states, the ledger has %d", name, len(e), len(ledger.States()))
		}
	}
}

// Every state of the ledger, released or not, walked through the rows
// that look at quarantine/ and archive/: each row of the ledger gets a
// held file and its reason file in quarantine/, a file at its archive
// path and one under another name in archive/, and the two rows run on
// the real site. A finding for a human is raised exactly where what a
// file in that state may leave there says it must not be; nothing is
// raised for a file whose owner is moving it, or for a released file's
// reason file before it is archived.
func TestEveryStateWalkedThroughTheEntryRows(t *testing.T) {
	ctx := context.Background()
	defer func(n int) { lookupBatch = n }(lookupBatch)
	_, pool := testenv.DB(t)
	_, site := testenv.NewInProcessSite(t, "walk")
	cfg := site.Validated(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := New(Config{}, "w-walk", time.Minute, pool, nil, []partners.Config{cfg}, prometheus.NewRegistry(), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	month := time.Now().UTC().Format("2006/01")
	// The specification, in the words of the docs: quarantine/ holds the
	// files of held rows (quarantined, failed, discarded), what an owner
	// is holding or finishing right now (a live row), and a released
	// file's reason file until the file is archived; archive/ holds a
	// finished file at its archive path, and a committed file whose owner
	// is archiving it.
	humanInQuarantine := func(s ledger.State, released bool) bool {
		switch s {
		case ledger.StateArchived, ledger.StateDuplicate, ledger.StatePutBack:
			return true
		case ledger.StateAwaitingApproval:
			return !released
		}
		return false
	}
	humanInArchive := func(s ledger.State, atItsPath bool) bool {
		switch s {
		case ledger.StateApplied:
			return false
		case ledger.StateArchived, ledger.StateDuplicate:
			return !atItsPath
		}
		return true
	}
	type walked struct {
		state      ledger.State
		released   bool
		quarantine []string // remote paths
		archive    string   // at its archive path
		elsewhere  string   // another name in archive/
	}
	byID := map[int64]walked{}
	put := func(rel string) string {
		p := filepath.Join(site.Root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return "/" + rel
	}
	for _, s := range ledger.States() {
		for _, released := range []bool{false, true} {
			var id int64
			override := ""
			if released {
				override = ledger.OverrideNothing
			}
			name := fmt.Sprintf("orders-%s-%t.csv", s, released)
			if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
				batch_id, content_sha256, state, worker_id, lease_until, release_override)
				VALUES ('walk', 'orders', $1, '/processing/w-live/' || $1, 2, $1, repeat('ab', 32), $2, 'w-live',
				        pg_catalog.now() + interval '1 hour', nullif($3, '')) RETURNING intake_id`, name, string(s), override).Scan(&id); err != nil {
				t.Fatal(err)
			}
			w := walked{state: s, released: released}
			held := fmt.Sprintf("quarantine/%d.%s", id, name)
			w.quarantine = []string{put(held), put(held + sitefile.ReasonSuffix)}
			w.archive = put(fmt.Sprintf("archive/%s/%s.abababababab.%d.csv", month, name[:len(name)-4], id))
			w.elsewhere = put(fmt.Sprintf("archive/%s/%s.abababababab.%d.1.csv", month, name[:len(name)-4], id))
			if _, err := pool.Exec(ctx, `UPDATE file_intake SET archive_path = $2 WHERE intake_id = $1`, id, w.archive); err != nil {
				t.Fatal(err)
			}
			byID[id] = w
		}
	}
	sess, err := sftpconn.Dial(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	// the entries' rows looked up a few to a query (batches' edges) and
	// all in one
	for _, batch := range []int{7, 10_000} {
		lookupBatch = batch
		var fs []ledger.Finding
		add := func(f ledger.Finding) { fs = append(fs, f) }
		if err := r.rowQuarantineWithoutRecord(ctx, &cfg, sess, add); err != nil {
			t.Fatal(err)
		}
		if err := r.rowArchiveWithoutRecord(ctx, &cfg, sess, add); err != nil {
			t.Fatal(err)
		}
		raised := map[string]ledger.Finding{}
		for _, f := range fs {
			if !f.NeedsHuman {
				t.Errorf("a finding of these rows that asks nothing of a human: %+v", f)
			}
			raised[f.Path] = f
		}
		for id, w := range byID {
			check := func(p string, want bool, kind string) {
				t.Helper()
				f, got := raised[p]
				switch {
				case got != want:
					t.Errorf("intake %d in state %s (released %t): %s raised %t, want %t", id, w.state, w.released, p, got, want)
				case got && (f.Kind != kind || f.IntakeID != id || !strings.Contains(f.Detail, string(w.state)) && !strings.Contains(f.Detail, "another name")):
					t.Errorf("intake %d: finding %+v", id, f)
				}
			}
			for _, q := range w.quarantine {
				check(q, humanInQuarantine(w.state, w.released), ledger.KindQuarantineNoRecord)
			}
			check(w.archive, humanInArchive(w.state, true), ledger.KindArchiveNoRecord)
			check(w.elsewhere, humanInArchive(w.state, false), ledger.KindArchiveNoRecord)
		}
		if len(raised) == 0 {
			t.Fatal("nothing was raised at all")
		}
	}
}

// An entry a listing found stale is raised only if it is still there once
// its row has been read again: an owner that archived the file (removing
// its reason file, then recording the state) between the listing and the
// look-up leaves no finding behind.
func TestAStaleEntryGoneOnTheSecondLookIsNotRaised(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	_, site := testenv.NewInProcessSite(t, "again")
	cfg := site.Validated(t)
	r, err := New(Config{}, "w-again", time.Minute, pool, nil, []partners.Config{cfg}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		VALUES ('again', 'orders', 'orders-1.csv', '/processing/w/orders-1.csv', 2, 'archived', 'w', pg_catalog.now()) RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	in, err := r.ledger.Get(ctx, "again", id)
	if err != nil || in == nil {
		t.Fatal(in, err)
	}
	sess, err := sftpconn.Dial(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	reason := fmt.Sprintf("quarantine/%d.orders-1.csv%s", id, sitefile.ReasonSuffix)
	p := filepath.Join(site.Root, reason)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("{}"), 0o644)
	var fs []ledger.Finding
	add := func(f ledger.Finding) { fs = append(fs, f) }
	found := []staleEntry{{path: "/" + reason, in: in}}
	if err := r.raiseStale(ctx, &cfg, sess, ledger.KindQuarantineNoRecord, quarantineEntries, found, add); err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 {
		t.Fatalf("a reason file of an archived row still there: findings %+v, want one", fs)
	}
	os.Remove(p)
	fs = nil
	if err := r.raiseStale(ctx, &cfg, sess, ledger.KindQuarantineNoRecord, quarantineEntries, found, add); err != nil {
		t.Fatal(err)
	}
	if len(fs) != 0 {
		t.Fatalf("an entry gone on the second look was raised: %+v", fs)
	}
}

// Every state of the ledger walked through the rows that look at
// processing/: a row in each state claimed a file in the processing dir
// of a worker that is gone, its lease long over, and the file is still
// there. A live row is taken over (outcome_unknown waits for its own row,
// resolved from the chunk ledger); awaiting_approval still owns its path
// and is left alone; a row in any other state owns nothing there any
// more, so the file is a claim without a row and is adopted. None of it
// needs a human.
func TestEveryStateWalkedThroughTheProcessingRows(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	_, site := testenv.NewInProcessSite(t, "walkp")
	cfg := site.Validated(t)
	r, err := New(Config{}, "w-walkp", time.Minute, pool, nil, []partners.Config{cfg}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	byPath := map[string]ledger.State{}
	for _, s := range ledger.States() {
		name := fmt.Sprintf("orders-%s.csv", s)
		rel := "processing/w-gone/" + name
		p := filepath.Join(site.Root, filepath.FromSlash(rel))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
			VALUES ('walkp', 'orders', $1, $2, 2, $3, 'w-gone', pg_catalog.now() - interval '1 hour')`, name, "/"+rel, string(s)); err != nil {
			t.Fatal(err)
		}
		byPath["/"+rel] = s
	}
	sess, err := sftpconn.Dial(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := sftpconn.EnsureDirs(sess.Client, sess.Layout, r.worker); err != nil { // as a run does first
		t.Fatal(err)
	}
	var fs []ledger.Finding
	add := func(f ledger.Finding) { fs = append(fs, f) }
	if err := r.rowExpiredLeases(ctx, &cfg, sess, add); err != nil {
		t.Fatal(err)
	}
	if err := r.rowOrphanClaims(ctx, &cfg, sess, add); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fs {
		if f.NeedsHuman {
			t.Errorf("a finding for a human: %+v", f)
		}
		got[f.Path] = f.Kind
	}
	for p, s := range byPath {
		want := ledger.KindOrphanClaim
		switch s {
		case ledger.StateClaimed, ledger.StateSpooled, ledger.StateApplying, ledger.StateApplied:
			want = ledger.KindLeaseExpired
		case ledger.StateOutcomeUnknown, ledger.StateAwaitingApproval:
			want = ""
		}
		if got[p] != want {
			t.Errorf("a %s row's file at %s: finding %q, want %q", s, p, got[p], want)
		}
	}
}

package intake

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"slices"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// A replay writes as the file it replays (its place), so a row a newer
// file wrote is a newer_write conflict of it. A row a newer file found as
// it said carries no mark of that file, though: where the replayed file
// did not write the row the first time (its mapping or the target
// rejected it, the usual reason to replay after a fix), the replay would
// set it to the older file's value. So before its rows apply, a replay of
// an upsert or update_only feed looks at the rows it may write for the
// first time (the lines its original's run rejected, valid now) and at
// the files of the table newer than its place that have applied or may
// be judging rows: a key one of them names is held back as a newer_write
// conflict, and so is every such key when a newer file's bytes cannot be
// read (the spool purged them, its feed is gone, it is still downloading)
// or a newer file is a snapshot (it names every key, those it deleted
// too). A newer file that begins its apply after the replay's row exists
// counts the replay an older writer and claims the rows it finds as they
// are (claimBelow).

// heldBack is the set of keys a replay holds back, by a hash of their
// values in the order of the feed's sorted key names (a collision holds
// back one more row, never writes one).
type heldBack struct {
	seed maphash.Seed
	keys map[uint64]struct{}
	// unread: at least one newer file could not be read, so every key
	// the replay writes for the first time is held back
	unread bool
}

// keyHash hashes the key of a row of feed f.
func (h *heldBack) keyHash(f *partners.Feed, vals []string) uint64 {
	var mh maphash.Hash
	mh.SetSeed(h.seed)
	for _, i := range sortedKeyIndexes(f) {
		mh.WriteString(vals[i])
		mh.WriteByte(0)
	}
	return mh.Sum64()
}

// holds reports whether the replay holds a valid row back.
func (h *heldBack) holds(f *partners.Feed, row *rows.Row) bool {
	if h == nil || len(h.keys) == 0 {
		return false
	}
	_, ok := h.keys[h.keyHash(f, row.Values)]
	return ok
}

// sortedKeyIndexes are the positions of f's key columns, by key name:
// feeds that write one table may list its columns in other orders.
func sortedKeyIndexes(f *partners.Feed) []int {
	names := slices.Sorted(slices.Values(f.Key))
	idx := make([]int, 0, len(names))
	for _, n := range names {
		idx = append(idx, slices.IndexFunc(f.Columns, func(c partners.Column) bool { return c.Name == n }))
	}
	return idx
}

// replayHeldBack works out what a replay holds back (nil: nothing). A
// snapshot's replay is judged whole instead (SupersededBy).
func (r *applyStage) replayHeldBack(ctx context.Context) (*heldBack, error) {
	in := r.in
	if in.ReplayOf == 0 || r.feed.Mode == partners.ModeSnapshot {
		return nil, nil
	}
	lines, err := ledger.FirstRejectedLines(ctx, r.d.db, in.ReplayOf)
	if err != nil || len(lines) == 0 {
		return nil, err
	}
	newer, err := ledger.NewerOnTable(ctx, r.d.db, in.Partner, r.p.cfg.FeedsOn(r.feed.Target), in.ReplayOf, in.ID)
	if err != nil || len(newer) == 0 {
		return nil, err
	}
	h := &heldBack{seed: maphash.MakeSeed(), keys: map[uint64]struct{}{}}
	// the keys the replay may write for the first time
	first := map[uint64]struct{}{}
	err = r.eachValidRow(r.in.DataSHA256, r.feed, func(row *rows.Row) bool {
		if _, ok := slices.BinarySearch(lines, row.Line); ok {
			first[h.keyHash(r.feed, row.Values)] = struct{}{}
		}
		return row.Line < lines[len(lines)-1]
	})
	if err != nil {
		return nil, fmt.Errorf("replay: its own rows: %w", err)
	}
	for _, f := range newer {
		if len(first) == 0 {
			break
		}
		feed := r.p.cfg.Feed(f.Feed)
		var err error
		if feed != nil && feed.Mode != partners.ModeSnapshot && f.DataSHA256 != "" {
			err = r.newerRows(f, feed, func(row *rows.Row) bool {
				k := h.keyHash(feed, row.Values)
				if _, ok := first[k]; ok {
					h.keys[k] = struct{}{}
					delete(first, k)
				}
				return len(first) > 0
			})
		}
		var fe *rows.FileError
		if feed == nil || feed.Mode == partners.ModeSnapshot || f.DataSHA256 == "" || errors.Is(err, errUnread) || errors.As(err, &fe) {
			// a snapshot names every key (those it deleted too); a file
			// not read (its bytes not yet known, or gone from the spool,
			// its feed gone, or no longer read under the feed as
			// configured now) may have named any
			h.unread = h.unread || feed == nil || feed.Mode != partners.ModeSnapshot
			for k := range first {
				h.keys[k] = struct{}{}
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("replay: the rows of newer intake %d: %w", f.ID, err)
		}
	}
	if len(h.keys) == 0 {
		return nil, nil
	}
	r.log.Info("replay holds back rows a newer file of the table named or may have named",
		"rows_keys", len(h.keys), "newer_files", len(newer), "newer_unread", h.unread)
	return h, nil
}

// errUnread: a newer file's rows cannot be read, its bytes gone from the
// spool.
var errUnread = errors.New("not in the spool")

// newerRows reads the valid rows of a newer file of the table: from the
// spool, its expanded or decrypted copy made again from its original
// when that copy was dropped once the file finished (and dropped again
// after, unless another intake reads it).
func (r *applyStage) newerRows(f ledger.NewerFile, feed *partners.Feed, fn func(*rows.Row) bool) error {
	sp, partner := r.d.spool, r.in.Partner
	if sp.Has(partner, f.DataSHA256, f.DataSize) {
		return r.eachValidRow(f.DataSHA256, feed, fn)
	}
	if f.SHA256 == f.DataSHA256 || !sp.Has(partner, f.SHA256, f.Size) {
		return errUnread
	}
	job := unwrap.Job{Spool: sp, Partner: partner, Feed: feed, Name: f.RemoteName,
		MaxBytes: r.p.cfg.Limits.MaxExpandedBytes, MaxRatio: r.p.cfg.Limits.MaxExpansionRatio, MinFree: r.d.cfg.SpoolMinFree}
	data, held, err := job.Run(spool.Entry{Partner: partner, SHA256: f.SHA256, Size: f.Size})
	if err != nil {
		return err
	}
	if held != nil || data.SHA256 != f.DataSHA256 {
		if held == nil {
			r.dropIfUnused(data)
		}
		return errUnread
	}
	defer r.dropIfUnused(data)
	return r.eachValidRow(data.SHA256, feed, fn)
}

// dropIfUnused removes an expanded copy from the spool unless an
// unfinished intake of the partner reads the same bytes.
func (r *applyStage) dropIfUnused(e spool.Entry) {
	probe := ledger.Intake{ID: r.in.ID, Partner: r.in.Partner, DataSHA256: e.SHA256}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	busy, err := r.d.ledger.DataInUse(ctx, &probe)
	if err == nil && !busy {
		err = r.d.spool.Remove(r.in.Partner, e.SHA256)
	}
	if err != nil {
		r.log.Warn("a newer file's expanded copy not removed from the spool; purge removes it at retention", "err", err)
	}
}

// eachValidRow reads the spooled file sha as a file of feed and calls fn
// with each valid row until fn returns false.
func (r *applyStage) eachValidRow(sha string, feed *partners.Feed, fn func(*rows.Row) bool) error {
	f, err := r.d.spool.Open(r.in.Partner, sha)
	if err != nil {
		return err
	}
	defer f.Close()
	rd, err := rows.NewReader(f, feed, 0)
	if err != nil {
		return err
	}
	for {
		row, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if row.Issue == nil && !fn(row) {
			return nil
		}
	}
}

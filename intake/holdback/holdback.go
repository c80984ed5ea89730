// Package holdback works out which rows a replay holds back: the rows it
// may write for the first time whose keys a newer file of the table named.
//
// A replay writes as the file it replays (its place), so a row a newer
// file wrote is a newer_write conflict of it. A row a newer file found as
// it said carries no mark of that file, though: where the replayed file
// did not write the row the first time (its mapping or the target
// rejected it, the usual reason to replay after a fix), the replay would
// set it to the older file's value. So before its rows apply, a replay of
// an upsert or update_only feed looks at the rows it may write for the
// first time (the lines its original's run rejected, valid now; every
// row once those lines are purged, retention.row_issues) and at the
// files of the table newer than its place that have applied or may be
// judging rows: a key one of them names is held back as a newer_write
// conflict. Every such key is held back when a newer file cannot be read
// (its bytes neither in this spool nor archived on the site, it is still
// downloading, its feed is gone, or a row it judged no longer reads under
// its feed as configured now) or is a snapshot (it names every key, those
// it deleted too). A newer file that begins its apply after the replay's
// row exists counts the replay an older writer and claims the rows it
// finds as they are (intake/apply.go claimBelow).
package holdback

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
	"github.com/partner-intake/partner-intake/spool"
)

// Keys is the set of keys a replay holds back, by a hash of their values
// in the order of the feed's sorted key names (a collision holds back one
// more row, never writes one): sorted, 8 bytes a key.
type Keys struct {
	seed maphash.Seed
	keys []uint64
	// unread: a newer file could not be read, so every key the replay
	// writes for the first time is held back
	unread bool
}

// Unread reports whether a newer file could not be read as it judged its
// rows: every row the replay writes for the first time is held back.
func (h *Keys) Unread() bool { return h != nil && h.unread }

// keyHash hashes the key of a row of feed f.
func (h *Keys) keyHash(f *partners.Feed, vals []string) uint64 {
	var mh maphash.Hash
	mh.SetSeed(h.seed)
	for _, i := range sortedKeyIndexes(f) {
		mh.WriteString(vals[i])
		mh.WriteByte(0)
	}
	return mh.Sum64()
}

// Holds reports whether the replay holds a valid row of feed f back.
func (h *Keys) Holds(f *partners.Feed, row *rows.Row) bool {
	if h == nil {
		return false
	}
	_, ok := slices.BinarySearch(h.keys, h.keyHash(f, row.Values))
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

// Replay is what Look needs of a replay being applied.
type Replay struct {
	// DB is the ledger's database.
	DB interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
		QueryRow(context.Context, string, ...any) pgx.Row
	}
	Spool   *spool.Spool
	Partner *partners.Config
	Feed    *partners.Feed    // the replay's feed
	In      *ledger.Intake    // the replay's row
	Site    *sftpconn.Session // where archived copies are read; nil: none
	MinFree int64             // the spool's free-space floor (spool.min_free_bytes)
	// Drop removes a copy Look made in the spool unless another intake
	// reads the same bytes.
	Drop func(spool.Entry)
	Log  *slog.Logger
}

// Look works out what a replay holds back (nil: nothing). A snapshot's
// replay is judged whole instead (ledger.SupersededBy).
func Look(ctx context.Context, r Replay) (*Keys, error) {
	in := r.In
	if in.ReplayOf == 0 || r.Feed.Mode == partners.ModeSnapshot {
		return nil, nil
	}
	lines, complete, err := ledger.RejectedLines(ctx, r.DB, in.ReplayOf, false)
	if err != nil || complete && len(lines) == 0 {
		return nil, err
	}
	var configured []string
	for _, f := range r.Partner.Feeds {
		configured = append(configured, f.Name)
	}
	newer, err := ledger.NewerOnTable(ctx, r.DB, in.Partner, r.Partner.FeedsOn(r.Feed.Target), configured, in.ReplayOf, in.ID)
	if err != nil || len(newer) == 0 {
		return nil, err
	}
	h := &Keys{seed: maphash.MakeSeed()}
	// the keys the replay may write for the first time
	var first []uint64
	err = r.eachRow(ctx, in.DataSHA256, r.Feed, func(row *rows.Row) bool {
		if row.Issue != nil {
			return true
		}
		if _, ok := slices.BinarySearch(lines, row.Line); ok || !complete {
			first = append(first, h.keyHash(r.Feed, row.Values))
		}
		return !complete || row.Line < lines[len(lines)-1]
	})
	if err != nil {
		return nil, fmt.Errorf("replay: its own rows: %w", err)
	}
	slices.Sort(first)
	first = slices.Compact(first)
	named := make([]bool, len(first))
	left := len(first)
	for _, f := range newer {
		if left == 0 {
			break
		}
		feed := r.Partner.Feed(f.Feed)
		readable := feed != nil && feed.Mode != partners.ModeSnapshot && f.DataSHA256 != ""
		if readable {
			err := r.newerRows(ctx, f, feed, func(row *rows.Row) bool {
				if i, ok := slices.BinarySearch(first, h.keyHash(feed, row.Values)); ok && !named[i] {
					named[i] = true
					left--
				}
				return left > 0
			})
			if errors.Is(err, errUnread) {
				readable = false
			} else if err != nil {
				return nil, fmt.Errorf("replay: the rows of newer intake %d: %w", f.ID, err)
			}
		}
		if !readable {
			h.unread = feed == nil || feed.Mode != partners.ModeSnapshot
			for i := range named {
				named[i] = true
			}
			left = 0
		}
	}
	for i, k := range first {
		if named[i] {
			h.keys = append(h.keys, k)
		}
	}
	if len(h.keys) == 0 {
		return nil, nil
	}
	r.Log.Info("replay holds back rows a newer file of the table named or may have named",
		"keys", len(h.keys), "newer_files", len(newer), "newer_unread", h.unread)
	return h, nil
}

// errUnread: a newer file's rows cannot be read as it judged them.
var errUnread = errors.New("a newer file cannot be read")

// newerRows calls fn with the valid rows of a newer file of the table
// until fn returns false. Its bytes come from the spool (its expanded or
// decrypted copy made again from its original when that copy was dropped
// once the file finished), else from its archived copy on the site,
// which is only read and kept in the spool as originals are; an expanded
// copy made here is dropped after, unless another intake reads it. errUnread: no copy of its bytes, or a
// row it did not reject no longer reads as valid under its feed as
// configured now (what the file named there is not known).
func (r Replay) newerRows(ctx context.Context, f ledger.NewerFile, feed *partners.Feed, fn func(*rows.Row) bool) error {
	sp, partner := r.Spool, r.In.Partner
	if !sp.Has(partner, f.DataSHA256, f.DataSize) {
		if f.SHA256 == "" {
			return errUnread
		}
		if !sp.Has(partner, f.SHA256, f.Size) {
			if f.ArchivePath == "" || r.Site == nil {
				return errUnread
			}
			orig, err := sp.Put(partner, f.Size, f.Size, func(w io.Writer) (int64, error) {
				rf, err := r.Site.Open(f.ArchivePath)
				if err != nil {
					return 0, err
				}
				defer rf.Close()
				return rf.WriteTo(w)
			})
			if err != nil || orig.SHA256 != f.SHA256 {
				// gone from the archive, or other bytes there now
				if err == nil {
					r.Drop(orig)
				}
				return errUnread
			}
			// the file's original is kept, as the spool keeps every
			// original until retention's purge
		}
		if f.DataSHA256 != f.SHA256 {
			job := unwrap.Job{Spool: sp, Partner: partner, Feed: feed, Name: f.RemoteName, DropPlain: r.Drop,
				MaxBytes: r.Partner.Limits.MaxExpandedBytes, MaxRatio: r.Partner.Limits.MaxExpansionRatio, MinFree: r.MinFree}
			data, held, err := job.Run(spool.Entry{Partner: partner, SHA256: f.SHA256, Size: f.Size})
			if err != nil {
				return err // the spool's disk: the replay's attempt is retried
			}
			if held != nil {
				// not made again (a key gone, a limit lower now): what the
				// file named is not known
				return errUnread
			}
			defer r.Drop(data)
			if data.SHA256 != f.DataSHA256 {
				return errUnread
			}
		}
	}
	judged, complete, err := ledger.RejectedLines(ctx, r.DB, f.ID, true)
	if err != nil {
		return err
	}
	unread := false
	err = r.eachRow(ctx, f.DataSHA256, feed, func(row *rows.Row) bool {
		if row.Issue == nil {
			return fn(row)
		}
		if _, ok := slices.BinarySearch(judged, row.Line); !ok || !complete {
			unread = true
			return false
		}
		return true
	})
	var fe *rows.FileError
	if unread || errors.As(err, &fe) {
		return errUnread
	}
	return err
}

// eachRow reads the spooled file sha as a file of feed and calls fn with
// each row, valid or not, until fn returns false.
func (r Replay) eachRow(ctx context.Context, sha string, feed *partners.Feed, fn func(*rows.Row) bool) error {
	f, err := r.Spool.Open(r.In.Partner, sha)
	if err != nil {
		return err
	}
	defer f.Close()
	rd, err := rows.NewReader(f, feed, 0)
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		if n%10000 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		row, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !fn(row) {
			return nil
		}
	}
}

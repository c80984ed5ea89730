package intake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"slices"
	"sync"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/fault"
)

// fetch reads every file of the group at once (each as the fetch stage
// reads a small file: openClaimed, siteread.Small; the close left in
// flight), spools them together, records them spooled in one statement
// (spooled, as one file's download ends), and reads their rows into
// chunks. The rows are in memory only as long as the group runs: a group
// holds at most GroupFiles × 64 KiB.
func (g *fileGroup) fetch(ctx context.Context, tgt *target.Table) error {
	errs := make([]error, len(g.files))
	var wg sync.WaitGroup
	for i, f := range g.files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.data, errs[i] = g.read(f)
		}()
	}
	wg.Wait()
	var kept []*groupFile
	var data [][]byte
	for i, f := range g.files {
		if errs[i] != nil {
			g.leave(f, LeftRead, errs[i])
			continue
		}
		kept, data = append(kept, f), append(data, f.data)
	}
	g.files = kept
	if len(kept) == 0 {
		return nil
	}
	es, err := g.d.spool.PutAll(g.p.cfg.ID, data)
	if err != nil {
		return err
	}
	runs := make([]*fileRun, len(kept))
	fs := make([]ledger.Spooled, len(kept))
	for i, f := range kept {
		runs[i] = f.r
		fs[i] = ledger.Spooled{In: f.r.in, SHA256: es[i].SHA256, Size: es[i].Size, DataSHA256: es[i].SHA256, DataSize: es[i].Size,
			BatchID: batchIDOf(g.feed, f.r.in.RemoteName, g.p.nocase.Load())}
		g.d.metrics.BytesDownloaded.WithLabelValues(g.p.cfg.ID).Add(float64(es[i].Size))
	}
	fenced, err := spooled(ctx, g.d, runs, fs)
	if err != nil && !errors.Is(err, fault.ErrInjected) {
		// nothing recorded: every file is still claimed
		return g.failed(ctx, "recording the group's files spooled failed", err)
	}
	kept = kept[:0]
	for _, f := range g.files {
		switch {
		case slices.Contains(fenced, f.r):
			f.r.fencedOut("spooled (group)")
		case f.r.bound == nil || f.r.bound.Verdict != ledger.VerdictNew:
			// another intake holds the batch: a duplicate or a conflict,
			// decided alone
			g.leave(f, LeftBatchBound, nil)
		default:
			kept = append(kept, f)
		}
	}
	g.files = kept
	if err != nil {
		return err
	}
	kept = kept[:0]
	seed := maphash.MakeSeed()
	keyIdx := keyIndexes(g.feed)
	for _, f := range g.files {
		if reason := g.rows(f, tgt, seed, keyIdx); reason != "" {
			f.data = nil
			g.leave(f, reason, nil)
			continue
		}
		f.data = nil
		kept = append(kept, f)
	}
	g.files = kept
	return nil
}

// errSizeChanged: a group file's bytes are not its listed size.
var errSizeChanged = errors.New("the file's size is not the size it was listed with")

// read reads a claimed small file whole, as the fetch stage opens and
// reads one (openClaimed: the OPEN and an LSTAT together, a path that is
// not a regular file not read; siteread.Small: its bytes and the end of
// the file in one round trip), into memory: its bytes must be its listed
// size.
//
// The handle's CLOSE is not waited for (a round trip the group's result
// does not depend on: the bytes are read, and what is decided of the file
// is decided from them); it goes out at once and g.closing waits for its
// reply before the group moves its files (archive), so a server that
// refuses to rename an open file is not asked to. A CLOSE that fails
// changes nothing: the handle dies with the session at the latest.
//
// The receipt's temporary file is opened beside the OPEN
// (fileRun.prepareSite).
func (g *fileGroup) read(gf *groupFile) ([]byte, error) {
	r := gf.r
	r.prepareSite()
	release, size, _, src, err := r.fetchStage().openClaimed()
	if err != nil {
		return nil, err
	}
	g.closing.Add(1)
	defer func() {
		go func() {
			defer g.closing.Done()
			if err := fault.Check("group:close"); err != nil { // as if the CLOSE failed (the handle stays open)
				r.log.Warn("closing the claimed file's handle after its read failed; nothing depends on it", "err", err)
				return
			}
			release()
		}()
	}()
	if size != r.in.ListedSize {
		return nil, errSizeChanged
	}
	var buf bytes.Buffer
	buf.Grow(int(size) + 1)
	n, err := src(&buf)
	if err != nil {
		return nil, fmt.Errorf("read: %w", g.sess.Deadline(err))
	}
	if n != size {
		return nil, errSizeChanged
	}
	return buf.Bytes(), nil
}

// rows reads a group file's rows into its one chunk, or returns the
// reason the file leaves the group.
func (g *fileGroup) rows(f *groupFile, tgt *target.Table, seed maphash.Seed, keyIdx []int) string {
	rd, err := rows.NewReader(bytes.NewReader(f.data), g.feed, g.p.cfg.Limits.MaxRows)
	if err != nil {
		return LeftNotCSV
	}
	ch := newChunk(seed, 16, tgt)
	var total int64
	for {
		row, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return LeftNotCSV
		}
		if total++; total > int64(g.feed.ChunkRows) {
			return LeftRows
		}
		if row.Issue != nil {
			return LeftRejected
		}
		ch.span(row.Line)
		if err := ch.Add(row.Line, row.Values, row.Null, keyIdx); err != nil {
			return LeftBadValue
		}
	}
	switch {
	case total == 0:
		return LeftNoRows
	case ch.DupKeys:
		return LeftRepeatedKey
	}
	f.ch = ch
	return ""
}

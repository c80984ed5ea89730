package intake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"sync"

	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/fault"
)

// fetch reads every file of the group at once (open; one read of its
// listed size and one past it, together; the close left in flight),
// spools them together, and reads their rows into chunks. The rows are in
// memory only as long as the group runs: a group holds at most
// GroupFiles × 64 KiB.
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
	if err := fault.Check("download:mid"); err != nil {
		return err
	}
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
	for i, f := range kept {
		in := f.r.in
		in.SHA256, in.Size, in.DataSHA256, in.DataSize = es[i].SHA256, es[i].Size, es[i].SHA256, es[i].Size
		in.BatchID = batchIDOf(g.feed, in.RemoteName, g.p.nocase.Load())
		g.d.metrics.BytesDownloaded.WithLabelValues(in.Partner).Add(float64(es[i].Size))
	}
	if err := fault.Check("spool:after"); err != nil {
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

// read reads a claimed small file whole: an LSTAT of its path goes out
// beside the OPEN (answered in the OPEN's round trip) and a path that is
// not a regular file is not read (see openClaimed); after the OPEN, a READ of its
// listed size and a READ of one byte past it go out together (one round
// trip; the second must find the end of the file, else the file grew).
// One READ of size+1 bytes would cost two: a server answers it with the
// file's bytes and pkg/sftp asks again for the rest, which is the end.
//
// The handle's CLOSE is not waited for (a round trip the group's result
// does not depend on: the bytes are read, and what is decided of the file
// is decided from them); it goes out at once and g.closing waits for its
// reply before the group moves its files (archive), so a server that
// refuses to rename an open file is not asked to. A CLOSE that fails is
// logged and changes nothing: the handle dies with the session at the
// latest.
//
// The receipt's temporary file is opened beside the OPEN
// (fileRun.prepareSite).
func (g *fileGroup) read(gf *groupFile) ([]byte, error) {
	r := gf.r
	in := r.in
	r.prepareSite()
	lstat := inBackground(func() (os.FileInfo, error) { return g.sess.Lstat(in.ClaimedPath) })
	f, err := g.sess.Open(in.ClaimedPath)
	st, serr := lstat.wait()
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	g.closing.Add(1)
	defer func() {
		go func() {
			defer g.closing.Done()
			err := fault.Check("group:close") // as if the CLOSE failed (the handle stays open)
			if err == nil {
				err = g.sess.Deadline(f.Close())
			}
			if err != nil {
				r.log.Warn("closing the claimed file's handle after its read failed; nothing depends on it", "err", err)
			}
		}()
	}()
	if serr != nil {
		return nil, fmt.Errorf("lstat: %w", serr)
	}
	if !st.Mode().IsRegular() {
		// not read: the file leaves the group, and the per-file path
		// holds it (openClaimed)
		return nil, errNotRegular
	}
	buf := make([]byte, in.ListedSize)
	var past [1]byte
	var n, m int
	var errPast error
	var rd sync.WaitGroup
	rd.Add(1)
	go func() {
		defer rd.Done()
		m, errPast = f.ReadAt(past[:], in.ListedSize)
	}()
	n, err = f.ReadAt(buf, 0)
	rd.Wait()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read: %w", g.sess.Deadline(err))
	}
	if errPast != nil && !errors.Is(errPast, io.EOF) {
		return nil, fmt.Errorf("read: %w", g.sess.Deadline(errPast))
	}
	if int64(n) != in.ListedSize || m != 0 {
		return nil, errSizeChanged
	}
	return buf, nil
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

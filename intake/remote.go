package intake

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitename"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
)

// ErrRemoteLost: the claimed file is gone from processing/ and no earlier
// move of it can be found (moved or deleted by hand). Matrix row 12.
var ErrRemoteLost = errors.New("the claimed remote file is gone")

// moveOnce renames src to the first free name from candidates, never
// overwriting (SFTP RENAME fails when the target exists; candidate names
// carry the intake id, so the first is free unless this very step ran
// before). The common case costs one request; only a refused rename asks
// more. When src is already gone and a candidate exists, an earlier
// attempt moved it: that candidate is returned, so a resumed step is
// idempotent.
func moveOnce(s *partners.Session, src string, candidates []string) (string, error) {
	if err := s.EnsureDir(path.Dir(candidates[0])); err != nil {
		return "", fmt.Errorf("create %s: %w", path.Dir(candidates[0]), err)
	}
	if err := s.Rename(src, candidates[0]); err == nil {
		return candidates[0], nil
	}
	if _, err := s.Lstat(src); partners.IsNotExist(err) {
		for i := len(candidates) - 1; i >= 0; i-- {
			if _, err := s.Lstat(candidates[i]); err == nil {
				return candidates[i], nil
			}
		}
		return "", fmt.Errorf("move %s: %w", src, ErrRemoteLost)
	} else if err != nil {
		return "", fmt.Errorf("stat %s: %w", src, err)
	}
	var last error
	for _, dst := range candidates {
		if _, err := s.Lstat(dst); err == nil {
			continue // taken: never overwrite
		}
		if last = s.Rename(src, dst); last == nil {
			return dst, nil
		}
	}
	return "", fmt.Errorf("move %s: no free target name: %w", src, last)
}

// claimedIsOurs reports whether the entry at the file's claimed path is
// this intake's file, before archive or a hold moves it: a run that did
// not put the file there or read it there itself (a resume from the
// spool, a takeover) may find another file under the name, claimed to the
// path after this intake's own file left it. Its size (the bytes spooled,
// else those listed at the claim) and its mtime (when the claim recorded
// one), which a RENAME keeps, must be this intake's; the hash is not read
// again. A path holding something else is left alone: the run goes on as
// when its file is gone (the spool keeps its bytes), and the partner's
// next poll adopts the entry as a claim of its own once this intake ends.
func (r *fileRun) claimedIsOurs() (bool, error) {
	if r.placed || r.in.ReplayOf != 0 || r.p.cfg.Records() {
		return true, nil
	}
	st, err := r.sess.Lstat(r.in.ClaimedPath)
	if partners.IsNotExist(err) {
		return true, nil // the move finds it gone
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", r.in.ClaimedPath, err)
	}
	size := r.in.Size
	if size == 0 {
		size = r.in.ListedSize
	}
	// the listing's mtime, unless the server's RENAME stamps its own (a
	// copy): the claim's RENAME then changed it
	sameTime := r.in.ListedMTime.IsZero() || r.p.restamps.Load() || st.ModTime().Equal(r.in.ListedMTime)
	if st.Mode().IsRegular() && st.Size() == size && sameTime {
		r.placed = true
		return true, nil
	}
	r.log.Warn("the file at this intake's claimed path is not its file (size or mtime differ); left there for a claim of its own",
		"reason", ledger.ReasonRemoteLost)
	r.p.takenOver.Store(true)
	return false, nil
}

// maxRemoteName bounds a generated remote name as partners.SafeName
// bounds a partner's.
const maxRemoteName = partners.MaxNameBytes

// fitName returns prefix+base+suffix when it fits in one remote name
// (maxRemoteName bytes, the limit of every common file system). Otherwise
// base, the partner-derived part, is cut at a UTF-8 boundary and followed
// by "~" and a hash of the whole untruncated name: two long names that
// share a beginning still get different names, and the same input always
// gets the same name (a resumed step finds what an earlier attempt wrote).
// prefix and suffix are ours and short (well under 200 bytes).
func fitName(prefix, base, suffix string) string {
	full := prefix + base + suffix
	if len(full) <= maxRemoteName {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	mark := "~" + hex.EncodeToString(sum[:6])
	cut := maxRemoteName - len(prefix) - len(suffix) - len(mark)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(base[cut]) {
		cut--
	}
	return prefix + base[:cut] + mark + suffix
}

// fitStem is fitName for a name that other names are derived from by
// appending one of our suffixes: room for the longest of them (reserve) is
// kept, so each derived name fits too.
func fitStem(prefix, base, suffix, reserve string) string {
	return strings.TrimSuffix(fitName(prefix, base, suffix+reserve), reserve)
}

// Suffixes of names derived from a held file's name.
const (
	heldReserve = partners.ManifestSuffix + sitename.ReasonSuffix
)

// heldName is the name of a held file in quarantine/:
// <intake_id>.<name>, and beside it <that>.complete (its manifest) and
// <that>.reason.json, all within maxRemoteName bytes.
func heldName(id int64, name string) string {
	return fitStem(fmt.Sprintf("%d.", id), name, "", heldReserve)
}

// reasonName is the reason file beside a held file.
func reasonName(held string) string { return held + sitename.ReasonSuffix }

// maxArchiveExt: a longer "extension" is part of a name, not a type, and
// is left out of archive names.
const maxArchiveExt = 32

// archiveNames are the candidate archive names of in:
// <batch>.<sha12>.<intake_id>[.n]<ext>, n from 1 to extra, each with room
// for partners.ManifestSuffix.
func archiveNames(dir string, in *ledger.Intake, extra int) []string {
	ext := path.Ext(in.RemoteName)
	if len(ext) > maxArchiveExt {
		ext = ""
	}
	out := make([]string, 0, extra+1)
	for i := 0; i <= extra; i++ {
		n := ""
		if i > 0 {
			n = fmt.Sprintf(".%d", i)
		}
		out = append(out, path.Join(dir, fitStem("", in.BatchID, fmt.Sprintf(".%s.%d%s%s", in.SHA256[:12], in.ID, n, ext), partners.ManifestSuffix)))
	}
	return out
}

// tempName is putFile's hidden temporary name for name.
func tempName(name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fitName(".", name, "."+hex.EncodeToString(b[:])+".tmp")
}

// putFile writes data to dir/name atomically: into a hidden temporary name,
// then renamed over any earlier version (posix-rename). The caller makes
// sure it still holds the file's fencing token right before (fileRun.fence):
// what it writes is the current truth for the partner, so it replaces what
// an earlier attempt or an earlier decision wrote. A temporary file left by
// a kill is removed by the reconciler once it is older than
// reconcile.stale_temp.
func putFile(s *partners.Session, dir, name string, data []byte) (string, error) {
	return putFileFrom(s, dir, name, bytes.NewReader(data), int64(len(data)))
}

// putFileFrom is putFile for size bytes read from src (a file in the
// spool's temp area, for a report too large to hold in memory): only a
// file up to wholeMax is read into memory at once, a larger one is copied
// through pkg/sftp. src is read from its start again when the first try
// has to be repeated.
func putFileFrom(s *partners.Session, dir, name string, src io.ReaderAt, size int64) (string, error) {
	st, err := stageFile(s, dir, name, size <= wholeMax)
	if err == nil {
		err = st.write(src, size)
	}
	if s.ListingChannelLost(err) {
		// the listing channel broke under it: once more through pkg/sftp
		if st, err = stageFile(s, dir, name, false); err == nil {
			err = st.write(src, size)
		}
	}
	if err != nil {
		return "", err
	}
	return st.publish(path.Join(dir, name))
}

// staged is putFile's temporary file, open, before its bytes are written
// (stageFile) and before it is renamed to its final name (publish). A
// group opens its receipts' temporary files beside its reads and writes
// them beside its archive moves (group_archive.go), so a receipt costs
// the round trips of its close and rename alone; what the partner can see
// is the same as putFile's: the final name appears by one rename of a
// complete, closed file.
//
// A small file is opened on the session's listing channel
// (partners.WholeFile), where its bytes and its CLOSE go out together:
// one round trip where pkg/sftp takes two. A large one (a
// rejects report over wholeMax), or one on a site that refuses a second
// channel, goes through pkg/sftp.
type staged struct {
	s      *partners.Session
	tmp    string
	f      *sftp.File          // pkg/sftp's, or
	w      *partners.WholeFile // the listing channel's
	closed bool                // w's write was tried: its CLOSE sent with it, or the channel gone
}

// wholeMax: a file up to this size is written on the listing channel at
// once (its WRITEs and CLOSE together); a larger one would hold up the
// session's listings behind it and goes through pkg/sftp.
const wholeMax = 256 << 10

// stageFile opens a new temporary file in dir for a file to be named
// name; small: its bytes will be at most wholeMax.
func stageFile(s *partners.Session, dir, name string, small bool) (*staged, error) {
	if err := s.EnsureDir(dir); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	tmp := path.Join(dir, tempName(name))
	if small {
		w, err := s.CreateWhole(tmp)
		if err == nil {
			return &staged{s: s, tmp: tmp, w: w}, nil
		}
		if !errors.Is(err, partners.ErrNoListingChannel) {
			return nil, fmt.Errorf("create %s: %w", tmp, err)
		}
	}
	f, err := s.Create(tmp)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	return &staged{s: s, tmp: tmp, f: f}, nil
}

// write writes the file's bytes (on the listing channel, and closes it);
// on an error the temporary file is gone.
func (st *staged) write(src io.ReaderAt, size int64) error {
	var err error
	if st.w != nil {
		data := make([]byte, size) // at most wholeMax (stageFile's small)
		if _, err = src.ReadAt(data, 0); err == io.EOF && size == 0 {
			err = nil
		}
		if err == nil {
			err = st.w.WriteClose(data)
			st.closed = true // its CLOSE went out with the WRITEs, or the channel is gone
		}
	} else {
		var n int64
		n, err = io.Copy(st.f, io.NewSectionReader(src, 0, size))
		if err == nil && n != size {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil {
		st.discard()
		return fmt.Errorf("write %s: %w", st.tmp, err)
	}
	return nil
}

// discard closes and removes the temporary file (best effort: the
// reconciler removes a temporary file left behind once it is stale).
func (st *staged) discard() {
	switch {
	case st.w == nil:
		st.f.Close()
	case !st.closed:
		st.w.Close()
	}
	st.s.Remove(st.tmp)
}

// close closes the temporary file, unless write did.
func (st *staged) close() error {
	if st.w == nil {
		return st.f.Close()
	}
	if st.closed {
		return nil
	}
	st.closed = true
	return st.w.Close()
}

// publish closes the temporary file (unless write did) and renames it
// over dst.
func (st *staged) publish(dst string) (string, error) {
	s, tmp := st.s, st.tmp
	if err := st.close(); err != nil {
		s.Remove(tmp)
		return "", fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fault.Check("putfile:before_rename"); err != nil {
		return "", err
	}
	if err := s.PosixRename(tmp, dst); err != nil {
		// a server without posix-rename: replace in two steps
		if _, serr := s.Lstat(dst); serr == nil {
			s.Remove(dst)
		}
		if err := s.Rename(tmp, dst); err != nil {
			s.Remove(tmp)
			return "", fmt.Errorf("publish %s: %w", dst, err)
		}
	}
	return dst, nil
}

// fence checks, right before a step the partner can see (a move, a reason
// file, a receipt), that this run still holds the file's fencing token, and
// renews the lease with the same conditional statement: no takeover can
// happen for one lease from here, so a stalled owner that wakes after a
// takeover publishes nothing.
//
// A file of a group is checked with its group, in one statement shortly
// before the group's steps on the site go out together: the group's
// transaction to applied, which matches every file's token and renews its
// lease, or FenceGroup when that is older than a third of a lease
// (group_archive.go); that check stands for the file's own steps of that
// burst while it is less than a third of a lease old. One commit per step cost
// a group of 32 small files 64 commits before its receipts (the warm
// small-file rate fell from about 1300 to about 500 files/s,
// docs/performance.md); the per-file path still checks before every step.
func (r *fileRun) fence(ctx context.Context, step string) error {
	if err := fault.Check("publish:" + step); err != nil {
		return err
	}
	// A run of this process's worker id publishes only under the hold of
	// the id it began in (workerid.go): a process that lost the id, even
	// if it took it again, may have had its files taken over at once by
	// another process of the id meanwhile. (An ops command's rows are its
	// own identity's, OpsWorker.)
	own := r.in.Worker == r.d.cfg.WorkerID
	id := r.d.id.Load()
	lost := func() bool { return own && !id.HeldIn(r.idHold) }
	notHeld := func() error {
		return &ledger.FencedError{IntakeID: r.in.ID, Token: r.in.Token, Step: step + ": " + errWorkerIDNotHeld.Error()}
	}
	if lost() {
		return notHeld()
	}
	switch {
	case own && id.Pooled().PID != 0:
		// a one-shot run's hold is not watched: each fence asks whether
		// its connection still holds the lock (no group window)
		if err := r.d.ledger.HeartbeatHeld(ctx, r.in, r.d.cfg.WorkerID, id.Pooled()); err != nil {
			return err
		}
	case r.groupFencedAt.IsZero() || time.Since(r.groupFencedAt) >= r.d.ledger.Lease()/3:
		if err := r.d.ledger.Heartbeat(ctx, r.in); err != nil {
			return err
		}
	}
	if lost() {
		return notHeld()
	}
	return nil
}

package intake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
)

// errNotOwner: another live replica polls the partner (affinity.go).
var errNotOwner = errors.New("another replica polls this partner")

// Skip reasons for entries of ready/ that are not claimed.
const (
	SkipDotfile     = "dotfile"
	SkipPartial     = "partial_upload"
	SkipNotRegular  = "not_regular_file" // symlink, directory, device: never followed or read
	SkipBadName     = "bad_name"         // control characters, separators, invalid UTF-8, too long
	SkipNoFeed      = "no_feed"          // no feed of the partner matches the name
	SkipNoManifest  = "manifest_missing"
	SkipManifest    = "manifest_file"
	maxRemoteName   = 255
	partialSuffix   = ".part"
	claimTargetBusy = "claim_target_busy"
)

// candidate is an entry of ready/ worth claiming.
type candidate struct {
	name     string
	size     int64
	feed     *partners.Feed
	manifest string
	mtime    time.Time
}

// pollOnce is one cycle for one partner: resume what this worker already
// holds, then claim and process what ready/ offers.
func (d *Daemon) pollOnce(ctx context.Context, p *partnerRT) error {
	if !d.claiming() {
		return nil
	}
	// With several replicas, one polls the partner (affinity.go). The
	// others still resume their own files of it once after they start (a
	// restart's leftovers), then leave it alone.
	own := d.owns(ctx, p.cfg.ID)
	if !own && !p.resumed && d.prevDrained {
		// nothing can be half claimed; resume only if rows say so
		live, err := d.store.liveOwnedBy(ctx, p.cfg.ID, d.cfg.WorkerID)
		if err != nil {
			return err
		}
		p.resumed = len(live) == 0
	}
	if !own && p.resumed {
		p.drop() // a session of an earlier poll is the owner's business now
		d.notPolling(p)
		return errNotOwner
	}
	if own {
		p.statMu.Lock()
		p.polling, p.elsewhere = true, false
		p.statMu.Unlock()
	}
	d.metrics.polls.WithLabelValues(p.cfg.ID).Inc()
	sess, err := p.session(ctx, d.cfg.WorkerID)
	if err != nil {
		return err
	}
	// pkg/sftp calls take no context: closing the session is how a
	// shutdown interrupts a transfer in flight.
	stop := context.AfterFunc(ctx, func() { p.drop() })
	defer stop()
	if !p.tempClean {
		// No download of this worker is in flight for the partner yet: any
		// temp file of ours is a crash's leftover (matrix row 4).
		n, err := d.spool.ClearOwnTemp(p.cfg.ID)
		if err != nil {
			return err
		}
		if n > 0 {
			d.log.Info("removed spool temp files left by a crash", "partner", p.cfg.ID, "files", n)
		}
		p.tempClean = true
	}
	if err := d.resumeOwn(ctx, p, sess); err != nil {
		return err
	}
	p.resumed = true
	if !own {
		p.drop() // the session is the owner's to keep
		d.notPolling(p)
		return errNotOwner
	}
	cands, hostile, beyond, err := d.list(ctx, p, sess)
	if err != nil {
		return err
	}
	// Hostile entries (at most hostileBudget, the oldest) go to quarantine
	// first; each counts against max_files_per_poll like a claim.
	handled := 0
	for _, h := range hostile {
		if ctx.Err() != nil || !d.claiming() {
			return ctx.Err()
		}
		if err := d.quarantineHostile(ctx, p, sess, h); err != nil {
			return err
		}
		handled++
	}
	// Up to cfg.Concurrency files of the partner are in flight at once, on
	// the one session (pkg/sftp multiplexes requests); a group of small
	// files (group.go) takes one slot. A file or group is claimed only when
	// a slot is free, so claims never run ahead of the work and other
	// replicas can take what this one has not started.
	slots := make(chan struct{}, max(p.cfg.Concurrency, 1))
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	failed := func() bool {
		errMu.Lock()
		defer errMu.Unlock()
		return firstErr != nil
	}
	// work runs a claimed file or group in its slot.
	work := func(fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := fn(); err != nil {
				fail(err)
			}
		}()
	}
	quota, err := d.spoolQuota(p)
	if err != nil {
		return err
	}
	claimed := handled
	var nextID int64 // allocated before the next claim's rename (see claim)
	racing := false  // another replica claims from the partner: groups rename one at a time (claimGroup)
	for i := 0; i < len(cands); i++ {
		c := cands[i]
		p.setReady(cands[i:], beyond) // what is left for a later poll (or another worker)
		if ctx.Err() != nil || !d.claiming() || failed() {
			break
		}
		if claimed >= p.cfg.Limits.MaxFilesPerPoll || !quota.ok() || !d.spaceOK() || !d.owns(ctx, p.cfg.ID) {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		if g := groupAt(p.cfg, cands[i:], p.cfg.Limits.MaxFilesPerPoll-claimed); g != nil {
			// small files go through together (group.go)
			nextID = 0 // allocated before this group's renames: unused now
			ins, walked, raced, cerr := d.claimGroup(ctx, p, sess, g, racing)
			racing = racing || raced
			i += walked - 1 // walked 0: the group was put back, walk it again one at a time
			claimed += len(ins)
			for _, in := range ins {
				d.quotaClaimed(p, quota, in.ListedSize)
			}
			if len(ins) == 0 {
				<-slots
			} else {
				work(func() error { return d.runGroup(ctx, p, sess, ins) })
			}
			if cerr != nil {
				fail(cerr)
				break
			}
			continue
		}
		if nextID == 0 {
			if nextID, err = d.store.nextIntakeID(ctx); err != nil {
				<-slots
				fail(err)
				break
			}
		}
		in, next, err := d.claim(ctx, p, sess, c, nextID)
		nextID = next
		if err != nil || in == nil {
			<-slots
			if err != nil {
				fail(err)
				break
			}
			continue
		}
		claimed++
		d.quotaClaimed(p, quota, in.ListedSize)
		work(func() error { return d.runFile(ctx, p, sess, in) })
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// setReady records what ready/ still offers, for gauges and status: the
// candidates left of those kept, and beyond, the claimable files the
// bounded listing counted but did not keep.
func (p *partnerRT) setReady(left []candidate, beyond int) {
	var oldest time.Time
	if len(left) > 0 {
		oldest = left[0].mtime
	}
	p.statMu.Lock()
	p.readyCount, p.oldestReady = len(left)+beyond, oldest
	p.statMu.Unlock()
}

// hostileBudget is how many hostile entries one poll moves to quarantine:
// half of max_files_per_poll (at least one), so a flood of them never
// takes a whole poll from the partner's good files, and drains anyway.
func hostileBudget(p *partners.Config) int {
	return max(1, p.Limits.MaxFilesPerPoll/2)
}

// maxManifestNames bounds the manifest names a listing remembers (manifest
// mode); past it, a kept file's manifest is looked up with one LSTAT.
const maxManifestNames = 10000

// list streams ready/ once, non-recursively (partners.Session.ListDir),
// and keeps only what this poll can use, whatever the directory holds:
// the oldest max_files_per_poll claimable files, oldest first, and the
// oldest hostileBudget hostile entries. Memory is bounded by those and
// the work by one pass over the listing; skipped entries are counted by
// reason. beyond is how many claimable files it counted but did not keep.
func (d *Daemon) list(ctx context.Context, p *partnerRT, sess *partners.Session) (cands []candidate, hostile []Skipped, beyond int, err error) {
	cfg := p.cfg
	manifestMode := cfg.Readiness == partners.ReadinessManifest
	keep := newOldest(max(cfg.Limits.MaxFilesPerPoll, 1), func(c candidate) (time.Time, string) { return c.mtime, c.name })
	bad := newOldest(hostileBudget(cfg), func(s Skipped) (time.Time, string) { return s.Info.ModTime(), s.Info.Name() })
	manifests := map[string]bool{}
	overflow := false
	total := 0
	err = sess.ListDir(ctx, sess.Layout.ReadyDir(), func(e os.FileInfo) error {
		c, reason := classifyEntry(cfg, e)
		if reason == SkipManifest && e.Mode().IsRegular() {
			if len(manifests) < maxManifestNames {
				manifests[e.Name()] = true
			} else {
				overflow = true
			}
		}
		if reason != "" {
			d.metrics.skipped.WithLabelValues(cfg.ID, reason).Inc()
			if Hostile(reason) {
				bad.push(Skipped{Info: e, Reason: reason})
			}
			return nil
		}
		total++
		keep.push(c)
		return nil
	})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list %s: %w", sess.Layout.ReadyDir(), err)
	}
	for _, c := range keep.sorted() {
		if manifestMode {
			m := c.name + ManifestSuffix
			ok := manifests[m]
			if !ok && overflow {
				fi, err := sess.Lstat(sess.Layout.Ready(m))
				ok = err == nil && fi.Mode().IsRegular()
			}
			if !ok {
				total--
				d.metrics.skipped.WithLabelValues(cfg.ID, SkipNoManifest).Inc()
				continue
			}
			c.manifest = m
		}
		cands = append(cands, c)
	}
	beyond = max(total-len(cands), 0)
	p.setReady(cands, beyond)
	return cands, bad.sorted(), beyond, nil
}

// oldest keeps the n smallest items by (time, name): a max-heap whose top
// is the newest kept item, replaced when an older one comes.
type oldest[T any] struct {
	n     int
	key   func(T) (time.Time, string)
	items []T
}

func newOldest[T any](n int, key func(T) (time.Time, string)) *oldest[T] {
	return &oldest[T]{n: n, key: key}
}

func (o *oldest[T]) less(a, b T) bool { // a is older than b
	ta, na := o.key(a)
	tb, nb := o.key(b)
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return na < nb
}

func (o *oldest[T]) push(x T) {
	if len(o.items) < o.n {
		o.items = append(o.items, x)
		for i := len(o.items) - 1; i > 0; { // sift up: parents are newer
			up := (i - 1) / 2
			if !o.less(o.items[up], o.items[i]) {
				break
			}
			o.items[up], o.items[i] = o.items[i], o.items[up]
			i = up
		}
		return
	}
	if o.n == 0 || !o.less(x, o.items[0]) {
		return
	}
	o.items[0] = x
	for i := 0; ; { // sift down
		l, r, big := 2*i+1, 2*i+2, i
		if l < len(o.items) && o.less(o.items[big], o.items[l]) {
			big = l
		}
		if r < len(o.items) && o.less(o.items[big], o.items[r]) {
			big = r
		}
		if big == i {
			break
		}
		o.items[i], o.items[big] = o.items[big], o.items[i]
		i = big
	}
}

// sorted returns the kept items, oldest first.
func (o *oldest[T]) sorted() []T {
	out := append([]T(nil), o.items...)
	sort.Slice(out, func(i, j int) bool { return o.less(out[i], out[j]) })
	return out
}

// Hostile reports whether a skipped entry is moved to quarantine (with a
// receipt saying why) rather than left for later: it will never become a
// valid file by waiting.
func Hostile(reason string) bool {
	return reason == SkipNotRegular || reason == SkipBadName || reason == SkipNoFeed
}

// HostilePrefix names hostile entries claimed into processing/: the
// original name is never used in a path of ours.
const HostilePrefix = "hostile-"

// Skipped is an entry of ready/ that is not claimed, and why.
type Skipped struct {
	Info   os.FileInfo
	Reason string
}

// ClassifyReady splits a listing of ready/ into claimable files (oldest
// first) and skipped entries. READDIR attributes are lstat-like on
// OpenSSH, so symlinks show as symlinks and are never followed; dotfiles,
// *.part, directories and other non-regular entries, unsafe names, names no
// feed matches, and (manifest mode) data files without their manifest are
// skipped.
func ClassifyReady(p *partners.Config, ents []os.FileInfo) ([]candidate, []Skipped) {
	ents = append([]os.FileInfo(nil), ents...)
	names := map[string]os.FileInfo{}
	for _, e := range ents {
		names[e.Name()] = e
	}
	sort.Slice(ents, func(i, j int) bool {
		if !ents[i].ModTime().Equal(ents[j].ModTime()) {
			return ents[i].ModTime().Before(ents[j].ModTime())
		}
		return ents[i].Name() < ents[j].Name()
	})
	manifestMode := p.Readiness == partners.ReadinessManifest
	var out []candidate
	var skipped []Skipped
	for _, e := range ents {
		c, reason := classifyEntry(p, e)
		if reason == "" && manifestMode {
			m, ok := names[c.name+ManifestSuffix]
			if !ok || !m.Mode().IsRegular() {
				reason = SkipNoManifest
			} else {
				c.manifest = c.name + ManifestSuffix
			}
		}
		if reason != "" {
			skipped = append(skipped, Skipped{Info: e, Reason: reason})
			continue
		}
		out = append(out, c)
	}
	return out, skipped
}

// classifyEntry is one entry's verdict, all but the manifest check
// (which needs the rest of the listing): a candidate, or why it is
// skipped.
func classifyEntry(p *partners.Config, e os.FileInfo) (candidate, string) {
	name := e.Name()
	reason := ""
	switch {
	case strings.HasPrefix(name, "."):
		reason = SkipDotfile
	case strings.HasSuffix(name, partialSuffix):
		reason = SkipPartial
	case !e.Mode().IsRegular():
		reason = SkipNotRegular
	case !SafeName(name):
		reason = SkipBadName
	case p.Readiness == partners.ReadinessManifest && strings.HasSuffix(name, ManifestSuffix):
		reason = SkipManifest
	}
	c := candidate{name: name, size: e.Size(), mtime: e.ModTime()}
	if reason == "" {
		if c.feed = p.FeedFor(name); c.feed == nil {
			reason = SkipNoFeed
		}
	}
	return c, reason
}

// SafeName reports whether a remote file name may be handled: valid UTF-8,
// no control characters, no path separators, not "." or "..", at most 255
// bytes. Spool paths never derive from names; this guards remote paths and
// reports.
func SafeName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > maxRemoteName || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || r == '/' || r == '\\' || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

// claim renames ready/<name> into processing/<worker>/<name>: the rename
// is the claim. A lost race (the file is gone) returns nil, counted, not an
// error: the processing directory exists, so "no such file" can only mean
// another worker won. The row is inserted after the rename; a crash in
// between leaves a file in processing/<worker>/ that resumeOwn adopts.
//
// The row takes id, an intake id allocated before the rename, and the
// statement allocates the next claim's id; it returns that (0 after any
// claim that did not succeed: the next one allocates afresh). Intake ids
// decide which of two files writing one key wins, and a partner's files
// are claimed oldest first; an id allocated before the rename means that
// whoever renames a file first holds the smaller id, even when two
// replicas claim from one partner (around a change of replicas) and the
// first one's row reaches the database last. Only a file adopted after a
// crash gets a later id than its rename order. The rename is made under the
// partner's claim lock, so it never falls inside another replica's group
// (claimLock).
func (d *Daemon) claim(ctx context.Context, p *partnerRT, sess *partners.Session, c candidate, id int64) (*Intake, int64, error) {
	src := sess.Layout.Ready(c.name)
	dst := sess.Layout.Processing(d.cfg.WorkerID, c.name)
	lock, err := d.store.lockClaims(ctx, p.cfg.ID) // see claimLock
	if err != nil {
		return nil, 0, err
	}
	err = sess.Rename(src, dst)
	lock.release()
	if err != nil {
		if partners.IsNotExist(err) {
			d.metrics.claimsLost.WithLabelValues(p.cfg.ID).Inc()
			d.peers.lost() // another replica claims here: look again who polls the partner
			return nil, 0, nil
		}
		if _, serr := sess.Lstat(dst); serr == nil {
			// The same name is still in our processing dir from an earlier
			// claim; it is resumed first, and this one waits for a later poll.
			d.metrics.skipped.WithLabelValues(p.cfg.ID, claimTargetBusy).Inc()
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("claim %s: %w", c.name, err)
	}
	if err := fault.Check("claim:after_rename"); err != nil {
		// as if the rename's reply was lost: the file sits in our
		// processing dir without a row, and the next poll adopts it
		return nil, 0, fmt.Errorf("claim %s: %w", c.name, err)
	}
	in := &Intake{Partner: p.cfg.ID, Feed: c.feed.Name, RemoteName: c.name, ClaimedPath: dst,
		ListedSize: c.size, Worker: d.cfg.WorkerID}
	if c.manifest != "" {
		if err := sess.Rename(sess.Layout.Ready(c.manifest), sess.Layout.Processing(d.cfg.WorkerID, c.manifest)); err != nil && !partners.IsNotExist(err) {
			return nil, 0, fmt.Errorf("claim manifest of %s: %w", c.name, err)
		}
		in.ManifestName = c.manifest
	}
	next, err := d.store.insertClaimAt(ctx, in, id)
	if err != nil {
		if errors.Is(err, errTracked) {
			return nil, 0, nil
		}
		return nil, 0, err
	}
	return in, next, nil
}

// quarantineHostile takes an entry of ready/ that can never be processed
// (a symlink or other non-regular entry, an unsafe name, a name no feed
// matches) out of ready/ without reading it: it is claimed by rename under a
// generated name (the original name never enters a path of ours), recorded,
// and held in quarantine/ with a reason file and a receipt for the partner.
func (d *Daemon) quarantineHostile(ctx context.Context, p *partnerRT, sess *partners.Session, h Skipped) error {
	var b [4]byte
	_, _ = rand.Read(b[:])
	gen := fmt.Sprintf("%s%s-%d-%s", HostilePrefix, h.Reason, time.Now().UnixNano(), hex.EncodeToString(b[:]))
	dst := sess.Layout.Processing(d.cfg.WorkerID, gen)
	if err := sess.Rename(sess.Layout.Ready(h.Info.Name()), dst); err != nil {
		if partners.IsNotExist(err) {
			d.metrics.claimsLost.WithLabelValues(p.cfg.ID).Inc()
			return nil
		}
		return fmt.Errorf("claim a hostile entry: %w", err)
	}
	in := &Intake{Partner: p.cfg.ID, Feed: NoFeed, RemoteName: printableName(h.Info.Name()), ClaimedPath: dst,
		ListedSize: h.Info.Size(), Worker: d.cfg.WorkerID}
	if err := d.store.insertClaim(ctx, in); err != nil {
		if errors.Is(err, errTracked) {
			return nil
		}
		return err
	}
	return d.runFile(ctx, p, sess, in)
}

// NoFeed is the feed of a file that matches none (a hostile entry).
const NoFeed = "-"

// printableName renders a name for reports and logs: safe names as they
// are, others quoted with escapes so no control character travels on.
func printableName(name string) string {
	if SafeName(name) {
		return name
	}
	q := strconv.QuoteToASCII(name)
	if len(q) > 300 {
		q = q[:300] + "…"
	}
	return q
}

// hostileReason recovers the reason from a generated hostile name.
func hostileReason(claimedPath string) string {
	name := strings.TrimPrefix(path.Base(claimedPath), HostilePrefix)
	for _, r := range []string{SkipNotRegular, SkipBadName, SkipNoFeed} {
		if strings.HasPrefix(name, r+"-") {
			return r
		}
	}
	return "hostile_entry"
}

// resumeOwn adopts files in processing/<worker>/ that have no row (a crash
// between claim rename and insert, or moved there from a stopped worker's
// dir by adoptOrphans) and resumes every live row this worker id holds (a
// restart), taking each over with a new fencing token.
func (d *Daemon) resumeOwn(ctx context.Context, p *partnerRT, sess *partners.Session) error {
	p.statMu.Lock()
	polling := p.polling
	p.statMu.Unlock()
	if polling {
		// whoever polls the partner adopts what stopped workers left
		// without a row, whatever the affinity (orphans.go)
		if err := d.adoptOrphans(ctx, p, sess); err != nil {
			return err
		}
	}
	dir := sess.Layout.ProcessingDir(d.cfg.WorkerID)
	ents, err := sess.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = e.Mode().IsRegular()
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, HostilePrefix) {
			// a hostile entry claimed just before a crash: hold it now
			in := &Intake{Partner: p.cfg.ID, Feed: NoFeed, RemoteName: name, ClaimedPath: path.Join(dir, name),
				ListedSize: e.Size(), Worker: d.cfg.WorkerID}
			if err := d.store.insertClaim(ctx, in); err != nil && !errors.Is(err, errTracked) {
				return err
			}
			continue
		}
		if !e.Mode().IsRegular() || strings.HasPrefix(name, ".") || !SafeName(name) {
			continue
		}
		manifest := ""
		if p.cfg.Readiness == partners.ReadinessManifest {
			if strings.HasSuffix(name, ManifestSuffix) {
				continue
			}
			if have[name+ManifestSuffix] {
				manifest = name + ManifestSuffix
			}
		}
		feed := p.cfg.FeedFor(name)
		if feed == nil {
			continue
		}
		in := &Intake{Partner: p.cfg.ID, Feed: feed.Name, RemoteName: name, ClaimedPath: path.Join(dir, name),
			ListedSize: e.Size(), Worker: d.cfg.WorkerID, ManifestName: manifest}
		err := d.store.insertClaim(ctx, in)
		if err != nil && !errors.Is(err, errTracked) {
			return err
		}
		if err == nil {
			d.log.Info("adopted a claimed file without a row", "partner", p.cfg.ID, "intake_id", in.ID)
		}
	}
	// Every entry of this worker's dir has a row now: whatever happens
	// next in this poll, a failure of it unsettles the partner again
	// (afterPoll).
	p.settled = true
	// files that failed wait for their own next attempt (attempt.go)
	live, err := d.store.dueOwnedBy(ctx, p.cfg.ID, d.cfg.WorkerID)
	if err != nil {
		return err
	}
	for _, old := range live {
		if old.State == StateOutcomeUnknown {
			continue // the reconciler resolves these from the ledger
		}
		in, err := d.store.resume(ctx, old.ID, d.cfg.WorkerID)
		var fe *FencedError
		if errors.As(err, &fe) {
			continue
		}
		if err != nil {
			return err
		}
		if err := d.runFile(ctx, p, sess, in); err != nil {
			return err
		}
	}
	return nil
}

// runFile runs one file; losing it to another owner is counted and is not
// an error of the poll.
func (d *Daemon) runFile(ctx context.Context, p *partnerRT, sess *partners.Session, in *Intake) error {
	r, err := d.newRun(p, sess, in)
	if err != nil {
		return err
	}
	return r.runAlone(ctx)
}

// runAlone runs a file on the per-file path from the state it is in.
func (r *fileRun) runAlone(ctx context.Context) error {
	err := r.run(ctx)
	var fe *FencedError
	if errors.As(err, &fe) {
		r.fencedOut(fe.Step)
		return nil
	}
	if err != nil {
		// one file's failure never stops the partner's poll (attempt.go)
		if err := r.settle(ctx, err); err != nil {
			return fmt.Errorf("intake %d: %w", r.in.ID, err)
		}
	}
	return nil
}

// fencedOut counts and logs a file lost to another owner.
func (r *fileRun) fencedOut(step string) {
	r.d.metrics.fenced.WithLabelValues(r.in.Partner).Inc()
	r.log.Warn("file lost to another owner; stopped work on it", "step", step)
}

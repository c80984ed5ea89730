package intake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync/atomic"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/siteread"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
	"github.com/partner-intake/partner-intake/spool"
)

// fetchStage is a file's download: its bytes read from the claimed path
// into the spool in one streaming pass (hashed, expanded, decrypted), or
// decided from its name, manifest or hash alone, up to spooled.
type fetchStage struct {
	*fileRun
	// from: where the file's bytes are read (openClaimed), when not its
	// claimed path: an archived copy of a replay's bytes (fetchAgain)
	from string
}

// fetchStage starts the file's download.
func (r *fileRun) fetchStage() *fetchStage { return &fetchStage{fileRun: r} }

// source is the path the file's bytes are read from: its claimed path,
// or the copy fetchAgain chose.
func (r *fetchStage) source() string {
	if r.from != "" {
		return r.from
	}
	return r.in.ClaimedPath
}

// download streams the claimed file into the spool in one pass (pkg/sftp's
// concurrent WriteTo into hash + temp file), checks the byte count against
// the file's size (pkg/sftp#658 can end short with a nil error), verifies
// the manifest, and records the bytes: claimed -> spooled. A short or
// mismatching download is retried once before the file is held.
func (r *fetchStage) download(ctx context.Context) error {
	in := r.in
	if !r.placed { // a row resumed, not claimed by this run
		if err := r.unhold(ctx); err != nil {
			return err
		}
	}
	// The batch id is known before the bytes are: receipts of files held
	// during download carry it too.
	batch := batchIDOf(r.feed, in.RemoteName, r.p.nocase.Load())
	var man *partners.Manifest
	var bound *background[*ledger.BoundFile]
	if in.ManifestName != "" && in.Override == "" && r.feed.BatchID.From != partners.BatchFromManifest && partners.ValidBatchID(batch) {
		// the file the batch is bound to is looked up beside the
		// manifest's read (manifestDuplicate)
		bound = inBackground(func() (*ledger.BoundFile, error) { return r.d.ledger.BatchBoundFile(ctx, in, batch) })
		defer bound.wait()
	}
	if in.ManifestName != "" {
		if err := fault.Check("download:manifest"); err != nil {
			return err
		}
		m, err := r.readManifest()
		switch {
		case err == nil:
		case errors.Is(err, sftpconn.ErrNotRegular):
			return r.hold(ctx, ledger.StateFailedTerminal, reason.ManifestInvalid, 0, "the manifest is not a regular file (a symlink, or another file swapped in after the listing): it was not read")
		case sftpconn.IsNotExist(err) && r.manifestInReady():
			return r.hold(ctx, ledger.StateFailedTerminal, reason.ManifestInvalid, 0, "the manifest stayed in ready/: the site refused to move it beside the claimed file, so it was not read; let the service move files in ready/ and send the pair again")
		case sftpconn.IsNotExist(err):
			return r.hold(ctx, ledger.StateFailedTerminal, reason.ManifestInvalid, 0, "the manifest was gone when the file was read: neither beside the claimed file nor in ready/")
		case errors.Is(err, partners.ErrManifestInvalid), sftpconn.IsPermission(err):
			return r.hold(ctx, ledger.StateFailedTerminal, reason.ManifestInvalid, 0, "the manifest could not be read as JSON with bytes and sha256")
		default:
			// the site or the network failed the read, not the manifest:
			// the file's next attempt reads it again (settle)
			return fmt.Errorf("read manifest: %w", err)
		}
		man = m
		if r.feed.BatchID.From == partners.BatchFromManifest {
			batch = man.BatchID
		}
	}
	if partners.ValidBatchID(batch) {
		in.BatchID = batch
	}
	if man != nil && in.Override == "" && partners.ValidBatchID(batch) {
		if done, err := r.manifestDuplicate(ctx, man, batch, bound); done || err != nil {
			return err
		}
	}
	// The rows are validated while a file downloads (for plan) unless it
	// comes under a batch id another intake already holds: it can then only
	// be a duplicate or a conflict, so a large one is not scanned for
	// nothing (a small one is scanned regardless: cheaper than asking).
	// Such a file is first read through the hash alone: when it is the
	// bytes the spool already holds, nothing is written (an exact resend
	// of a large file costs one read and one hash); when not, it is
	// downloaded again into the spool.
	scan, heldSHA := true, ""
	if in.ListedSize >= scanCheckBytes && partners.ValidBatchID(batch) {
		sha, err := r.d.ledger.BatchBound(ctx, in, batch)
		if err != nil {
			return err
		}
		scan = sha == ""
		if sha != "" && unwrap.Kind(r.feed, in.RemoteName) == "" && r.d.spool.Has(in.Partner, sha, in.ListedSize) {
			heldSHA = sha
		}
	}
	var e spool.Entry
	var err error
	// the unwrapping that followed the last download, dropped unless the
	// file's bytes are taken from it
	var un *unwrapping
	// dropUnwrap stops and undoes it before the file is held or put back
	// (and at the end): what it applies ahead, and its fields of r, are
	// gone before the hold looks at r
	dropUnwrap := func() {
		if un != nil {
			un.drop(r)
			un = nil
		}
	}
	defer dropUnwrap()
	for attempt := 1; ; attempt++ {
		dropUnwrap()
		if heldSHA != "" {
			var same bool
			e, same, err = r.fetchSame(ctx, heldSHA)
			switch {
			case err == nil && same:
				r.d.metrics.HashOnly.WithLabelValues(in.Partner, "same").Inc()
			case err == nil:
				r.d.metrics.HashOnly.WithLabelValues(in.Partner, "differ").Inc()
				r.log.Info("the file differs from the bytes its batch was received with; downloading it into the spool")
				e, un, err = r.fetch(ctx, false, true)
			}
			heldSHA = "" // a retry downloads into the spool
		} else {
			e, un, err = r.fetch(ctx, scan, true)
		}
		if errors.Is(err, errNotRegular) {
			// before the stable check: what is at the claimed path is not
			// the partner's file to put back
			return r.hold(ctx, ledger.StateQuarantined, reason.NotRegularFile, 0, notRegularDetail)
		}
		if r.p.cfg.Readiness == partners.ReadinessStable && in.Override == "" && !errors.Is(err, ErrRemoteLost) {
			// the partner may still be writing into the claimed file
			// (stable.go): a change since the listing puts it back
			got := int64(-1)
			if err == nil {
				got = e.Size
			}
			changed, cerr := r.changedAfterClaim(got)
			if cerr != nil {
				return cerr
			}
			if changed {
				dropUnwrap()
				return r.putBack(ctx)
			}
		}
		if errors.Is(err, spool.ErrTooLarge) {
			return r.hold(ctx, ledger.StateQuarantined, reason.FileTooLarge, 0, fmt.Sprintf("the file is larger than the limit of %d bytes", r.p.cfg.Limits.MaxFileBytes))
		}
		var short *spool.ShortError
		if errors.As(err, &short) {
			if attempt < 2 {
				r.log.Warn("download short, fetching again", "got", short.Got, "want", short.Want)
				continue
			}
			return fmt.Errorf("download: %w", err)
		}
		if errors.Is(err, ErrRemoteLost) {
			return r.hold(ctx, ledger.StateFailedTerminal, reason.RemoteLost, 0, "the file disappeared from processing/ before it was downloaded")
		}
		if err != nil {
			return err
		}
		r.placed = r.placed || !r.byManifest // read at its claimed path by this run
		if man != nil && in.Override != ledger.OverrideManifest && (man.Bytes != e.Size || man.SHA256 != e.SHA256) {
			if attempt < 2 {
				r.log.Warn("bytes disagree with the manifest, fetching again")
				continue
			}
			dropUnwrap()
			return r.hold(ctx, ledger.StateQuarantined, reason.ManifestMismatch, 0, "bytes or sha256 of the file disagree with its manifest")
		}
		break
	}
	r.in.SHA256, r.in.Size = e.SHA256, e.Size
	var rowsWant *int64
	if man != nil {
		rowsWant = man.Rows
	}
	if !partners.ValidBatchID(batch) {
		dropUnwrap()
		return r.hold(ctx, ledger.StateQuarantined, reason.BadBatchID, 0, "no batch id usable in file names could be derived (letters, digits, '.', '_', '-'; at most 128)")
	}
	var data spool.Entry
	var held *unwrap.Held
	if un != nil {
		data, held, err = un.wait()
		un = nil
	} else {
		data, held, err = r.expand(ctx, e, scan)
	}
	if err != nil {
		return err
	}
	if held != nil {
		return r.hold(ctx, ledger.StateQuarantined, held.Reason, 0, held.Detail)
	}
	return r.setSpooled(ctx, e.SHA256, e.Size, data, batch, rowsWant, false)
}

// setSpooled records the file spooled (claimed -> spooled) with its
// content's sha256 and size, its data's (what its rows are read from:
// the content expanded or decrypted, else the content) and its batch,
// bound with it (r.bound). It is the end of the download, whether the
// bytes were read or, byManifest, decided from the manifest alone.
func (r *fetchStage) setSpooled(ctx context.Context, sha string, size int64, data spool.Entry, batch string, rowsWant *int64, byManifest bool) error {
	fenced, err := spooled(ctx, r.d, []*fileRun{r.fileRun}, []ledger.Spooled{{In: r.in, SHA256: sha, Size: size,
		DataSHA256: data.SHA256, DataSize: data.Size, BatchID: batch, ExpectedRows: rowsWant}})
	if len(fenced) > 0 {
		return &ledger.FencedError{IntakeID: r.in.ID, Token: r.in.Token, Step: "spooled"}
	}
	if err == nil || errors.Is(err, fault.ErrInjected) {
		r.byManifest = r.byManifest || byManifest
	}
	return err
}

// spooled is the end of the fetch stage for one file or a group's
// (ledger.SetSpooled, one statement): each file claimed -> spooled, its
// batch bound with it (its run's bound). It returns the runs fenced out
// (nothing recorded of them).
func spooled(ctx context.Context, d *Daemon, runs []*fileRun, fs []ledger.Spooled) (fenced []*fileRun, err error) {
	bound, err := d.ledger.SetSpooled(ctx, fs)
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		b, ok := bound[r.in.ID]
		if !ok {
			fenced = append(fenced, r)
			continue
		}
		r.bound = b
	}
	return fenced, fault.Check("spool:after")
}

// manifestDuplicate decides an exact resend from its manifest alone: when
// the manifest states the sha256 and byte count of the file the batch is
// already bound to, and the listing saw that many bytes, the file is
// recorded as spooled with the bound file's hashes (the binding then says
// duplicate) without being read. It reports whether it did. The manifest is
// trusted here as far as it is for every file of the partner: the partner
// signs off on what it states; the listed size must agree besides, so a
// resend whose size changed is always read (see docs/failure-matrix.md,
// "Duplicates decided from the manifest"). bound, when not nil, is the
// look-up of the batch's file begun beside the manifest's read, for the
// batch named by the file (a batch the manifest names is looked up here).
func (r *fetchStage) manifestDuplicate(ctx context.Context, man *partners.Manifest, batch string, bound *background[*ledger.BoundFile]) (bool, error) {
	in := r.in
	if man.SHA256 == "" || man.Bytes != in.ListedSize {
		return false, nil
	}
	var b *ledger.BoundFile
	var err error
	if bound != nil {
		b, err = bound.wait()
	} else {
		b, err = r.d.ledger.BatchBoundFile(ctx, in, batch)
	}
	if err != nil || b == nil {
		return false, err
	}
	if b.SHA256 != man.SHA256 || b.Size != man.Bytes {
		return false, nil
	}
	// Should the binding go meanwhile (its owner failed), SetSpooled binds
	// the batch to this intake with the stated hashes: the bytes applied
	// are then the spool's under that sha256, or the file's own, read and
	// compared by ensureSpooled (manifest_mismatch when they differ).
	err = r.setSpooled(ctx, b.SHA256, b.Size, spool.Entry{SHA256: b.DataSHA256, Size: b.DataSize}, batch, man.Rows, true)
	if r.byManifest {
		r.d.metrics.HashOnly.WithLabelValues(in.Partner, "manifest").Inc()
		r.log.Info("exact resend decided from its manifest, the file was not read", "batch_owner", b.Owner)
	}
	return r.byManifest, err
}

// faultWriter reaches the download:mid fault once the first bytes are in
// the temp file, and download:half once half of the file's are.
type faultWriter struct {
	w    io.Writer
	n    int
	half int64 // bytes to half the file; "download:half" once written
}

func (f *faultWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if f.n++; f.n == 1 {
		if ferr := fault.Check("download:mid"); ferr != nil {
			return n, ferr
		}
	}
	if f.half > 0 {
		if f.half -= int64(n); f.half <= 0 {
			if ferr := fault.Check("download:half"); ferr != nil {
				return n, ferr
			}
		}
	}
	return n, err
}

// scanCheckBytes: from this listed size on, download asks whether the
// batch is already held before scanning the rows during the download.
var scanCheckBytes int64 = 4 << 20

// fetch downloads the claimed file into the spool, its rows read as they
// land when withScan says so. With unwrapToo, a file whose unwrapping
// streams (an OpenPGP message) is unwrapped as it downloads: the
// unwrapping is returned with the download's bytes whole (nil for other
// files, or when the download failed), for the caller to wait for or
// drop.
func (r *fetchStage) fetch(ctx context.Context, withScan, unwrapToo bool) (spool.Entry, *unwrapping, error) {
	release, size, max, src, err := r.openClaimed()
	if err != nil {
		return spool.Entry{}, nil, err
	}
	defer release()
	r.dropAhead() // an earlier download's
	var opts []spool.PutOption
	landed := func(spool.Entry, error) {}
	var u *unwrapping
	switch {
	case withScan && unwrap.Kind(r.feed, r.in.RemoteName) == "":
		var follow spool.PutOption
		follow, landed = r.followRows(ctx)
		opts = append(opts, follow)
	case unwrapToo:
		var follow spool.PutOption
		if follow, u = r.followUnwrap(ctx, withScan); follow != nil {
			// read once, by the unwrapping as it lands: past the page
			// cache (spool.Direct)
			opts = append(opts, follow, spool.Direct())
		}
	}
	e, err := r.d.spool.Put(r.in.Partner, size, max, src, opts...)
	landed(e, err)
	if u != nil && u.fl == nil {
		u.stop()
		u = nil // the download failed before its first byte
	}
	if err != nil {
		if u != nil {
			u.drop(r)
		}
		return e, nil, err
	}
	r.d.metrics.BytesDownloaded.WithLabelValues(r.in.Partner).Add(float64(e.Size))
	return e, u, nil
}

// followRows is the spool's option that reads a file's rows as they land
// in it, for the bytes the rows are read from (the file itself, or what
// it expands or decrypts to): the rows validated for the plan in the
// same pass (r.pre), and a large file applied ahead of its plan
// (ahead.go), so that neither waits for the bytes to be whole. landed
// takes what the spool made of them (or its failure) and keeps, or
// drops, what followed them.
func (r *fetchStage) followRows(ctx context.Context) (follow spool.PutOption, landed func(spool.Entry, error)) {
	var pre *preScan
	var ah *ahead
	wantAhead := r.aheadWanted()
	follow = spool.Follow(func(fl *spool.Follower) {
		pre = &preScan{done: make(chan *scan, 1), stop: fl}
		if wantAhead {
			if ah = r.startAhead(ctx, fl, pre.done); ah != nil {
				pre.stop = ah // the follower is the apply ahead's
				return
			}
		}
		go func() {
			sc := scanRows(fl, r.feed, r.p.cfg.Limits.MaxRows)
			fl.Close() // read to its end, or stopped at a file error: the put goes on
			pre.done <- sc
		}()
	})
	landed = func(e spool.Entry, err error) {
		if pre != nil {
			if err != nil {
				pre.stop.Close()
			} else {
				pre.sha = e.SHA256
				r.dropPre()
				r.pre = pre
			}
		}
		if ah != nil {
			r.ahead = ah
			if err != nil {
				r.dropAhead()
			} else {
				ah.sha = e.SHA256
			}
		}
	}
	return follow, landed
}

// fetchSame reads the claimed file through the hash alone and reports
// whether it is the spooled file sha (see download).
func (r *fetchStage) fetchSame(ctx context.Context, sha string) (spool.Entry, bool, error) {
	release, size, max, src, err := r.openClaimed()
	if err != nil {
		return spool.Entry{}, false, err
	}
	defer release()
	e, same, err := r.d.spool.Same(r.in.Partner, sha, size, max, src)
	if err == nil {
		r.d.metrics.BytesDownloaded.WithLabelValues(r.in.Partner).Add(float64(e.Size))
	}
	return e, same, err
}

// openClaimed opens the claimed file for a download: it returns the
// size, the partner's size limit, the source that streams the file and
// release, which the caller defers (it closes what was opened). The OPEN
// and an LSTAT of the claimed path go out together, one round trip where
// the OPEN and then the handle's FSTAT took two: both name the same path
// at the same moment on the site (OpenSSH answers them in order), and a
// file changed on the site meanwhile shows as bytes other than the
// LSTAT's, which the download's checks refuse. A path that is not a
// regular file (a symbolic link swapped into ready/ between the listing
// and the claim, whose RENAME moves the link itself: the OPEN follows it
// to whatever it names, another partner's file on a shared account) is
// refused with errNotRegular before a byte is read. A large file from a far
// site is read over two channels: the session's second channel, started
// beside the claim (startRanges), opens it too, and its readers join the
// main channel's, which read from the first byte (siteread.TwoChannels): the
// download never waits for the second channel (docs/performance.md,
// "SFTP requests written by hand"). What is given up on the way (an error, a file read on one
// channel) closes the second channel's file in the background.
func (r *fetchStage) openClaimed() (release func(), size, max int64, src spool.Source, err error) {
	second := r.openSecond(r.in.ListedSize)
	f, st, err := r.takeOpening()
	var serr error
	if f == nil {
		src := r.source()
		stat := inBackground(func() (os.FileInfo, error) { return r.sess.Lstat(src) })
		f, err = r.sess.Open(src)
		st, serr = stat.wait()
	}
	fail := func(err error) (func(), int64, int64, spool.Source, error) {
		go closeUnused(second)
		if f != nil {
			f.Close()
		}
		return nil, 0, 0, nil, err
	}
	switch {
	case sftpconn.IsNotExist(err):
		return fail(ErrRemoteLost)
	case err != nil:
		return fail(fmt.Errorf("open %s: %w", r.source(), err))
	case serr != nil:
		return fail(fmt.Errorf("lstat %s: %w", r.source(), serr))
	case !st.Mode().IsRegular():
		return fail(errNotRegular)
	}
	max = r.p.cfg.Limits.MaxFileBytes
	if r.in.Override == ledger.OverrideSize {
		max = 1 << 62 // released by ops despite the limit
	}
	if st.Size() > max {
		return fail(spool.ErrTooLarge)
	}
	src = f.WriteTo
	if st.Size() < siteread.SmallBytes {
		src = siteread.Small(f, st.Size())
	}
	if readOnTwo(r.sess, st.Size()) {
		if second == nil {
			second = r.openSecond(st.Size())
		}
	} else if second != nil {
		go closeUnused(second) // listed large, smaller now: one channel
		second = nil
	}
	release = func() { f.Close() }
	if second != nil {
		// the source closes the second channel's file once its readers
		// are done; a source never run leaves it to release
		var ran atomic.Bool
		log, sec := r.log, second
		two := siteread.TwoChannels(r.sess.Deadline, f, func() (siteread.File, error) {
			f2, err := sec.wait()
			if err != nil {
				log.Debug("the second channel could not open the file; it is read on one", "err", err)
				return nil, err
			}
			return f2, nil
		}, st.Size())
		src = func(w io.Writer) (int64, error) {
			ran.Store(true)
			return two(w)
		}
		release = func() {
			f.Close()
			if !ran.Load() {
				go closeUnused(sec)
			}
		}
	}
	if fault.Enabled() {
		inner := src
		half := st.Size()/2 + 1
		src = func(w io.Writer) (int64, error) { return inner(&faultWriter{w: w, half: half}) }
	}
	return release, st.Size(), max, src, nil
}

// errNotRegular: the claimed path is not a regular file (see
// openClaimed); the file is held as not_regular_file, unread.
var errNotRegular = errors.New("the claimed path is not a regular file")

// takeOpening returns the file its claim opened (RenameAndOpen) and its
// LSTAT, if the claim did and both came back; else nothing, and the file
// is opened now. An early OPEN that failed is not taken for the file's
// fate: a site that answers out of order may have taken it before the
// RENAME.
func (r *fetchStage) takeOpening() (*sftp.File, os.FileInfo, error) {
	o := r.opening
	if o == nil {
		return nil, nil, nil
	}
	r.opening = nil
	f, st, err := o.Wait()
	if err != nil {
		r.log.Debug("the file opened behind its claim could not be read; opened again", "err", err)
		return nil, nil, nil
	}
	return f, st, nil
}

// openSecond opens the claimed file on the session's second channel
// (Session.Ranges) in the background when a file of size is read over two
// channels (readOnTwo); else it returns nil.
func (r *fetchStage) openSecond(size int64) *background[*sftp.File] {
	if !readOnTwo(r.sess, size) {
		return nil
	}
	src := r.source()
	return inBackground(func() (*sftp.File, error) {
		c := r.sess.Ranges()
		if c == nil {
			return nil, errors.New("the site refused a second channel")
		}
		return c.Open(src)
	})
}

// readOnTwo reports whether a file of size from sess's site is read over
// two channels: large (twoChannelBytes), far (farSite), and the
// site has not refused the second channel (a site that did is read with
// pkg/sftp's WriteTo on one, as a near one).
func readOnTwo(sess *sftpconn.Session, size int64) bool {
	return size >= twoChannelBytes && farSite(sess) && !sess.RangesRefused()
}

// startRanges starts the session's second channel (Session.Ranges) in the
// background when a file of size is about to be claimed and is read over
// two (readOnTwo): the channel's open, subsystem and version exchange
// (three round trips) then overlap the claim instead of following it.
// When the claim is lost, the channel stays for the session's next large
// file, as it does after a download.
func startRanges(sess *sftpconn.Session, size int64) {
	if readOnTwo(sess, size) {
		go sess.Ranges()
	}
}

// closeUnused closes the file the second channel opened, if any: it was
// not used.
func closeUnused(o *background[*sftp.File]) {
	if o == nil {
		return
	}
	if f, err := o.wait(); err == nil {
		f.Close()
	}
}

// haveData makes sure the step about to run can read the bytes the
// file's rows come from: at hand from this run's download (the plan's
// scan or the apply ahead of these very bytes), or in the spool
// (ensureSpooled). A file decrypted as it downloaded and applied ahead
// does not keep its plaintext there (unwrap.Job.Unkept): a step that
// reads the file from the spool has it made again from the spooled
// original first (ensureSpooled, again).
func (r *fetchStage) haveData(ctx context.Context) error {
	sha := r.in.DataSHA256
	if (r.pre != nil && r.pre.sha == sha) || (r.ahead != nil && r.ahead.sha == sha) {
		return nil
	}
	return r.ensureSpooled(ctx)
}

// ensureSpooled makes sure the spool still holds the file's bytes (a
// takeover on another machine, or a lost spool disk): if not, it fetches
// them again from processing/ and checks they are the same bytes.
func (r *fetchStage) ensureSpooled(ctx context.Context) error {
	in := r.in
	if r.d.spool.Has(in.Partner, in.DataSHA256, in.DataSize) {
		return nil
	}
	if ok, err := r.reexpand(ctx); ok || err != nil {
		return err // the expanded copy was removed when the file finished (dropExpanded)
	}
	e, _, err := r.fetchAgain(ctx)
	if errors.Is(err, ErrRemoteLost) {
		return r.hold(ctx, ledger.StateFailedTerminal, reason.RemoteLost, 0, "neither the spool nor the site (processing/, or archive/ for a replay) holds the file's bytes any more")
	}
	if err != nil {
		return err
	}
	if e.SHA256 != in.SHA256 {
		return r.hold(ctx, ledger.StateQuarantined, reason.ManifestMismatch, 0, "the bytes in processing/ changed after they were first downloaded")
	}
	r.log.Info("spool entry was missing; fetched the same bytes again")
	if in.DataSHA256 != in.SHA256 {
		return r.expandAgain(ctx, e)
	}
	return nil
}

// fetchAgain downloads the file's bytes again for ensureSpooled: from its
// claimed path, or for a replay (whose bytes were the spool's of the
// replica that ran the file, not necessarily this one's) from an archived
// copy of the same bytes on the site, which is only read. None is
// ErrRemoteLost.
func (r *fetchStage) fetchAgain(ctx context.Context) (spool.Entry, *unwrapping, error) {
	if r.in.ReplayOf == 0 {
		return r.fetch(ctx, false, false)
	}
	src, err := r.d.ledger.ArchivedCopy(ctx, r.in.Partner, r.in.SHA256)
	if err != nil {
		return spool.Entry{}, nil, fmt.Errorf("archived copy: %w", err)
	}
	if src == "" {
		return spool.Entry{}, nil, fmt.Errorf("no archived copy: %w", ErrRemoteLost)
	}
	r.from = src // openClaimed reads it; the row keeps its own path
	return r.fetch(ctx, false, false)
}

// manifestInReady reports whether the file's manifest is still in ready/
// (the site refused to move it with its file) with no data file of its
// name there.
func (r *fetchStage) manifestInReady() bool {
	ready := r.sess.Layout.ReadyDir()
	if _, err := r.sess.Lstat(path.Join(ready, r.in.ManifestName)); err != nil {
		return false
	}
	_, err := r.sess.Lstat(path.Join(ready, r.in.RemoteName))
	return sftpconn.IsNotExist(err)
}

func (r *fetchStage) readManifest() (*partners.Manifest, error) {
	return r.sess.ReadManifest(path.Join(path.Dir(r.in.ClaimedPath), r.in.ManifestName))
}

// fileFailure maps a terminal parse error to a hold.
func (r *planStage) fileFailure(ctx context.Context, fe *rows.FileError) error {
	return r.hold(ctx, ledger.StateFailedTerminal, reason.Code(fe.Reason), fe.Line, fe.Detail)
}

// twoChannelBytes: a file of this size or more is read over two SFTP
// channels of the session (sftpconn.Session.Ranges), its ranges on
// whichever is free: every channel has its own 2 MiB SSH window, so at 50
// ms two carry twice what one does. Below it a second sftp-server on the
// site and its OPEN are not worth what they save.
var twoChannelBytes int64 = 16 << 20

// farRTT: a site at least this far away (Session.RTT) is far (farSite):
// its large files are read over two channels (readOnTwo). Near, one
// channel's window is no limit (at 1 ms it carries 2 GB/s): a second
// channel only adds a second sftp-server on the site and CPU on both
// ends; on this bench's loopback the 1M-row file's fresh, replay and
// duplicate runs were slower with it (two runs, docs/performance.md).
var farRTT = 5 * time.Millisecond

// farSite reports whether sess's site is far (farRTT).
func farSite(sess *sftpconn.Session) bool { return sess.RTT() >= farRTT }

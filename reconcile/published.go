package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// rowStaleRemoteTemps removes our hidden temporary files in reports/ and
// quarantine/ older than reconcile.stale_temp: a receipt or reason file
// write killed between create and rename leaves one, and nothing else
// would ever remove it. A live write renames its file within seconds. Only
// names the pipeline's temporary files have (sitefile.IsOurTemp) are removed, each
// by the name listed once a fresh stat confirms it is still a regular file
// that old: never a receipt, a reason file or a fresh temporary file.
//
// A run removes at most maxTempRemovals of them from a directory; the
// next run goes on (a site where a partner made millions of files under
// such names costs a run a bounded list).
func (r *Reconciler) rowStaleRemoteTemps(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	var errs []error
	for _, dir := range []string{s.Layout.ReportsDir(), s.Layout.QuarantineDir()} {
		// streamed (reports/ holds a receipt for every file until the
		// retention purges it); the temps are removed after the
		// listing, not while it runs
		var stale []string
		err := s.ListDir(ctx, dir, func(e os.FileInfo) error {
			if len(stale) < maxTempRemovals && e.Mode().IsRegular() && sitefile.IsOurTemp(e.Name()) && time.Since(e.ModTime()) >= r.cfg.StaleTemp {
				stale = append(stale, e.Name())
			}
			return nil
		})
		if sftpconn.IsNotExist(err) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := fault.Check("reconcile:remote_temps_listed"); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range stale {
			full := path.Join(dir, name)
			// the listing's verdict is checked again right before the
			// removal, by the name listed: a writer that stalled and
			// wrote on since (a fresh mtime), or anything but a regular
			// file now under that name, is left alone
			fi, err := s.Lstat(full)
			if sftpconn.IsNotExist(err) {
				continue // renamed into its receipt, or removed, since
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("stat %s: %w", full, err))
				continue
			}
			if !fi.Mode().IsRegular() || time.Since(fi.ModTime()) < r.cfg.StaleTemp {
				continue
			}
			if err := s.Remove(full); err != nil && !sftpconn.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("remove %s: %w", full, err))
				continue
			}
			add(ledger.Finding{Kind: ledger.KindStaleRemoteTemp, Path: full, Action: "deleted"})
		}
	}
	return errors.Join(errs...)
}

// maxTempRemovals bounds the stale temporary files one run removes from
// one directory.
const maxTempRemovals = 1000

// rowUnpublishedDiscards publishes the decision of a discarded file whose
// ops command recorded it but could not reach the partner's site: the
// reason file goes, the receipt says "discarded". One that fails (its
// receipt's name refused, its reason file not removable) is an error of
// the run and is tried again at the next; the partner's other discards
// are published all the same.
func (r *Reconciler) rowUnpublishedDiscards(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	rows, err := r.ledger.Undecided(ctx, p.ID)
	if err != nil {
		return err
	}
	var errs []error
	for _, in := range rows {
		if ctx.Err() != nil {
			return errors.Join(append(errs, ctx.Err())...)
		}
		err := fault.Check("reconcile:publish_discard")
		if err == nil {
			err = sitefile.PublishDiscarded(ctx, r.ledger, s, p, in)
		}
		var fe *ledger.FencedError
		if errors.As(err, &fe) {
			continue // published meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("intake %d: publish its discard: %w", in.ID, err))
			continue
		}
		add(ledger.Finding{Kind: ledger.KindDecisionPublished, IntakeID: in.ID, Path: in.ReceiptPath,
			Action: "receipt rewritten: discarded; reason file removed"})
	}
	return errors.Join(errs...)
}

package intake

import (
	"context"
	"errors"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// claim: record, for read-only sites (the account may list and read, not
// rename or delete): the claim lives only in PostgreSQL
// (intake_record_claim: partner, name, size, mtime; the intake row holds
// the sha256), files are never moved and nothing is written on the site.
// A file is taken once per (name, size, mtime); a file changed under the
// same name is a new claim, judged by the batch rules. Archive and
// quarantine are records, and the bytes are the spool's copy (kept for
// retention.spool). Readiness is stable (partners/config.go).

// recordBatch is how many entries of a listing one lookup of the claim
// table takes (intake/poll.go list).
const recordBatch = 512

// recordName is the name a claim is recorded under: the name itself, or
// an unsafe one quoted (names with invalid UTF-8 cannot be stored).
func recordName(name string) string { return printableName(name) }

// claimRecord claims a candidate by recording it: no RENAME, the claimed
// path is the file in ready/. A file recorded already (another replica
// won, or a live intake still holds its name) is skipped (nil).
func (d *claimStage) claimRecord(ctx context.Context, p *partnerRT, sess *sftpconn.Session, c candidate) (*ledger.Intake, error) {
	in := &ledger.Intake{Partner: p.cfg.ID, Feed: c.Feed.Name, RemoteName: c.Name, ClaimedPath: sess.Layout.Ready(c.Name),
		ListedSize: c.Size, ListedMTime: c.MTime, Worker: d.cfg.WorkerID}
	err := d.ledger.InsertRecordClaim(ctx, in, c.Name)
	if errors.Is(err, ledger.ErrTracked) {
		d.metrics.ClaimsLost.WithLabelValues(p.cfg.ID).Inc()
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := d.ledger.ForgetReady(ctx, p.cfg.ID, c.Name); err != nil {
		return nil, err
	}
	return in, nil
}

// holdHostileRecord holds a hostile entry of a read-only site: recorded
// (so it is held once, not at every listing) under a generated claimed
// path that names no file, and held unread like any hostile entry.
func (d *claimStage) holdHostileRecord(ctx context.Context, p *partnerRT, sess *sftpconn.Session, h partners.Skipped) error {
	gen := partners.HostileName(h.Reason)
	in := &ledger.Intake{Partner: p.cfg.ID, Feed: ledger.NoFeed, RemoteName: printableName(h.Info.Name()), ClaimedPath: sess.Layout.Ready(gen),
		ListedSize: h.Info.Size(), ListedMTime: h.Info.ModTime(), Worker: d.cfg.WorkerID}
	if err := d.ledger.InsertRecordClaim(ctx, in, recordName(h.Info.Name())); err != nil {
		if errors.Is(err, ledger.ErrTracked) {
			return nil
		}
		return err
	}
	return d.runFile(ctx, p, sess, in)
}

// holdRecord holds a file of a read-only site: the quarantine record
// (intake_quarantine, ops decide as for any held file) names the file
// where it is, in ready/ (a hostile entry: none); no reason file and no
// receipt are written (the site takes no writes); the log says why.
func (r *finishStage) holdRecord(ctx context.Context, to ledger.State, reason reason.Code, line int64, detail string) error {
	in := r.in
	in.ArchivePath = in.ClaimedPath
	if in.Feed == ledger.NoFeed {
		in.ArchivePath = ""
	}
	if err := r.d.ledger.Finish(ctx, in, in.State, to, reason); err != nil {
		return err
	}
	r.d.metrics.Finished(in.Partner, string(to))
	r.log.Warn("file held (claim: record: nothing moved on the site)", "state", to, "reason", reason, "line", line, "detail", detail)
	return nil
}

// archiveRecord finishes a file of a read-only site: nothing is moved and
// no receipt is written; the row is the record and the spool keeps the
// bytes for retention.spool.
func (r *finishStage) archiveRecord(outcome ledger.Outcome) (ledger.State, reason.Code, error) {
	r.in.ArchivePath = ""
	if outcome == ledger.OutcomeDuplicate {
		return ledger.StateDuplicate, reason.Duplicate, nil
	}
	return ledger.StateArchived, "", nil
}

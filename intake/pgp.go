package intake

import (
	"context"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// CheckPGPKeys is unwrap.CheckPGPKeys for `intake check`.
func CheckPGPKeys(p *partners.Config) error { return unwrap.CheckPGPKeys(p) }

// dropPlain removes a held file's plaintext from the spool unless another
// unfinished intake of the partner reads the same bytes.
func (r *fetchStage) dropPlain(e spool.Entry) { r.dropUnused(e, "held file's plaintext") }

// dropUnused removes a spool entry this run made of other bytes (a held
// file's plaintext, a copy made to read a newer file) unless another
// unfinished intake of the partner reads the same bytes; what names it in
// the warning a failure logs.
func (r *fileRun) dropUnused(e spool.Entry, what string) {
	// the file's id and partner only: the decryption may run beside the
	// download, which records the file's other fields meanwhile
	probe := ledger.Intake{ID: r.in.ID, Partner: r.in.Partner, DataSHA256: e.SHA256}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	busy, err := r.d.ledger.DataInUse(ctx, &probe)
	if err == nil && !busy {
		err = r.d.spool.Remove(r.in.Partner, e.SHA256)
	}
	if err != nil {
		r.log.Warn(what+" not removed from the spool; purge removes it at retention", "err", err)
	}
}

// feedPGP is the run's feed's pgp setting; nil for a file no feed
// matches (a hostile entry).
func (r *fileRun) feedPGP() *partners.PGP {
	if r.feed == nil {
		return nil
	}
	return r.feed.PGP
}

package intake

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/intake/targethold"
	"github.com/partner-intake/partner-intake/spool"
)

// gauges sets the gauges that describe the pipeline as the database and
// the spool see it.
type gauges struct {
	ledger  *ledger.Ledger
	spool   *spool.Spool
	parts   *partnerSet
	holds   *targethold.Keeper
	metrics *metrics.Set
	log     *slog.Logger
}

// loop refreshes the database-derived gauges every 15 s, reads the
// tables of held feeds whose retry is due (targethold.go), and the
// spool's size every minute.
func (g *gauges) loop(ctx context.Context) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		if err := g.refresh(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("refresh gauges", "err", err)
		}
		g.holds.Recheck(ctx)
		if i%4 == 0 {
			g.refreshSpoolBytes()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refresh sets the gauges that describe the whole pipeline as the
// database sees it: files per state, oldest file in processing, open
// quarantine, progress of files being applied. Every replica reports the
// same cluster-wide numbers; alert rules aggregate with max().
func (g *gauges) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := g.metrics
	order := g.parts.ids() // a reload may change them meanwhile
	gs, err := g.ledger.Gauges(ctx, order)
	if err != nil {
		return fmt.Errorf("refresh gauges: %w", err)
	}
	holds, err := g.ledger.OpenHolds(ctx, order)
	if err != nil {
		return fmt.Errorf("refresh gauges: %w", err)
	}
	m.SetFiles(order, gs, holds)
	for _, p := range g.parts.list() {
		id := p.cfg.ID
		p.statMu.Lock()
		age, polling := 0.0, p.polling
		if !p.oldestReady.IsZero() {
			age = time.Since(p.oldestReady).Seconds()
		}
		p.statMu.Unlock()
		if polling { // else another replica speaks for the partner's ready/
			m.OldestReady.WithLabelValues(id).Set(age)
		}
	}
	return nil
}

// refreshSpoolBytes sets the bytes the spool holds per partner.
func (g *gauges) refreshSpoolBytes() { g.metrics.SetSpoolBytes(g.spool, g.parts.ids()) }

// PartnerState is what the daemon knows of a partner's site right now.
type PartnerState struct {
	Up        bool      `json:"up"`
	LastOK    time.Time `json:"last_ok,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	// PolledElsewhere: another live replica polls the partner (partner
	// affinity); this one's last poll of it would be stale, so the other
	// fields are left empty and that replica's /readyz speaks for it.
	PolledElsewhere bool `json:"polled_elsewhere,omitempty"`
	// HeldFeeds: the partner's feeds whose target table cannot be
	// written, and why; their files wait in ready/ (targethold.go).
	HeldFeeds map[string]string `json:"held_feeds,omitempty"`
}

// PartnerStates reports each partner's SFTP state as of the last poll.
func (d *Daemon) PartnerStates() map[string]PartnerState {
	out := map[string]PartnerState{}
	for _, p := range d.parts.list() {
		id := p.cfg.ID
		held := p.holds.Problems()
		p.statMu.Lock()
		if p.elsewhere {
			out[id] = PartnerState{PolledElsewhere: true, HeldFeeds: held}
		} else {
			out[id] = PartnerState{Up: p.up, LastOK: p.lastOK, LastError: p.lastErr, HeldFeeds: held}
		}
		p.statMu.Unlock()
	}
	return out
}

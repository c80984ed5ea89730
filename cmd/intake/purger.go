package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/schedule"
)

// purger runs the retention purge on retention.schedule inside the daemon
// (`intake purge` runs it once by hand). A lifecycle.Service: Stop cancels
// a purge in progress and waits for it.
type purger struct {
	life lifecycle.Base
	e    *env
	cfg  atomic.Pointer[config.File] // a reload's partners and retention; nil: e.cfg
}

// setConfig makes cfg's partners and retention those of the next purges.
func (p *purger) setConfig(cfg *config.File) { p.cfg.Store(cfg) }

func (p *purger) config() *config.File {
	if c := p.cfg.Load(); c != nil {
		return c
	}
	return p.e.cfg
}

func (p *purger) Start(ctx context.Context) error {
	ctx, err := p.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("purger: %w", err)
	}
	c := schedule.New(p.e.log)
	if _, err := c.AddFunc(p.e.cfg.Retention.Schedule, func() { p.purge(ctx) }); err != nil {
		return p.life.Abort(fmt.Errorf("retention.schedule: %w", err))
	}
	c.Start()
	p.life.Go(func() {
		<-ctx.Done()
		<-c.Stop().Done()
	})
	return nil
}

func (p *purger) Stop() { p.life.Stop() }

func (p *purger) purge(ctx context.Context) {
	e, cfg := p.e, p.config()
	res, err := ops.Purge(ctx, e.pool, e.spool, cfg.Partners, cfg.Retention, time.Now())
	if err != nil && !errors.Is(err, ops.ErrPurgeRunning) && ctx.Err() == nil {
		e.log.Error("purge failed", "err", err)
	}
	for _, r := range res {
		e.log.Info("purged", "partner", r.Partner, "spool_files", r.SpoolFiles, "spool_bytes", r.SpoolBytes,
			"row_issues", r.RowIssues, "claim_ids", r.ClaimIDs, "reports", r.Reports, "audit_entries", r.AuditEntries, "audit_left_to_purge_role", r.AuditSkipped)
	}
}

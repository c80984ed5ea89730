package intake

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/siteindex"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Two partners configured on one tree under different spellings (a root
// of "." and the home directory spelled out, a symbolic link, a host name
// and its address) would each claim, archive and report in the other's
// directories: the configuration's textual check cannot see it. Each
// partner's site is resolved by the server (sftpconn.Session.Site: the
// host key it proved, the account, the root after REALPATH) when it is
// first dialled, and a partner whose site is another configured
// partner's, or lies inside it, is refused, both of them, until the
// configuration changes: every poll of either fails with reason
// site_shared (intake_partner_up 0, the error logged and in status).

// siteCheck resolves each partner's site when it is first dialled and
// refuses partners that share a tree, or whose server cannot serve them.
type siteCheck struct {
	index    siteindex.Index // each partner's site as first dialled
	ledger   *ledger.Ledger
	conns    *sftpconn.Conns
	parts    *partnerSet
	workerID string
	log      *slog.Logger
}

// reasonSiteShared is the poll error's reason code.
const reasonSiteShared = "site_shared"

// resolve resolves p's site once per configuration of it (a reload
// makes a new partnerRT) and refuses it when it overlaps another's, or
// when its server's profile cannot serve it (profile). Every session
// of a partner whose server's RENAME overwrites is told so before it
// renames anything (sftpconn.Session.SetRenameOverwrites).
func (c *siteCheck) resolve(ctx context.Context, p *partnerRT, s *sftpconn.Session) error {
	if p.site.Load() == nil {
		site, err := s.Site()
		if err != nil {
			return fmt.Errorf("partner %s: %w", p.cfg.ID, err)
		}
		if err := c.profile(ctx, p, s, site); err != nil {
			return err
		}
		p.site.Store(&site)
		c.index.Put(p.cfg.ID, site)
	}
	s.SetRenameOverwrites(p.overwrites.Load())
	s.SetEmptyDirsVanish(p.vanish.Load())
	return c.shared(p)
}

// profileFor is how long a measured site profile is trusted.
const profileFor = 24 * time.Hour

// profile measures the partner's server (sftpconn.Session.
// MeasureProfile: RENAME over an existing name, the extensions offered,
// empty directories, mtimes, case, REALPATH) when the partner is first
// dialled and keeps the profile in PostgreSQL for a day, so a one-shot
// run or a replica reads it instead of measuring again, and `intake
// status` shows it. A server whose RENAME overwrites is served with
// sessions that make sure of each rename's target themselves
// (resolve); a partner its profile cannot serve (partners.Profile.
// Serves: readiness stable on such a server) is refused, as intake check
// refuses it: every poll fails with reason rename_overwrites and no file
// is taken (the server is measured again at each poll, so one fixed since
// is served at the next). A claim: record partner never renames and is
// not measured. The limits only `intake check` measures are read from the
// row it kept: the channels one connection starts bound the sessions the
// partner's connections carry (sftpconn.Conns.SetChannels).
func (c *siteCheck) profile(ctx context.Context, p *partnerRT, s *sftpconn.Session, site partners.Site) error {
	if p.cfg.Records() {
		return nil
	}
	key := site.Key()
	prof, err := c.ledger.SiteProfile(ctx, p.cfg.ID)
	if err != nil {
		return err
	}
	// measured again when unknown, of another site, a day old, measured
	// in part, or found unable to serve the partner
	if prof == nil || prof.Site != key || time.Since(prof.MeasuredAt) > profileFor || !prof.Complete || prof.Profile.Serves(p.cfg) != nil {
		measured, err := s.MeasureProfile(c.workerID)
		if err != nil {
			return fmt.Errorf("partner %s: measure the server: %w", p.cfg.ID, err)
		}
		if err := c.ledger.RecordSiteProfile(ctx, p.cfg.ID, key, measured); err != nil {
			return err
		}
		c.log.Info("partner's server measured", "partner", p.cfg.ID, "profile", measured.String())
		if prof != nil && prof.Site == key {
			// the limits intake check measured on this site, which the
			// row keeps
			measured.MaxRead, measured.Handles, measured.Channels = prof.Profile.MaxRead, prof.Profile.Handles, prof.Profile.Channels
		}
		prof = &ledger.SiteProfile{Site: key, Profile: measured, Complete: true}
	}
	if err := prof.Profile.Serves(p.cfg); err != nil {
		c.log.Error("the partner's server cannot serve it safely: not polled", "partner", p.cfg.ID, "reason", reasonRenameOverwrites, "profile", prof.Profile.String())
		return fmt.Errorf("partner %s: %w (reason %s)", p.cfg.ID, err, reasonRenameOverwrites)
	}
	p.overwrites.Store(prof.Profile.RenameOverwrites)
	p.vanish.Store(!prof.Profile.EmptyDirPersists)
	p.nocase.Store(prof.Profile.CaseInsensitive)
	p.restamps.Store(prof.Profile.RenameRestampsMTime)
	p.handles.Store(int32(min(prof.Profile.Handles, partners.MaxHandlesProbe)))
	// the channels a connection intake check measured: the partner's
	// later sessions are put on connections with as many sessions as
	// have their channels (this first one was dialled before it was known)
	c.conns.SetChannels(p.cfg, prof.Profile.Channels)
	return nil
}

// reasonRenameOverwrites is the poll error's reason code.
const reasonRenameOverwrites = "rename_overwrites"

// siteShared is the error of a partner whose resolved site is another
// configured partner's tree or overlaps it (nil when not, or not yet
// resolved).
func (c *siteCheck) shared(p *partnerRT) error {
	mine := p.site.Load()
	if mine == nil {
		return nil
	}
	var other string
	for _, id := range c.index.Overlapping(p.cfg.ID, *mine) {
		if _, configured := c.parts.get(id); configured {
			other = id
			break
		}
	}
	if other == "" {
		return nil
	}
	c.log.Error("two partners are one tree on their server: both refused until the configuration changes",
		"partner", p.cfg.ID, "other_partner", other, "reason", reasonSiteShared)
	return fmt.Errorf("partner %s: its site is partner %s's tree, or one lies inside the other, as the server resolves them (%s); neither is polled until the configuration changes (reason %s)",
		p.cfg.ID, other, inert.Quote(mine.Root), reasonSiteShared) // the server's words
}

// batchIDOf is the batch id a file's name gives under its feed's rule
// (partners.Feed.BatchIDFromName), in lower case when the partner's server
// compares names without case (its measured profile): two names that
// differ only by case are one name to such a server, so the same batch,
// never two files of two batches.
func batchIDOf(f *partners.Feed, name string, fold bool) string {
	b := f.BatchIDFromName(name)
	if fold {
		b = strings.ToLower(b)
	}
	return b
}

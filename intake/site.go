package intake

import (
	"fmt"

	"github.com/partner-intake/partner-intake/partners"
)

// Two partners configured on one tree under different spellings (a root
// of "." and the home directory spelled out, a symbolic link, a host name
// and its address) would each claim, archive and report in the other's
// directories: the configuration's textual check cannot see it. Each
// partner's site is resolved by the server (partners.Session.Site: the
// host key it proved, the account, the root after REALPATH) when it is
// first dialled, and a partner whose site is another configured
// partner's, or lies inside it, is refused, both of them, until the
// configuration changes: every poll of either fails with reason
// site_shared (intake_partner_up 0, the error logged and in status).

// reasonSiteShared is the poll error's reason code.
const reasonSiteShared = "site_shared"

// resolveSite resolves p's site once per configuration of it (a reload
// makes a new partnerRT) and refuses it when it overlaps another's.
func (d *Daemon) resolveSite(p *partnerRT, s *partners.Session) error {
	if p.site.Load() == nil {
		site, err := s.Site()
		if err != nil {
			return fmt.Errorf("partner %s: %w", p.cfg.ID, err)
		}
		p.site.Store(&site)
		d.sites.Store(p.cfg.ID, site)
	}
	return d.siteShared(p)
}

// siteShared is the error of a partner whose resolved site is another
// configured partner's tree or overlaps it (nil when not, or not yet
// resolved).
func (d *Daemon) siteShared(p *partnerRT) error {
	mine := p.site.Load()
	if mine == nil {
		return nil
	}
	var other string
	d.sites.Range(func(k, v any) bool {
		id := k.(string)
		if id == p.cfg.ID {
			return true
		}
		if _, configured := d.partner(id); !configured {
			return true
		}
		if partners.SiteOverlaps(*mine, v.(partners.Site)) {
			other = id
			return false
		}
		return true
	})
	if other == "" {
		return nil
	}
	d.log.Error("two partners are one tree on their server: both refused until the configuration changes",
		"partner", p.cfg.ID, "other_partner", other, "reason", reasonSiteShared)
	return fmt.Errorf("partner %s: its site is partner %s's tree, or one lies inside the other, as the server resolves them (%s); neither is polled until the configuration changes (reason %s)",
		p.cfg.ID, other, mine.Root, reasonSiteShared)
}

package sftpconn

import (
	"context"
	"fmt"

	"github.com/partner-intake/partner-intake/partners"
)

// Probe connects to the partner with its pinned host key, checks that
// intake can create and write its directories, measures the server's
// profile there (MeasureProfile, and the limits: MeasureLimits,
// MeasureChannels), which it returns, and checks that ready/
// exists (on a server that keeps no empty directory, a ready/ that is not
// there is an empty one).
// It fails where the profile cannot serve the partner safely
// (partners.Profile.Serves), as the daemon refuses it then. It leaves nothing
// behind.
func Probe(ctx context.Context, p *partners.Config, worker string) (partners.Profile, error) {
	prof, _, err := ProbeSite(ctx, p, worker)
	return prof, err
}

// ProbeSite is Probe, and the site the profile was measured on as the
// server resolves it (the zero Site when that failed): `intake check`
// keeps the profile under it.
func ProbeSite(ctx context.Context, p *partners.Config, worker string) (partners.Profile, partners.Site, error) {
	s, err := Dial(ctx, p)
	if err != nil {
		return partners.Profile{}, partners.Site{}, err
	}
	defer s.Close()
	prof, err := probe(s, p, worker)
	if err != nil && prof == (partners.Profile{}) {
		return prof, partners.Site{}, err
	}
	site, serr := s.Site()
	if serr != nil {
		site = partners.Site{}
	}
	return prof, site, err
}

func probe(s *Session, p *partners.Config, worker string) (partners.Profile, error) {
	ready := s.Layout.ReadyDir()
	st, rerr := s.Stat(ready)
	if rerr == nil && !st.IsDir() {
		return partners.Profile{}, fmt.Errorf("partner %s: dirs.ready %s is not a directory", p.ID, ready)
	}
	if rerr != nil && !IsNotExist(rerr) {
		return partners.Profile{}, fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, rerr)
	}
	// intake's own directories (ready/ is the partner's: not made here)
	if _, err := ensureDirs(s.Client, s.Layout, worker, map[string]bool{ready: true}); err != nil {
		return partners.Profile{}, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	prof, err := s.MeasureProfile(worker)
	if err != nil {
		return prof, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	prof.MaxRead, prof.Handles = s.MeasureLimits(worker)
	prof.Channels = s.MeasureChannels()
	if rerr != nil && prof.EmptyDirPersists {
		return prof, fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, rerr)
	}
	if err := prof.Serves(p); err != nil {
		return prof, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	return prof, nil
}

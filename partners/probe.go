package partners

import (
	"context"
	"fmt"
)

// Probe connects to the partner with its pinned host key, checks that
// intake can create and write its directories, measures the server's
// profile there (MeasureProfile), which it returns, and checks that ready/
// exists (on a server that keeps no empty directory, a ready/ that is not
// there is an empty one).
// It fails where the profile cannot serve the partner safely
// (Profile.Serves), as the daemon refuses it then. It leaves nothing
// behind.
func Probe(ctx context.Context, p *Config, worker string) (Profile, error) {
	s, err := Dial(ctx, p)
	if err != nil {
		return Profile{}, err
	}
	defer s.Close()
	ready := s.Layout.ReadyDir()
	st, rerr := s.Stat(ready)
	if rerr == nil && !st.IsDir() {
		return Profile{}, fmt.Errorf("partner %s: dirs.ready %s is not a directory", p.ID, ready)
	}
	if rerr != nil && !IsNotExist(rerr) {
		return Profile{}, fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, rerr)
	}
	// intake's own directories (ready/ is the partner's: not made here)
	if _, err := s.Layout.ensureDirs(s.Client, worker, map[string]bool{ready: true}); err != nil {
		return Profile{}, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	prof, err := s.MeasureProfile(worker)
	if err != nil {
		return prof, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	prof.MaxRead, prof.Handles = s.MeasureLimits(worker)
	if rerr != nil && prof.EmptyDirPersists {
		return prof, fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, rerr)
	}
	if err := prof.Serves(p); err != nil {
		return prof, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	return prof, nil
}

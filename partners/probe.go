package partners

import (
	"context"
	"fmt"
)

// Probe connects to the partner with its pinned host key, checks that
// ready/ exists and that intake can create and write its directories, and
// measures the server's profile there (MeasureProfile), which it returns.
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
	st, err := s.Stat(ready)
	if err != nil {
		return Profile{}, fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, err)
	}
	if !st.IsDir() {
		return Profile{}, fmt.Errorf("partner %s: dirs.ready %s is not a directory", p.ID, ready)
	}
	if _, err := s.Layout.EnsureDirs(s.Client, worker); err != nil {
		return Profile{}, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	prof, err := s.MeasureProfile(worker)
	if err != nil {
		return prof, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	if err := prof.Serves(p); err != nil {
		return prof, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	return prof, nil
}

package affinity

import "time"

// Age makes the view in hand d older, as a pause of the replica does.
func (p *Peers) Age(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at, p.lastAt = p.at.Add(-d), p.lastAt.Add(-d)
}

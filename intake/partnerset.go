package intake

import (
	"sync"
	"sync/atomic"
)

// partnerSet is the daemon's partners: a reload swaps byID and order
// under mu (reload.go), which readers beside a reload take (list, ids,
// get).
type partnerSet struct {
	mu       sync.RWMutex
	byID     map[string]*partnerRT
	order    []string
	retiring []*partnerRT // removed or replaced by a reload, still finishing a poll
	// unsettledRemoved: a reload removed a partner that was not settled
	// (reload.go retire): the run is not drained
	unsettledRemoved atomic.Bool
}

// list is the current partners in configuration order.
func (s *partnerSet) list() []*partnerRT {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.listLocked()
}

func (s *partnerSet) listLocked() []*partnerRT {
	out := make([]*partnerRT, len(s.order))
	for i, id := range s.order {
		out[i] = s.byID[id]
	}
	return out
}

// ids is the current partner ids in configuration order.
func (s *partnerSet) ids() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]string(nil), s.order...)
}

// get is the current runtime of a partner.
func (s *partnerSet) get(id string) (*partnerRT, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.byID[id]
	return p, ok
}

package intake

import (
	"sync"
	"time"
)

// refusedFor is how long an entry of ready/ the site refused to move is
// passed over by the partner's listings before its claim is tried again
// (the partner may have fixed its permissions meanwhile).
var refusedFor = 15 * time.Minute

// maxRefusedKept bounds the entries a partner's refusals remember; past
// it the oldest is forgotten (tried again at the next poll).
const maxRefusedKept = 4096

// refusals are the entries of a partner's ready/ whose claim's RENAME the
// site refused, each as it was listed (name, size, mtime) and until when
// the listing passes it over: the poll's bounded set of the oldest files
// (max_files_per_poll) is then filled by files it can claim, not by the
// same refused ones at every poll. An entry changed since (another size
// or mtime) is a new delivery and is tried at once.
type refusals struct {
	mu sync.Mutex
	m  map[string]refusal1
}

type refusal1 struct {
	size  int64
	mtime time.Time
	until time.Time
}

// remember records that the site refused to move the entry.
func (r *refusals) remember(name string, size int64, mtime time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]refusal1{}
	}
	if len(r.m) >= maxRefusedKept {
		var oldest string
		for n, e := range r.m {
			if oldest == "" || e.until.Before(r.m[oldest].until) {
				oldest = n
			}
		}
		delete(r.m, oldest)
	}
	r.m[name] = refusal1{size: size, mtime: mtime, until: time.Now().Add(refusedFor)}
}

// passOver reports whether the listing passes the entry over: the site
// refused to move it as it is listed now, less than refusedFor ago.
func (r *refusals) passOver(name string, size int64, mtime time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[name]
	if !ok {
		return false
	}
	if e.size != size || !e.mtime.Equal(mtime) || time.Now().After(e.until) {
		delete(r.m, name)
		return false
	}
	return true
}

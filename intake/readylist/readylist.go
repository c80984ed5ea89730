// Package readylist holds what a poll keeps of its listing of a
// partner's ready/ beyond one pass: the bounded set of the oldest entries
// (max_files_per_poll), the entries the site refused to move, passed over
// a while, and in manifest mode the data files found without their
// manifest, looked at again once a listing has passed every manifest.
package readylist

import (
	"sort"
	"sync"
	"time"
)

// Oldest keeps the n smallest items by (time, name): a max-heap whose top
// is the newest kept item, replaced when an older one comes.
type Oldest[T any] struct {
	n     int
	key   func(T) (time.Time, string)
	items []T
}

// NewOldest keeps the n oldest items by key (time, then name).
func NewOldest[T any](n int, key func(T) (time.Time, string)) *Oldest[T] {
	return &Oldest[T]{n: n, key: key}
}

func (o *Oldest[T]) less(a, b T) bool { // a is older than b
	ta, na := o.key(a)
	tb, nb := o.key(b)
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return na < nb
}

// Push offers x: kept while it is among the n oldest so far.
func (o *Oldest[T]) Push(x T) {
	if len(o.items) < o.n {
		o.items = append(o.items, x)
		for i := len(o.items) - 1; i > 0; { // sift up: parents are newer
			up := (i - 1) / 2
			if !o.less(o.items[up], o.items[i]) {
				break
			}
			o.items[up], o.items[i] = o.items[i], o.items[up]
			i = up
		}
		return
	}
	if o.n == 0 || !o.less(x, o.items[0]) {
		return
	}
	o.items[0] = x
	for i := 0; ; { // sift down
		l, r, big := 2*i+1, 2*i+2, i
		if l < len(o.items) && o.less(o.items[big], o.items[l]) {
			big = l
		}
		if r < len(o.items) && o.less(o.items[big], o.items[r]) {
			big = r
		}
		if big == i {
			break
		}
		o.items[i], o.items[big] = o.items[big], o.items[i]
		i = big
	}
}

// Sorted returns the kept items, oldest first.
func (o *Oldest[T]) Sorted() []T {
	out := append([]T(nil), o.items...)
	sort.Slice(out, func(i, j int) bool { return o.less(out[i], out[j]) })
	return out
}

// Window is how long an entry of ready/ the site refused to move is
// passed over by the partner's listings before its claim is tried again
// (the partner may have fixed its permissions meanwhile).
var Window = 15 * time.Minute

// maxRefusedKept bounds the entries a partner's refusals remember; past
// it the oldest is forgotten (tried again at the next poll).
const maxRefusedKept = 4096

// Refusals are the entries of a partner's ready/ whose claim's RENAME the
// site refused, each as it was listed (name, size, mtime) and until when
// the listing passes it over: the poll's bounded set of the oldest files
// (max_files_per_poll) is then filled by files it can claim, not by the
// same refused ones at every poll. An entry changed since (another size
// or mtime) is a new delivery and is tried at once.
type Refusals struct {
	mu sync.Mutex
	m  map[string]refusal1
}

type refusal1 struct {
	size  int64
	mtime time.Time
	until time.Time
}

// Remember records that the site refused to move the entry.
func (r *Refusals) Remember(name string, size int64, mtime time.Time) {
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
	r.m[name] = refusal1{size: size, mtime: mtime, until: time.Now().Add(Window)}
}

// PassOver reports whether the listing passes the entry over: the site
// refused to move it as it is listed now, less than Window ago.
func (r *Refusals) PassOver(name string, size int64, mtime time.Time) bool {
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

// MaxUnpaired bounds the data files Unpaired remembers a partner; past it,
// the newest are not remembered and take their places among the oldest
// as any file.
const MaxUnpaired = 4096

// Unpaired remembers, in manifest mode, the data files the last listing
// kept among the oldest without their manifest. A data file and its
// manifest come in either order, so the listing knows a file complete
// only at its end: a listing sets the remembered ones aside (Aside) and
// looks at them once it has passed every manifest, so data files whose
// manifest never comes do not take the poll's places among the oldest
// (max_files_per_poll) from complete pairs behind them. Only the
// partner's listing, one at a time, uses it.
type Unpaired struct {
	names map[string]bool
}

// Aside reports whether the listing sets the data file aside: the last
// listing found it without its manifest.
func (u *Unpaired) Aside(name string) bool { return u.names[name] }

// Remember replaces what is remembered by the data files this listing
// found without their manifest, at most MaxUnpaired of them.
func (u *Unpaired) Remember(names []string) {
	u.names = make(map[string]bool, min(len(names), MaxUnpaired))
	for _, n := range names[:min(len(names), MaxUnpaired)] {
		u.names[n] = true
	}
}

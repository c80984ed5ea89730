package intake

import "errors"

// background is a result made on a goroutine of its own, so that its
// round trips overlap the caller's: a listing beside the housekeeping, a
// second channel's OPEN beside the first. wait returns it once made, and
// again on later calls; a nil background waits for nothing and returns
// errNotStarted.
type background[T any] struct {
	done chan struct{}
	v    T
	err  error
}

var errNotStarted = errors.New("not started")

func inBackground[T any](f func() (T, error)) *background[T] {
	b := &background[T]{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		b.v, b.err = f()
	}()
	return b
}

func (b *background[T]) wait() (T, error) {
	if b == nil {
		var zero T
		return zero, errNotStarted
	}
	<-b.done
	return b.v, b.err
}

// resolved is a background already made: v, without a goroutine.
func resolved[T any](v T) *background[T] {
	b := &background[T]{done: make(chan struct{}), v: v}
	close(b.done)
	return b
}

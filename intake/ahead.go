package intake

import (
	"context"
	"errors"
	"hash/maphash"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/fault"
)

// Applying ahead of the plan. A large file's chunks are applied while it
// downloads, from the spool file as it is written (a spool.Follower, as
// the plan's own scan reads it), into one transaction that stays open
// until the plan decides: when the plan moves the file to applying, that
// transaction writes the chunks' ledger rows behind the first chunk's
// gate and commits (nothing of the file is visible before, and a worker
// fenced off meanwhile gets nothing through the gate); the rest of the
// file goes on one transaction a chunk, as apply does, from the same
// reader. When the plan holds the file, finds it a duplicate or fails it,
// or the run ends any other way, the transaction rolls back.
//
// Whatever goes wrong ahead (a key that exists after rows went straight
// in, a row the target refuses, a lost connection, a deadlock, the pool
// running short) only abandons it: the transaction rolls back and apply
// reads the file from the spool as it always does. So the protocol's
// states and the ledger mean what they meant; a crash loses at most the
// work done ahead.
//
// What it buys: the apply, PostgreSQL's work on one core, starts with the
// download instead of after the download and the plan
// (docs/performance.md).

// aheadBytes: files listed at this size or more are applied ahead.
var aheadBytes int64 = 8 << 20

// aheadPoolCheck: how often a transaction held open ahead looks whether
// the work pool ran out of connections. Two looks in a row that find
// every connection taken abandon it: the statements that would let it
// commit (the spooled record, the plan) need a connection themselves, and
// a transaction waiting on its rows' locks may hold the last one.
var aheadPoolCheck = 250 * time.Millisecond

// aheadLoadWait bounds an apply ahead's first load of its target table
// (a few catalog statements on the pool): long enough for a busy
// database, where the load alone took more than a look at the pool
// (under the race detector on a loaded machine), and short of waiting for
// good on a pool that stays full while the file's own plan waits for the
// rows' scan.
const aheadLoadWait = 10 * time.Second

// ahead is a file's apply running ahead of its plan.
type ahead struct {
	sha    string        // the spool entry it read, once the download is done
	cancel func()        // stops it (and its reader)
	goOn   chan struct{} // closed by apply: the plan said go
	hand   chan *aheadHand
	done   chan struct{}
	// planConns: the work pool's connections the file's own plan holds
	// (plan.go), counted once acquired. The apply ahead gives its
	// connection up when the pool stays full (pool_busy), for other files
	// and for its own plan while that waits for one; a connection its
	// plan holds, which it waits for anyway, does not count.
	planConns atomic.Int32
}

// aheadHand is what apply takes over: the open transaction with the
// chunks applied in it, and the reader, which goes on from there.
type aheadHand struct {
	conn    *pgxpool.Conn
	tx      pgx.Tx
	tgt     *target.Table
	chunks  []ledger.Chunk
	sum     chunkCounts
	direct  bool
	pending *chunk // taken from the reader and not applied: the file's last chunk
	full    chan *chunk
	free    chan *chunk
	readErr chan error
	stop    func() // stops the reader and closes the follower
}

// aheadWanted: the file is applied ahead while it downloads.
func (r *fetchStage) aheadWanted() bool {
	in := r.in
	return in.ListedSize >= aheadBytes && in.ChunksDone == 0 && in.ReplayOf == 0 &&
		!r.feed.Guarded() && in.ApprovedPlanHash == "" && r.d.ahead != nil
}

// startAhead starts applying ahead from fl, the follower of the spool file
// being written; the plan's scan of the rows is made in the same pass and
// sent to scanOut (once). It does not block: it returns nil when the
// daemon already applies as many files ahead as it allows.
func (r *fetchStage) startAhead(ctx context.Context, fl io.ReadCloser, scanOut chan<- *scan) *ahead {
	if !r.aheadSlot && !r.takeAheadSlot() {
		return nil
	}
	r.aheadSlot = false
	actx, cancel := context.WithCancel(ctx)
	a := &ahead{cancel: cancel, goOn: make(chan struct{}), hand: make(chan *aheadHand, 1), done: make(chan struct{})}
	go func() {
		defer func() { <-r.d.ahead }()
		defer close(a.done)
		defer close(a.hand)
		if outcome := r.applyStage().runAhead(actx, a, fl, scanOut); outcome != "handed" {
			r.d.metrics.Ahead.WithLabelValues(r.in.Partner, outcome).Inc()
		}
	}()
	return a
}

// takeAheadSlot takes one of the daemon's slots for a file applied ahead
// (false: as many files as it allows are applied ahead already).
func (r *fetchStage) takeAheadSlot() bool {
	select {
	case r.d.ahead <- struct{}{}:
		return true
	default:
		return false
	}
}

// Close is the preScan's stop for a scan the apply ahead makes: the scan
// is taken or no longer wanted, which does not stop the apply ahead.
func (a *ahead) Close() error { return nil }

// dropAhead stops an apply ahead that apply will not take (the file was
// held, a duplicate, downloaded again, or the run ends): it rolls back.
func (r *fileRun) dropAhead() {
	if a := r.ahead; a != nil {
		r.ahead = nil
		a.cancel()
		<-a.done
	}
}

// runAhead applies chunks until apply takes them over (it returns
// "handed") or it stops: "rolled_back" when the run dropped it,
// "abandoned" when something went wrong ahead. Either way the scan goes
// on to the end of the file for the plan, unless the run dropped it.
func (r *applyStage) runAhead(ctx context.Context, a *ahead, fl io.ReadCloser, scanOut chan<- *scan) (outcome string) {
	rctx, rcancel := context.WithCancel(ctx)
	h := &aheadHand{full: make(chan *chunk, 1), free: make(chan *chunk, 2), readErr: make(chan error, 1)}
	h.stop = func() {
		rcancel()
		fl.Close() // a read waiting for bytes returns
	}
	var conn *pgxpool.Conn
	var tx pgx.Tx
	readerStarted := false
	w := &rowWrite{tx: aheadTx}
	abandon := func(why string, err error) string {
		if w.stream != nil {
			w.stream.close(false)
			w.stream = nil
		}
		if tx != nil {
			tx.Rollback(context.WithoutCancel(ctx))
		}
		if conn != nil {
			conn.Release()
		}
		switch {
		case ctx.Err() != nil: // dropped: nobody waits for the scan
			h.stop()
			if readerStarted {
				for range h.full {
				}
				<-h.readErr
			} else {
				scanOut <- &scan{err: ctx.Err()}
			}
			return "rolled_back"
		case readerStarted: // the reader goes on as the plan's scan alone
			for c := range h.full {
				h.free <- c
			}
			<-h.readErr
			fl.Close()
		default:
			// the plan's scan, which a drop of the run stops at once
			stop := context.AfterFunc(ctx, func() { fl.Close() })
			scanOut <- scanRows(fl, r.feed, r.p.cfg.Limits.MaxRows)
			stop()
			fl.Close()
		}
		rcancel()
		r.log.Info("applying ahead of the plan stopped; the file is applied from the spool after its plan", "why", why, "err", err)
		return "abandoned"
	}
	spare := func() bool { // never the pool's last connection
		st := r.d.db.Stat()
		return st.MaxConns()-st.AcquiredConns() >= 2
	}
	if !spare() {
		return abandon("pool_busy", nil)
	}
	// the table before the connection (a first load queries the pool,
	// within aheadLoadWait); the connection within a look at the pool,
	// looked at again after the load: applying ahead is an option, and a
	// full pool is no time to take it
	load, cancel := context.WithTimeout(ctx, aheadLoadWait)
	var err error
	h.tgt, err = r.d.targets.Get(load, r.feed)
	cancel()
	if err != nil {
		return abandon("target", err)
	}
	if !spare() {
		return abandon("pool_busy", nil)
	}
	acq, cancel := context.WithTimeout(ctx, aheadPoolCheck)
	conn, err = r.d.db.Acquire(acq)
	cancel()
	if err != nil {
		conn = nil
		return abandon("pool_busy", err)
	}
	if tx, err = conn.Begin(ctx); err != nil {
		tx = nil
		return abandon("begin", err)
	}
	// not the file's last chunk: see chunkStatements
	if _, err := tx.Exec(ctx, chunkStatementTimeout+"; SET LOCAL synchronous_commit = off"); err != nil {
		return abandon("begin", err)
	}
	if h.tgt.Snapshot() {
		// one feed's snapshots apply in claim order, one at a time, ahead
		// too: the feed's lock is held from here to the commit (every
		// chunk of another snapshot of the feed waits for it), and a newer
		// one begun already ends this apply ahead (the spool path then
		// finds the file superseded), as every chunk does (snapshot.go)
		newer, err := ledger.SupersededBy(ctx, tx, r.in.Partner, r.in.Feed, r.in.ID, true)
		if err != nil {
			return abandon("begin", err)
		}
		if newer != 0 {
			return abandon("superseded", nil)
		}
	}
	rd, err := rows.NewReader(fl, r.feed, r.p.cfg.Limits.MaxRows)
	if err != nil {
		sc := &scan{}
		if !errors.As(err, &sc.fail) {
			sc.err = err
		}
		tx.Rollback(context.WithoutCancel(ctx))
		conn.Release()
		fl.Close()
		scanOut <- sc // the file's own failure (its header), for the plan
		return "abandoned"
	}
	seed := maphash.MakeSeed()
	for range 2 {
		h.free <- newChunk(seed, r.feed.ChunkRows, h.tgt)
	}
	readerStarted = true
	go func() {
		// what follows the spool's file waits for its reader (an
		// unkept plaintext's decryption does): a reader that stops
		// before the end (a file error) lets it go on
		defer fl.Close()
		sc := &scan{}
		err := r.readChunks(rctx, rd, 0, h.full, h.free, sc)
		if err != nil && sc.fail == nil && sc.err == nil {
			sc.err = err
		}
		scanOut <- sc
		h.readErr <- err
	}()
	r.direct = h.tgt.Direct()
	tick := time.NewTicker(aheadPoolCheck)
	defer tick.Stop()
	full := (<-chan *chunk)(h.full)
	busy := 0
	for {
		select {
		case <-a.goOn:
			if err := w.endStream(); err != nil {
				return abandon("chunk", err)
			}
			h.conn, h.tx, h.direct = conn, tx, r.direct
			a.hand <- h
			return "handed"
		case <-ctx.Done():
			return abandon("", nil)
		case <-tick.C:
			if st := r.d.db.Stat(); st.AcquiredConns()-a.planConns.Load() >= st.MaxConns() {
				if busy++; busy >= 2 {
					return abandon("pool_busy", nil)
				}
			} else {
				busy = 0
			}
		case c, ok := <-full:
			switch {
			case !ok: // the reader is done (and its error waits in readErr)
				full = nil
				continue
			case c.final: // the last chunk moves the file to applied: never ahead
				h.pending, full = c, nil
				continue
			}
			// what chunkStatements does but for the gate and the ledger,
			// which wait for the plan, and the snapshot's sweep (its last
			// chunk never goes ahead)
			var cc chunkCounts
			staged, err := r.writeRows(ctx, tx, h.tgt, c, w, r.in.ID, &cc)
			if err == nil {
				err = r.rowsWritten(ctx, tx, h.tgt, c, &cc, staged)
			}
			if err != nil {
				c.DropPayload() // a failed COPY's goroutine may still read it
				h.free <- c
				return abandon("chunk", err)
			}
			h.chunks = append(h.chunks, ledger.Chunk{No: c.no, First: c.first, Last: c.last,
				Applied: cc.applied, Unchanged: cc.unchanged, Rejected: cc.rejected, Conflict: cc.conflict})
			h.sum.add(cc)
			r.d.signals.AheadChunk.Signal(c.no)
			h.free <- c
		}
	}
}

// applyAhead takes over the apply running ahead now that the plan said
// go: the chunks applied ahead commit with their ledger rows behind the
// first chunk's gate, and the rest of the file follows from the same
// reader. done is false when there is nothing to take over (the apply
// ahead stopped, or its commit failed and rolled back): apply then reads
// the file from the spool.
func (r *applyStage) applyAhead(ctx context.Context, tgt *target.Table) (done bool, err error) {
	a := r.ahead
	if a.sha == "" || a.sha != r.in.DataSHA256 || r.in.ChunksDone != 0 {
		r.dropAhead() // not these bytes, or not from the file's start
		return false, nil
	}
	r.ahead = nil
	close(a.goOn)
	h, ok := <-a.hand
	<-a.done
	if !ok {
		return false, nil
	}
	defer h.stop()
	release := func() {
		if h.conn != nil {
			h.tx.Rollback(context.WithoutCancel(ctx))
			h.conn.Release()
			h.conn = nil
		}
	}
	defer release()
	abandon := func(why string, err error) (bool, error) {
		release()
		h.stop()
		for range h.full {
		}
		<-h.readErr
		r.log.Info("chunks applied ahead of the plan not taken; the file is applied from the spool", "why", why, "err", err)
		r.d.metrics.Ahead.WithLabelValues(r.in.Partner, "abandoned").Inc()
		return false, nil
	}
	if h.tgt != tgt {
		return abandon("target_changed", nil)
	}
	in := r.in
	r.direct = h.direct
	if err := fault.Check("apply:ahead_commit"); err != nil {
		return true, err
	}
	if len(h.chunks) > 0 {
		var err error
		if tgt.Snapshot() {
			// held since the apply ahead began: asked again all the same
			var newer int64
			if newer, err = ledger.SupersededBy(ctx, h.tx, in.Partner, in.Feed, in.ID, true); err == nil && newer != 0 {
				return abandon("superseded", nil)
			}
		}
		if err == nil {
			err = r.d.ledger.ChunksDone(ctx, h.tx, in, h.chunks)
		}
		if err == nil {
			err = commitRows(ctx, h.tx, in.ID, len(h.chunks)-1, "ahead")
		}
		var cu *CommitUnknownError
		if errors.As(err, &cu) {
			release() // the gate's row lock: markUnknown writes that row
			return true, r.markUnknown(ctx, cu)
		}
		if err != nil {
			var fe *ledger.FencedError
			if errors.As(err, &fe) || errors.Is(err, fault.ErrInjected) || ctx.Err() != nil {
				return true, err
			}
			return abandon("commit", err)
		}
		h.conn.Release()
		h.conn = nil
		r.account(len(h.chunks), h.sum)
		r.log.Debug("chunks applied ahead of the plan committed", "chunks", len(h.chunks))
	}
	r.d.metrics.Ahead.WithLabelValues(in.Partner, "committed").Inc()
	release()
	return true, r.applyChunks(ctx, tgt, h.pending, h.full, h.free, h.readErr, h.stop)
}

// add sums chunk counts.
func (c *chunkCounts) add(o chunkCounts) {
	c.applied += o.applied
	c.unchanged += o.unchanged
	c.rejected += o.rejected
	c.conflict += o.conflict
	c.outsideEdit += o.outsideEdit
	c.exists += o.exists
	c.notFound += o.notFound
}

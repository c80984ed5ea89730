package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The set-based statements of a group of small files (group.go). Each is
// the per-file statement of the same step over arrays: conditional per
// row on (intake_id, fencing_token, state), so a file fenced out or in
// another state simply drops out of the result; the caller sees which.

// Record records claims made by remote renames in the section, each
// under the id allocated for it with the lock, and ends the section with
// the claims' commit: claims need no connection of the pool the files'
// work runs on (Ledger.WithClaimPool), and another replica's section
// sees them recorded. It returns the rows inserted; a file whose
// processing path a live row already owns is left out. On an error the
// section is rolled back (the files sit in processing/ without rows and
// the next poll adopts them, as after a lost reply).
func (c *ClaimLock) Record(ctx context.Context, l *Ledger, ins []*Intake) ([]*Intake, error) {
	defer c.Release()
	out, err := l.insertClaims(ctx, c.tx, ins)
	if err != nil {
		return nil, err
	}
	if err := c.tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("insert claims: commit: %w", err)
	}
	c.tx = nil
	return out, nil
}

// insertClaimsSQL records claims, each under the id allocated for it
// (insertClaims), their leases from now: the section's renames, which a
// site may make as copies, came before. The ids the claim kept for the
// recorded files (intake_claim_id) go with their rows.
const insertClaimsSQL = `
	WITH ins AS (
	    INSERT INTO file_intake (intake_id, partner_id, feed, remote_name, claimed_path, listed_size, manifest_name,
	                             listed_mtime, state, worker_id, lease_until)
	    OVERRIDING SYSTEM VALUE
	    SELECT x.id, $1, x.feed, x.name, x.path, x.size, nullif(x.manifest, ''), x.mtime, 'claimed', $2, pg_catalog.clock_timestamp() + $3::interval
	    FROM unnest($4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[], $10::timestamptz[])
	        AS x(id, feed, name, path, size, manifest, mtime)` + recordedClaims

func (l *claimStore) insertClaims(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, ins []*Intake) ([]*Intake, error) {
	var ids, sizes []int64
	var feeds, names, paths, manifests []string
	var mtimes []*time.Time
	for _, in := range ins {
		ids, sizes = append(ids, in.ID), append(sizes, in.ListedSize)
		feeds, names, paths = append(feeds, in.Feed), append(names, in.RemoteName), append(paths, in.ClaimedPath)
		manifests, mtimes = append(manifests, in.ManifestName), append(mtimes, nullTime(in.ListedMTime))
	}
	rs, err := q.Query(ctx, insertClaimsSQL, ins[0].Partner, ins[0].Worker, l.lease, ids, feeds, names, paths, sizes, manifests, mtimes)
	if err != nil {
		return nil, fmt.Errorf("insert claims: %w", err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (*Intake, error) { return scanIntake(r) })
	if err != nil {
		return nil, fmt.Errorf("insert claims: %w", err)
	}
	slices.SortFunc(out, func(a, b *Intake) int { return int(a.ID - b.ID) })
	return out, nil
}

// groupSteps moves a group of small files through their steps in
// file_intake, each step one set-based statement for the whole group.
type groupSteps struct{ *core }

// GroupFile is what a group's transaction did for one file: its one
// chunk's lines and row outcomes.
type GroupFile struct {
	In                           *Intake
	First, Last                  int64
	Applied, Unchanged, Conflict int64
}

// AppliedGroup records, inside the group's transaction, each file's plan,
// its one chunk in the ledger and its totals: spooled -> applied (a group
// file is one chunk with no rejected row, so the plan, the chunk and the
// end of apply are one step), with the hash of the feed configuration
// that planned and applied them (a group is of one feed). It returns how
// many files moved.
func (l *groupSteps) AppliedGroup(ctx context.Context, tx pgx.Tx, gs []GroupFile, feedSHA string) (int, error) {
	var ids, tokens, firsts, lasts, totals, applied, unchanged, conflict []int64
	for _, g := range gs {
		ids, tokens = append(ids, g.In.ID), append(tokens, g.In.Token)
		firsts, lasts = append(firsts, g.First), append(lasts, g.Last)
		totals = append(totals, g.Applied+g.Unchanged+g.Conflict)
		applied, unchanged, conflict = append(applied, g.Applied), append(unchanged, g.Unchanged), append(conflict, g.Conflict)
	}
	var n int
	err := tx.QueryRow(ctx, `WITH x AS (
		    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[])
		        AS x(id, token, first, last, total, applied, unchanged, conflict)),
		u AS (
		    UPDATE file_intake f
		    SET state = 'applied', rows_total = x.total, rows_rejected = 0, rows_applied = x.applied,
		        rows_unchanged = x.unchanged, rows_conflict = x.conflict, chunks_done = 1, feed_sha256 = $11,
		        lease_until = pg_catalog.now() + $10::interval, updated_at = pg_catalog.now()
		    FROM x WHERE f.intake_id = x.id AND f.fencing_token = x.token AND f.state = 'spooled'
		    RETURNING f.intake_id),
		l AS (
		    INSERT INTO intake_chunk (intake_id, chunk_no, partner_id, first_line, last_line,
		                              rows_applied, rows_unchanged, rows_conflict, fencing_token)
		    SELECT x.id, 0, $1, x.first, x.last, x.applied, x.unchanged, x.conflict, x.token FROM x JOIN u ON u.intake_id = x.id)
		SELECT pg_catalog.count(*) FROM u`,
		gs[0].In.Partner, ids, tokens, firsts, lasts, totals, applied, unchanged, conflict, l.lease, feedSHA).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("applied (group): %w", err)
	}
	return n, nil
}

// ClaimLock serializes one partner's claim renames across replicas: a
// PostgreSQL transaction advisory lock on the partner, held from the
// allocation of a claim's intake ids through its renames (and a racing
// claim's put-back) to the claims' rows, recorded in the section
// (Record). Intake ids decide which of two files writing one key wins,
// and a partner's files are claimed oldest first: with ids allocated
// before the renames and the renames made under the lock, whoever renames
// a file first holds the smaller id, even when two replicas claim from one
// partner (around a change of replicas, or with affinity "none") and
// renames go out all at once (TestRacingGroupsKeepIdsInFileAge: renames
// racing without the lock won files of one run in turns, under ids that
// could not all follow file age; a claim that put its files back left
// them out of ready/ for a moment, in which another replica passed them
// as lost). Under the lock every rename another replica makes is before
// or after the whole section.
// The section holds one connection and takes no other of its pool (the
// ids it keeps before its renames go through core.short), so partners in
// their sections cannot exhaust the pool between them; a daemon gives
// the sections a pool of their own (Ledger.WithClaimPool), so partners
// waiting on their sites' replies never hold the connections the files'
// work needs. A transaction, not
// a session lock: a replica stalled in its section (a GC pause, SIGSTOP, a
// partition) is ended by idle_in_transaction_session_timeout (PoolConfig)
// one lease later, which frees the partner's claims for the others, and
// what it recorded there is never committed.
type ClaimLock struct {
	tx pgx.Tx
	// granted: the rows the section took over or resumed, by id and new
	// token, whose leases restart at its commit (InClaimSection)
	granted, grantedTokens []int64
}

// LockClaims enters the partner's claim section (see ClaimLock) and
// allocates, in the same statement, the intake ids of the n claims about
// to be made there, in ascending order (n may be 0).
func (l *claimStore) LockClaims(ctx context.Context, partner string, n int) (*ClaimLock, []int64, error) {
	pool := l.pool
	if l.claims != nil {
		pool = l.claims
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("claim lock: %w", err)
	}
	c := &ClaimLock{tx: tx}
	var ids []int64
	if n == 0 {
		_, err = tx.Exec(ctx, lockClaimsSQL, partner)
	} else {
		var rs pgx.Rows
		if rs, err = tx.Query(ctx, lockClaimsIDsSQL, partner, n); err == nil {
			ids, err = pgx.CollectRows(rs, pgx.RowTo[int64])
		}
	}
	if err != nil {
		c.Release()
		return nil, nil, fmt.Errorf("claim lock: %w", err)
	}
	slices.Sort(ids)
	return c, ids, nil
}

// lockClaimsSQL takes the partner's claim lock; lockClaimsIDsSQL takes it,
// then allocates $2 intake ids (a row is made only once the lock's
// one-row subquery has been read: every id comes after the lock).
const (
	lockClaimsSQL    = `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('partner-intake/claim/'::text || $1::text, 0::int8))`
	lockClaimsIDsSQL = `SELECT pg_catalog.nextval(pg_catalog.pg_get_serial_sequence('file_intake', 'intake_id'))
		FROM (` + lockClaimsSQL + `) AS locked, pg_catalog.generate_series(1::int4, $2::int4)`
)

// InClaimSection runs fn inside the partner's claim section and commits
// what fn recorded there (Adopt) when fn returns nil. Every move of a
// claimed file between processing/ directories, and every row recorded for
// a file found there without one, is made in the section, after a look
// made in it: what that look saw of the site and of the rows stays true
// until the section ends. A takeover's statement and its move are one step
// to an adopter, and an adopter's look and its row one step to a takeover,
// so a replica that paused between its listing and its act (a GC pause,
// SIGSTOP) acts only on what it sees again after it wakes. A holder
// stalled inside the section is ended by idle_in_transaction_session_timeout
// and what it recorded is never committed.
func (l *claimStore) InClaimSection(ctx context.Context, partner string, fn func(*ClaimLock) error) error {
	c, _, err := l.LockClaims(ctx, partner, 0)
	if err != nil {
		return err
	}
	defer c.Release()
	if err := fn(c); err != nil {
		return err
	}
	if err := c.leasesFromNow(ctx, l.lease); err != nil {
		return err
	}
	if err := c.tx.Commit(ctx); err != nil {
		return fmt.Errorf("claim section: commit: %w", err)
	}
	c.tx = nil
	return nil
}

// grant notes a row the section took over or resumed (leasesFromNow).
func (c *ClaimLock) grant(in *Intake) {
	c.granted, c.grantedTokens = append(c.granted, in.ID), append(c.grantedTokens, in.Token)
}

// leasesFromNow restarts, right before the section commits, the leases of
// the rows it took over or resumed: granted by its first statements, they
// ran from its transaction's start, before its wait for the partner's
// section and before a move that may outlast a lease (a RENAME the site
// makes as a copy), so a row could commit with its lease run out already
// and be taken over again at once, its file moved again.
func (c *ClaimLock) leasesFromNow(ctx context.Context, lease time.Duration) error {
	if len(c.granted) == 0 {
		return nil
	}
	_, err := c.tx.Exec(ctx, `UPDATE file_intake f SET lease_until = pg_catalog.clock_timestamp() + $3::interval
		FROM ROWS FROM (pg_catalog.unnest($1::int8[]), pg_catalog.unnest($2::int8[])) AS g(id, token)
		WHERE f.intake_id = g.id AND f.fencing_token = g.token`, c.granted, c.grantedTokens, lease)
	if err != nil {
		return fmt.Errorf("claim section: leases: %w", err)
	}
	return nil
}

// Adopt records, in the section, a claim found in processing/ without a
// row, under the id its claim kept for the path, else a fresh one
// (insertClaimSQL); ErrTracked when a live row owns the path. The row
// exists only once the section commits (InClaimSection).
func (c *ClaimLock) Adopt(ctx context.Context, l *Ledger, in *Intake) error {
	return l.insertClaim(ctx, c.tx, in)
}

// TakeOver takes an expired claim over in the section, on its
// transaction (reconcilerView.takeOverIn): the new token and path commit
// with the section, after the file's move the caller makes in it.
func (c *ClaimLock) TakeOver(ctx context.Context, l *Ledger, in *Intake, worker, newPath string) (*Intake, error) {
	out, err := l.takeOverIn(ctx, c.tx, in, worker, newPath)
	if err == nil {
		c.grant(out)
	}
	return out, err
}

// StillHeld asks the database whether the section still stands, right
// before a move on the site made in it: a holder paused past a lease has
// lost it (its session ended, what it recorded rolled back), and must not
// move a file on what it saw before.
func (c *ClaimLock) StillHeld(ctx context.Context) error {
	if _, err := c.tx.Exec(ctx, `SELECT 1`); err != nil {
		return fmt.Errorf("claim section: %w", err)
	}
	return nil
}

// Busy runs move, a move on the site made in the section, while keeping
// the section's transaction from idling out: a RENAME a site makes as a
// copy takes as long as the copy, past a lease for a large file, and the
// server ends a transaction idle that long (idle_in_transaction_session_
// timeout), which would leave the file moved and the section's statements
// rolled back. A holder paused meanwhile still loses the section: the
// keep-alive pauses with it. move must not use the section's transaction.
func (c *ClaimLock) Busy(ctx context.Context, l *Ledger, move func() error) error {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(l.lease/3, time.Second))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.tx.Exec(ctx, `SELECT 1`); err != nil {
					return // the commit meets it
				}
			}
		}
	}()
	err := move()
	close(stop)
	<-done
	return err
}

// RestorePath points a row the section just took over back at path,
// where its file still is (its move failed, the file untouched), on the
// section's transaction.
func (c *ClaimLock) RestorePath(ctx context.Context, in *Intake, path string) error {
	return restorePath(ctx, c.tx, in, path)
}

// Resume is Ledger.Resume in the section, on its transaction: the row's
// new token commits with the section, and so after any takeover of the
// file whose move another section of the partner holds (the reconciler's).
// A row lock it would wait for past a second (a stalled session's) leaves
// the row for a later poll (a FencedError), rather than holding the
// partner's section meanwhile.
func (c *ClaimLock) Resume(ctx context.Context, l *Ledger, id int64, worker string) (*Intake, error) {
	if _, err := c.tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
		return nil, fmt.Errorf("resume intake %d: %w", id, err)
	}
	if _, err := c.tx.Exec(ctx, `SAVEPOINT resume`); err != nil {
		return nil, fmt.Errorf("resume intake %d: %w", id, err)
	}
	in, err := resume(ctx, c.tx, id, worker, l.lease)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" {
		if _, rerr := c.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT resume`); rerr != nil {
			return nil, fmt.Errorf("resume intake %d: %w", id, rerr)
		}
		return nil, &FencedError{IntakeID: id, Step: "resume (its row is locked)"}
	}
	if err == nil {
		c.grant(in)
	}
	return in, err
}

// Release ends the section's transaction, which unlocks (pgx closes a
// connection whose rollback failed rather than pool it). Safe more than
// once.
func (c *ClaimLock) Release() {
	if c.tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.tx.Rollback(ctx)
	c.tx = nil
}

// pollStatements are what a poll and its files send first: the worker's
// due rows, the claim lock with the claims' ids, the claims' rows, the
// batch's file, the file spooled, its end, the poll's record
// (PreparePoll).
var pollStatements = []string{dueOwnedBySQL, lockClaimsIDsSQL, insertClaimsSQL, batchBoundFileSQL, setSpooledSQL, finishArchivedSQL, recordPollsSQL}

// PreparePoll prepares a poll's statements on one connection of the pool
// (pgx then sends each one's values alone when it runs there: one round
// trip, and the statement's parse, less apiece). A one-shot run does this
// beside its SSH login, while its database connection would wait
// (docs/performance.md); a daemon's pool caches statements as
// they run.
func (l *claimStore) PreparePoll(ctx context.Context) error {
	c, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	for _, sql := range pollStatements {
		if _, err := c.Conn().Prepare(ctx, sql, sql); err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
	}
	return nil
}

// GroupUnknown counts a group's COMMIT without an answer as an attempt of
// each of its files still under the group's fencing tokens (attemptSet;
// lastErr, base and max as RecordAttempt's), as MarkUnknown does for a
// file's own chunk: the group's transaction moved its files from spooled
// to applied with their rows, so each row says whether the commit
// landed, and nothing is left to guess. A file still spooled (nothing of
// it landed) whose attempt reaches budget, or comes within or more after
// its first failure, is marked with reason retries_exhausted: the run
// that takes it up fails it for good. A file the commit moved on (all of
// it landed) is counted and goes on from its state. It returns the ids of
// the files whose budget is spent; a file fenced out or moved on drops
// out.
func (l *groupSteps) GroupUnknown(ctx context.Context, ins []*Intake, lastErr string, base, max time.Duration, budget int, within time.Duration) (spent []int64, err error) {
	ids, tokens := make([]int64, len(ins)), make([]int64, len(ins))
	for i, in := range ins {
		ids[i], tokens[i] = in.ID, in.Token
	}
	// this write must land even when the run's context is what ended it
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rs, err := l.pool.Query(wctx, `UPDATE file_intake f SET
		    reason = CASE WHEN f.state = 'spooled' AND (f.attempts + 1 >= $6
		        OR pg_catalog.now() - coalesce(f.first_failed_at, pg_catalog.now()) >= $7::interval)
		        THEN 'retries_exhausted' ELSE f.reason END, `+attemptSet+`
		FROM unnest($1::bigint[], $2::bigint[]) AS g(id, token)
		WHERE f.intake_id = g.id AND f.fencing_token = g.token AND f.state IN ('claimed', 'spooled', 'applied')
		RETURNING f.intake_id, f.attempts, coalesce(f.reason, '')`,
		ids, tokens, base, max, Text(lastErr, 1000), budget, within)
	if err != nil {
		return nil, fmt.Errorf("count a group's commit without answer: %w", err)
	}
	type counted struct {
		id       int64
		attempts int
		reason   string
	}
	got, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (counted, error) {
		var c counted
		return c, r.Scan(&c.id, &c.attempts, &c.reason)
	})
	if err != nil {
		return nil, fmt.Errorf("count a group's commit without answer: %w", err)
	}
	byID := map[int64]*Intake{}
	for _, in := range ins {
		byID[in.ID] = in
	}
	for _, c := range got {
		in := byID[c.id]
		in.Attempts, in.Reason = c.attempts, reason.Code(c.reason)
		if in.Reason == reason.RetriesExhausted {
			spent = append(spent, c.id)
		}
	}
	return spent, nil
}

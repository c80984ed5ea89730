package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The ids of claims kept across a crash (intake_claim_id, migration 027).
// A claim allocates its files' intake ids under the partner's claim lock,
// renames the files, and records their rows in the section's transaction:
// a claimer that dies between a RENAME and that commit leaves the file in
// processing/ without a row. Ids decide which of two files writing one key
// wins, so whoever adopts such a file (the claimer restarted, a replica's
// sweep of a gone worker's dir, the reconciler) must record it under the
// id its claim allocated, not a fresh one above the files claimed since.
// The id is therefore committed, keyed by the path the file is renamed
// to, before the RENAME (KeepClaimIDs), and an adoption records the file
// under the id kept for its path (insertClaimSQL). A move of such a file
// into another worker's dir takes its id along first (CarryClaimID).
//
// A path keeps one id. One held already when a claim keeps its own
// belongs to a file at that path (one still waiting for its adoption; the
// claim's RENAME then fails: the path is busy) or was left by a claim that
// never renamed its file there (a crash between the two): the claim looks
// at the path under its lock and replaces a stale one with its own
// (SetClaimID) before its RENAME, or right after a RENAME that went
// through to a path it found taken (a live row's file, which leaves
// processing/ without the lock, left it meanwhile).

// keepClaimIDsSQL keeps $3[i] for $2[i], a path holding none yet; it returns
// the paths kept.
const keepClaimIDsSQL = `INSERT INTO intake_claim_id (partner_id, claimed_path, intake_id)
	SELECT $1, x.path, x.id FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::int8[])) AS x(path, id)
	ON CONFLICT (partner_id, claimed_path) DO NOTHING
	RETURNING claimed_path`

// KeepClaimIDs commits ids[i] as the id of the claim about to rename a
// file to paths[i], before the RENAME, and returns the paths that held
// an id already (theirs is kept: the claim looks at the path,
// SetClaimID). It runs outside the claim section's transaction, which
// commits only with the rows (short).
func (l *claimStore) KeepClaimIDs(ctx context.Context, partner string, paths []string, ids []int64) (held map[string]bool, err error) {
	err = l.short(ctx, func(q *pgxpool.Pool) error {
		rs, err := q.Query(ctx, keepClaimIDsSQL, partner, paths, ids)
		if err != nil {
			return err
		}
		kept := map[string]bool{}
		for rs.Next() {
			var p string
			if err := rs.Scan(&p); err != nil {
				rs.Close()
				return err
			}
			kept[p] = true
		}
		if err := rs.Err(); err != nil {
			return err
		}
		held = map[string]bool{}
		for _, p := range paths {
			if !kept[p] {
				held[p] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("keep claim ids: %w", err)
	}
	return held, nil
}

// SetClaimID makes id the one kept for path: no file was there when the
// claim looked (or the one there left before its RENAME), so the id the
// path held was a stale one.
func (l *claimStore) SetClaimID(ctx context.Context, partner, path string, id int64) error {
	err := l.short(ctx, func(q *pgxpool.Pool) error {
		_, err := q.Exec(ctx, `INSERT INTO intake_claim_id (partner_id, claimed_path, intake_id) VALUES ($1, $2, $3)
			ON CONFLICT (partner_id, claimed_path) DO UPDATE SET intake_id = EXCLUDED.intake_id, reserved_at = pg_catalog.now()`,
			partner, path, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("set claim id: %w", err)
	}
	return nil
}

// DropClaimIDs forgets the ids kept for paths no file of the claim
// reached (its RENAME lost to another replica, refused, put back, or the
// path busy with another's file): each only while it is still the
// claim's own (ids[i]).
func (l *claimStore) DropClaimIDs(ctx context.Context, partner string, paths []string, ids []int64) error {
	err := l.short(ctx, func(q *pgxpool.Pool) error {
		_, err := q.Exec(ctx, `DELETE FROM intake_claim_id k
			USING ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::int8[])) AS x(path, id)
			WHERE k.partner_id = $1 AND k.claimed_path = x.path AND k.intake_id = x.id`, partner, paths, ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("drop claim ids: %w", err)
	}
	return nil
}

// CarryClaimID is made before a move of a file without a row from one
// processing dir into another (an adoption of a gone worker's claim): the
// id kept for from is kept for to as well, committed before the move. It
// reports false when from keeps none or to holds one already: the move,
// once it went through, is followed by CarriedClaimID.
func (l *claimStore) CarryClaimID(ctx context.Context, partner, from, to string) (bool, error) {
	var n int64
	err := l.short(ctx, func(q *pgxpool.Pool) error {
		tag, err := q.Exec(ctx, `INSERT INTO intake_claim_id (partner_id, claimed_path, intake_id)
			SELECT partner_id, $3, intake_id FROM intake_claim_id WHERE partner_id = $1 AND claimed_path = $2
			ON CONFLICT (partner_id, claimed_path) DO NOTHING`, partner, from, to)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("carry claim id: %w", err)
	}
	return n == 1, nil
}

// CarriedClaimID makes to keep what from keeps (nothing when from keeps
// nothing) once a move from one to the other went through.
func (l *claimStore) CarriedClaimID(ctx context.Context, partner, from, to string) error {
	err := l.short(ctx, func(q *pgxpool.Pool) error {
		_, err := q.Exec(ctx, `WITH src AS (
			    SELECT intake_id FROM intake_claim_id WHERE partner_id = $1 AND claimed_path = $2),
			gone AS (
			    DELETE FROM intake_claim_id WHERE partner_id = $1 AND claimed_path = $3 AND NOT EXISTS (SELECT 1 FROM src))
			INSERT INTO intake_claim_id (partner_id, claimed_path, intake_id) SELECT $1, $3, intake_id FROM src
			ON CONFLICT (partner_id, claimed_path) DO UPDATE SET intake_id = EXCLUDED.intake_id, reserved_at = pg_catalog.now()`,
			partner, from, to)
		return err
	})
	if err != nil {
		return fmt.Errorf("carry claim id: %w", err)
	}
	return nil
}

// PurgeClaimIDs deletes the partner's kept claim ids older than cutoff:
// left by claims that never renamed their file (a crash between the two),
// or by a move's source path. A file without a row still waiting that
// long for its adoption (one the reconciler reported as an orphan claim
// all along) gets a fresh id.
func (l *purges) PurgeClaimIDs(ctx context.Context, partner string, cutoff time.Time) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM intake_claim_id WHERE partner_id = $1 AND reserved_at < $2`, partner, cutoff)
	if err != nil {
		return 0, fmt.Errorf("purge claim ids: %w", err)
	}
	return tag.RowsAffected(), nil
}

// short runs fn, one short statement made outside any transaction a
// caller holds, so that it waits on no connection of its own: on an idle
// connection of the work pool when there is one, else on the heartbeats'
// pool (which opens its first connection lazily; a ledger without one,
// the reconciler's, waits for a connection of the work pool). An idle
// connection may have ended unseen (its backend terminated; a one-shot
// run's worker-id lock is held on one): on its error fn is made once more
// on the heartbeats' pool, so fn must be safe to make twice.
func (l *core) short(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	if l.pool.Stat().IdleConns() > 0 {
		err := fn(l.pool)
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return fn(l.beat())
}

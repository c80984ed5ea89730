package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/rendezvous"
	"github.com/partner-intake/partner-intake/internal/schedule"
)

// StatusRow is one partner's line of `intake status`.
type StatusRow struct {
	Partner          string
	ByState          map[string]int64
	OldestProcessing time.Duration
	QuarantineOpen   int64
	QuarantineOldest time.Duration
	InflightTotal    int64
	InflightDone     int64
	LastOK           *time.Time
	LastError        *time.Time
	LastErrorText    string
	ReadyFiles       int64
	OldestReady      *time.Time
	Findings         []StatusFinding
	// OrphanClaims: files the last reconciler run found in a processing/
	// dir with no live row and left there (claims with no outcome yet).
	OrphanClaims int
	FindingsAt   *time.Time // when the reconciler last completed a run; nil: never
	Inflight     []InflightFile
	// Replicas are the live replicas serving the partner; Poller is the one
	// that polls it under affinity "partner" (affinity.go).
	Replicas []string
	Poller   string
	// Late are the partner's delivery windows that closed without an
	// accepted file: open ones, and ones a late file closed within
	// LateShownFor (intake/expect), newest first.
	Late []ledger.LateWindow
	// LateMore: the partner's late windows past the LateShownAtMost shown
	LateMore int
	// Awaiting are the partner's files whose plan waits for an ops
	// decision (intake approve / reject), oldest plan first.
	Awaiting []ledger.Waiting
	// Site is the partner's server as last measured (the daemon at its
	// first dial, a day later again); nil: never measured.
	Site *ledger.SiteProfile
}

// PollGrace is how long past the poll its schedule had due after the
// last successful one a partner may go before status calls its polls
// stale.
const PollGrace = 15 * time.Minute

// PollStale reports whether a partner polled on spec, last successfully at
// lastOK (nil: never), is behind: the poll its schedule had due after
// lastOK is more than PollGrace overdue at now. A partner polled at the
// top of every hour is not stale at 40 past, one `@every 30s` is after
// a quarter of an hour without a successful poll.
func PollStale(spec string, lastOK *time.Time, now time.Time) bool {
	if lastOK == nil {
		return true
	}
	due, ok := schedule.Next(spec, *lastOK)
	if !ok {
		due = *lastOK
	}
	return now.Sub(due) > PollGrace
}

// LateShownFor is how long `intake status` still shows a late window a
// file has closed; LateShownAtMost how many of a partner's it shows.
const (
	LateShownFor    = 24 * time.Hour
	LateShownAtMost = 50
)

// InflightFile is a file being applied, and how far it got.
type InflightFile struct {
	IntakeID           int64
	Worker             string
	RowsDone, Rows     int64
	BytesDone, Bytes   int64
	Chunks, ChunksDone int64
}

// StatusFinding is a finding of the last reconciler run.
type StatusFinding struct {
	Kind, Path, Action, Detail string
	IntakeID                   int64
	NeedsHuman                 bool
}

// Status reads what `intake status` shows, for the given partners, all
// of it at one moment (ledger.Snapshot): its figures agree with each
// other while files move.
func Status(ctx context.Context, db *pgxpool.Pool, partners []string) ([]StatusRow, error) {
	var out []StatusRow
	err := ledger.Snapshot(ctx, db, func(l *ledger.Ledger, snap ledger.Reader) (err error) {
		out, err = status(ctx, l, snap, partners)
		return err
	})
	return out, err
}

// status reads Status's figures through l's status reads and snap.
func status(ctx context.Context, l *ledger.Ledger, snap ledger.Reader, partners []string) ([]StatusRow, error) {
	out := make([]StatusRow, len(partners))
	idx := map[string]*StatusRow{}
	for i, p := range partners {
		out[i] = StatusRow{Partner: p, ByState: map[string]int64{}}
		idx[p] = &out[i]
	}
	counts, err := l.StateCounts(ctx, partners)
	if err != nil {
		return nil, err
	}
	for _, c := range counts {
		r := idx[c.Partner]
		r.ByState[string(c.State)] = c.Files
		switch c.State {
		case ledger.StateClaimed, ledger.StateSpooled, ledger.StateApplying, ledger.StateApplied, ledger.StateOutcomeUnknown:
			r.OldestProcessing = max(r.OldestProcessing, c.Age)
		}
		r.InflightTotal += c.Rows
		r.InflightDone += c.RowsDone
	}
	holds, err := l.OpenHolds(ctx, partners)
	if err != nil {
		return nil, err
	}
	for _, h := range holds {
		idx[h.Partner].QuarantineOpen, idx[h.Partner].QuarantineOldest = h.Files, h.Oldest
	}
	polls, err := l.Polls(ctx, partners)
	if err != nil {
		return nil, err
	}
	for _, p := range polls {
		t := idx[p.Partner]
		t.LastOK, t.LastError, t.OldestReady = p.LastOK, p.LastError, p.OldestReady
		t.LastErrorText, t.ReadyFiles = p.LastErrorText, p.ReadyFiles
	}
	applying, err := l.ApplyingFiles(ctx, partners)
	if err != nil {
		return nil, err
	}
	for _, a := range applying {
		f := InflightFile{IntakeID: a.IntakeID, Worker: a.Worker, RowsDone: a.RowsDone, Rows: a.Rows, Bytes: a.Bytes, ChunksDone: a.ChunksDone}
		if f.Rows > 0 {
			f.BytesDone = f.Bytes * f.RowsDone / f.Rows
		}
		idx[a.Partner].Inflight = append(idx[a.Partner].Inflight, f)
	}
	runs, err := ledger.LastRuns(ctx, snap, partners)
	if err != nil {
		return nil, err
	}
	for p, at := range runs {
		idx[p].FindingsAt = &at
	}
	findings, err := ledger.StoredFindings(ctx, snap, partners)
	if err != nil {
		return nil, err
	}
	for _, sf := range findings {
		f := StatusFinding{Kind: sf.Kind, Path: sf.Path, Action: sf.Action, Detail: sf.Detail, IntakeID: sf.IntakeID, NeedsHuman: sf.NeedsHuman}
		idx[sf.Partner].Findings = append(idx[sf.Partner].Findings, f)
		if f.Kind == ledger.KindOrphanClaim && f.IntakeID == 0 { // not adopted
			idx[sf.Partner].OrphanClaims++
		}
	}
	late, totals, err := l.LateWindows(ctx, partners, LateShownFor, LateShownAtMost)
	if err != nil {
		return nil, err
	}
	for _, w := range late {
		idx[w.Partner].Late = append(idx[w.Partner].Late, w)
	}
	for p, n := range totals {
		idx[p].LateMore = n - len(idx[p].Late)
	}
	waiting, err := l.AwaitingApproval(ctx, partners)
	if err != nil {
		return nil, err
	}
	for _, w := range waiting {
		idx[w.Partner].Awaiting = append(idx[w.Partner].Awaiting, w)
	}
	profiles, err := l.SiteProfiles(ctx, partners)
	if err != nil {
		return nil, err
	}
	for p, prof := range profiles {
		if r := idx[p]; r != nil {
			r.Site = &prof
		}
	}
	serving, err := l.LiveServing(ctx)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Replicas = serving[out[i].Partner]
		if len(out[i].Replicas) > 0 {
			out[i].Poller = rendezvous.Owner(out[i].Partner, out[i].Replicas)
		}
	}
	return out, nil
}

package intake

import (
	"context"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/readylist"
	"github.com/partner-intake/partner-intake/intake/sessions"
	"github.com/partner-intake/partner-intake/intake/siteread"
	"github.com/partner-intake/partner-intake/intake/targethold"
	"github.com/partner-intake/partner-intake/internal/rendezvous"
	"github.com/partner-intake/partner-intake/internal/schedule"
)

// SetMaxHeldIssues lowers how many rejected rows a scan holds in memory, so
// tests reach the streaming path with a small file; it returns the undo.
func SetMaxHeldIssues(n int) func() {
	old := maxHeldIssues
	maxHeldIssues = n
	return func() { maxHeldIssues = old }
}

// SetUnchangedMinRows sets the chunk size from which a chunk on the merge
// path is looked up for rows the target holds as they are, so small test
// files take that path; it returns the undo.
func SetUnchangedMinRows(n int) func() {
	old := unchangedMinRows
	unchangedMinRows = n
	return func() { unchangedMinRows = old }
}

// UnchangedLooked is a look-up's outcome (Signals().Unchanged).
type UnchangedLooked = unchangedLooked

// SetRefusedFor sets how long an entry the site refused to move is
// passed over; it returns the restore.
func SetRefusedFor(d time.Duration) func() {
	old := readylist.Window
	readylist.Window = d
	return func() { readylist.Window = old }
}

// SetAheadBytes sets the listed size from which a file is applied ahead
// of its plan, so small test files take that path; it returns the undo.
func SetAheadBytes(n int64) func() {
	old := aheadBytes
	aheadBytes = n
	return func() { aheadBytes = old }
}

// SetScanCheckBytes lowers the size from which download asks whether the
// batch is held before scanning, so small test files take that path.
func SetScanCheckBytes(n int64) func() {
	old := scanCheckBytes
	scanCheckBytes = n
	return func() { scanCheckBytes = old }
}

// SetTwoChannels sets the size from which a download reads over two
// channels and the round trip from which a site is far (farRTT), so
// tests reach that path with a small file on a near site; it returns the
// undo.
func SetTwoChannels(n int64, rtt time.Duration) func() {
	old, oldRTT := twoChannelBytes, farRTT
	twoChannelBytes, farRTT = n, rtt
	return func() { twoChannelBytes, farRTT = old, oldRTT }
}

// TwoChannelReads is how many downloads read over two channels so far.
func TwoChannelReads() int64 { return siteread.SecondJoined.Load() }

// StagedReceipts counts the receipts published through a temporary file
// opened ahead (archive_ahead.go).
func StagedReceipts() int64 { return stagedReceipts.Load() }

// RejectsFromPlan counts the rejects reports whose lines were rendered
// from the plan rather than read from the ledger (report.go).
func RejectsFromPlan() int64 { return rejectsFromPlan.Load() }

// Owner is the replica that partner affinity picks for a partner.
func Owner(partner string, workers []string) string { return rendezvous.Owner(partner, workers) }

// BindBatch binds in's batch as decide does for a resumed file.
func BindBatch(ctx context.Context, d *Daemon, in *ledger.Intake) (ledger.Verdict, int64, error) {
	return d.ledger.BindBatch(ctx, in)
}

// Signals are the daemon's test signals (testsignals.go): Init one before
// its event, then wait on it.
func Signals(d *Daemon) *testSignals { return &d.signals }

// PollDone is what the Polled signal carries.
type PollDone = pollDone

// DialStats are the daemon's dials started, the most ever in flight at
// once to one server, and the sessions open now (sessions.go).
func DialStats(d *Daemon) (dialed, peak, open int64) {
	dialed, peak, _ = d.sessions.book.Stats()
	return dialed, peak, d.sessions.book.Open()
}

// SSHLogins is how many SSH connections the daemon's sessions dialled.
func SSHLogins(d *Daemon) int64 { return d.sessions.conns.Logins() }

// DialsInFlight are the dials in flight now.
func DialsInFlight(d *Daemon) int64 {
	_, _, n := d.sessions.book.Stats()
	return n
}

// PollOffset is a partner's first-poll offset and interval as Start
// computes them; ok is false for a cron-expression schedule.
func PollOffset(d *Daemon, partner string) (off, every time.Duration, ok bool) {
	p, found := d.parts.get(partner)
	if !found {
		return 0, 0, false
	}
	every, ok = schedule.Every(p.cfg.Poll)
	if !ok {
		return 0, 0, false
	}
	return sessions.Offset(partner, every, len(d.parts.ids()), d.cfg.PollStagger), every, true
}

// LastCodes is what a retries_exhausted receipt says of the last error.
func LastCodes(err error) string { return lastCodes(err) }

// SetTargetRetry sets how long a held feed waits before its target table
// is read again (targethold.go).
func SetTargetRetry(d time.Duration) func() {
	old := targethold.Retry
	targethold.Retry = d
	return func() { targethold.Retry = old }
}

// HeldFeedsDue makes every held feed's table due to be read again at the
// partner's next poll.
func HeldFeedsDue(d *Daemon) {
	for _, p := range d.parts.list() {
		p.holds.AllDue()
	}
}

// BeatLedger is the daemon's ledger, whose heartbeats and lease renewals
// run on the daemon's heartbeat pool (a fence's, Heartbeat, when the
// work pool has no idle connection).
func BeatLedger(d *Daemon) *ledger.Ledger { return d.ledger }

// ExpirePeers makes the daemon read the live replicas again at its next
// look (affinity.go), as a third of a lease later would.
func ExpirePeers(d *Daemon) {
	d.peers.Expire()
}

// HoldWorkerID takes the daemon's worker id on a connection of its own,
// as Start does (intake/workerid).
func HoldWorkerID(ctx context.Context, d *Daemon) error { return d.workerID.Hold(ctx) }

// SetSpoolMinFree changes the daemon's backpressure floor at run time.
func SetSpoolMinFree(d *Daemon, n int64) { d.cfg.SpoolMinFree = n }

// WorkerID is the daemon's worker id.
func WorkerID(d *Daemon) string { return d.cfg.WorkerID }

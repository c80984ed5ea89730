package intake

import (
	"context"
	"time"
)

// SetMaxHeldIssues lowers how many rejected rows a scan holds in memory, so
// tests reach the streaming path with a small file; it returns the undo.
func SetMaxHeldIssues(n int) func() {
	old := maxHeldIssues
	maxHeldIssues = n
	return func() { maxHeldIssues = old }
}

// SetScanCheckBytes lowers the size from which download asks whether the
// batch is held before scanning, so small test files take that path.
func SetScanCheckBytes(n int64) func() {
	old := scanCheckBytes
	scanCheckBytes = n
	return func() { scanCheckBytes = old }
}

// SetTwoChannels sets the size and the round trip from which a download
// reads over two channels, so tests reach that path with a small file on
// a near site; it returns the undo.
func SetTwoChannels(n int64, rtt time.Duration) func() {
	old, oldRTT := twoChannelBytes, twoChannelRTT
	twoChannelBytes, twoChannelRTT = n, rtt
	return func() { twoChannelBytes, twoChannelRTT = old, oldRTT }
}

// TwoChannelReads is how many downloads read over two channels so far.
func TwoChannelReads() int64 { return twoChannelReads.Load() }

// Owner is the replica that partner affinity picks for a partner.
func Owner(partner string, workers []string) string { return owner(partner, workers) }

// BindBatch binds in's batch as decide does for a resumed file.
func BindBatch(ctx context.Context, d *Daemon, in *Intake) (Verdict, int64, error) {
	return d.ledger.BindBatch(ctx, in)
}

// Signals are the daemon's test signals (testsignals.go): Init one before
// its event, then wait on it.
func Signals(d *Daemon) *testSignals { return &d.signals }

// PollDone is what the Polled signal carries.
type PollDone = pollDone

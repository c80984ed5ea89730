package intake

import "github.com/partner-intake/partner-intake/internal/testsignal"

// testSignals are the events tests wait on instead of sleeping
// (internal/testsignal): inert unless a test initialised them
// (export_test.go). Each is signalled on one line at the event.
type testSignals struct {
	// Polled: the loop finished a poll of a partner, its gauges and state
	// updated (daemon.go, Daemon.loop). Err is nil also when another
	// replica polls the partner.
	Polled testsignal.Signal[pollDone]
	// Peers: owns read which live replicas serve each partner (intake/affinity);
	// nil when the read failed.
	Peers testsignal.Signal[map[string][]string]
	// GroupHeartbeat: a group's heartbeat extended its files' leases
	// (group.go, fileGroup.heartbeat); the partner.
	GroupHeartbeat testsignal.Signal[string]
	// ChunkRetry: a chunk's transaction failed transiently and is retried
	// (apply.go, fileRun.commitChunk); the partner.
	ChunkRetry testsignal.Signal[string]
	// IdleClosed: the janitor closed a partner's idle session
	// (sessions.go, sessionKeeper.closeIdle); the partner.
	IdleClosed testsignal.Signal[string]
	// AheadChunk: a chunk was applied ahead of the file's plan, in the
	// transaction held open for it (ahead.go, fileRun.runAhead); the
	// chunk's number.
	AheadChunk testsignal.Signal[int]
	// WorkerBeat: the replica's heartbeat recorded it alive
	// (daemon.go, Daemon.workerHeartbeat).
	WorkerBeat testsignal.Signal[struct{}]
	// OwnedLookup: a poll looked up the live rows this worker holds of
	// the partner (poll.go, lookUpOwned); the partner.
	OwnedLookup testsignal.Signal[string]
	// SlotWait: a poll waits for one of the partner's slots, every one
	// taken (poll.go, Daemon.startSlot).
	SlotWait testsignal.Signal[struct{}]
	// Draining: Stop began a drain; nothing is claimed from here on
	// (daemon.go, Daemon.Stop).
	Draining testsignal.Signal[struct{}]
	// Unchanged: a chunk was looked up for rows the target holds as they
	// are (unchanged.go, fileRun.toMerge).
	Unchanged testsignal.Signal[unchangedLooked]
}

// pollDone is a poll the loop finished.
type pollDone struct {
	Partner string
	Err     error
}

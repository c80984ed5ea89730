package ledger

import "context"

// EndStalled is endStalled, for the tests of package ledger_test.
func (l *Ledger) EndStalled(ctx context.Context, oldWorker string) error {
	return l.endStalled(ctx, oldWorker)
}

// PrefixEnd is prefixEnd, for the tests of package ledger_test.
var PrefixEnd = prefixEnd

package partners

import "fmt"

// Approval is a feed's approval policy: when a file's plan (what it would
// do to the target: creates, updates, deletes…) must be approved by ops
// before it is applied. Without a policy a file is applied at once and no
// plan against the target is computed. With one, every file is planned
// against its target; it waits in awaiting_approval when Always is set or
// its plan passes a threshold, else it is applied at once as without a
// policy.
type Approval struct {
	// Always: every file of the feed waits for approval.
	Always bool `yaml:"always"`
	// MaxDeleteRatio: a plan deleting (snapshot) more than this share of
	// the file's rows waits (0: any delete waits); unset: no limit. With a
	// file of no rows any delete passes it.
	MaxDeleteRatio *float64 `yaml:"max_delete_ratio"`
	// MaxUpdateRatio: a plan updating more than this share of the file's
	// rows waits (0: any update waits); unset: no limit.
	MaxUpdateRatio *float64 `yaml:"max_update_ratio"`
	// MaxRows: a file of more rows waits; unset: no limit.
	MaxRows *int64 `yaml:"max_rows"`
}

func (a *Approval) validate(key string) error {
	if a == nil {
		return nil
	}
	for _, r := range []struct {
		name string
		v    *float64
	}{{"max_delete_ratio", a.MaxDeleteRatio}, {"max_update_ratio", a.MaxUpdateRatio}} {
		if r.v != nil && (*r.v < 0 || *r.v > 1) {
			return fmt.Errorf("%s.%s: %v must be between 0 and 1 (a share of the file's rows)", key, r.name, *r.v)
		}
	}
	if a.MaxRows != nil && *a.MaxRows < 0 {
		return fmt.Errorf("%s.max_rows: %d must not be negative", key, *a.MaxRows)
	}
	if !a.Always && a.MaxDeleteRatio == nil && a.MaxUpdateRatio == nil && a.MaxRows == nil {
		return fmt.Errorf("%s: set always: true or at least one of max_delete_ratio, max_update_ratio, max_rows (without a policy, leave approval out)", key)
	}
	return nil
}

// Needs reports whether a plan of a file of rows rows that updates and
// deletes as counted needs approval, and why (a short text for ops; no
// values).
func (a *Approval) Needs(rows, updates, deletes int64) (bool, string) {
	if a == nil {
		return false, ""
	}
	ratio := func(n int64) float64 {
		if rows == 0 {
			if n == 0 {
				return 0
			}
			return 2 // any change by a file of no rows is over every ratio
		}
		return float64(n) / float64(rows)
	}
	switch {
	case a.Always:
		return true, "policy always"
	case a.MaxRows != nil && rows > *a.MaxRows:
		return true, fmt.Sprintf("%d rows, more than max_rows %d", rows, *a.MaxRows)
	case a.MaxDeleteRatio != nil && ratio(deletes) > *a.MaxDeleteRatio:
		return true, fmt.Sprintf("%d deletes of %d rows, more than max_delete_ratio %v", deletes, rows, *a.MaxDeleteRatio)
	case a.MaxUpdateRatio != nil && ratio(updates) > *a.MaxUpdateRatio:
		return true, fmt.Sprintf("%d updates of %d rows, more than max_update_ratio %v", updates, rows, *a.MaxUpdateRatio)
	}
	return false, ""
}

// DefaultDeleteShare is the delete guard of a snapshot feed that sets
// none: a snapshot that would delete more than this share of the rows the
// feed holds for the partner waits for approval.
const DefaultDeleteShare = 0.1

// DeleteGuard keeps a snapshot that is truncated, partial or wrong from
// deleting most of a partner's rows: such a plan waits in
// awaiting_approval, as a plan over an approval policy does (intake plan
// show, intake approve). Every snapshot feed has one (SetDefaults); only
// off: true turns it off.
type DeleteGuard struct {
	// Off: the feed deletes whatever its snapshot lacks, however much
	// (intake check warns).
	Off bool `yaml:"off"`
	// MaxShare: a plan deleting more than this share of the rows the feed
	// holds for the partner waits (default DefaultDeleteShare).
	MaxShare *float64 `yaml:"max_share"`
	// MinRows: a snapshot of fewer rows waits (0: no minimum).
	MinRows int64 `yaml:"min_rows"`
}

func (g *DeleteGuard) validate(key string) error {
	if g == nil {
		return nil
	}
	if g.MaxShare != nil && (*g.MaxShare < 0 || *g.MaxShare > 1) {
		return fmt.Errorf("%s.max_share: %v must be between 0 and 1 (a share of the rows the feed holds)", key, *g.MaxShare)
	}
	if g.MinRows < 0 {
		return fmt.Errorf("%s.min_rows: %d must not be negative", key, g.MinRows)
	}
	if g.Off && (g.MaxShare != nil || g.MinRows != 0) {
		return fmt.Errorf("%s: off: true sets no limit; leave max_share and min_rows out", key)
	}
	return nil
}

// Guarded reports whether the feed's plans are measured before they are
// applied: it has an approval policy, or it is a snapshot with its delete
// guard on.
func (f *Feed) Guarded() bool {
	return f.Approval != nil || f.deleteGuarded()
}

func (f *Feed) deleteGuarded() bool {
	return f.Mode == ModeSnapshot && f.DeleteGuard != nil && !f.DeleteGuard.Off
}

// PlanWaits reports whether a plan of a file of rows rows needs a human
// before it is applied, and why (a short text for ops; no values): the
// approval policy's limits, then the delete guard's. updates and deletes
// are the plan's; held is how many of the partner's rows the feed holds
// in the target now (the rows the plan matched, updated or not, and those
// it deletes).
func (f *Feed) PlanWaits(rows, updates, deletes, held int64) (bool, string) {
	if wait, why := f.Approval.Needs(rows, updates, deletes); wait {
		return true, why
	}
	if !f.deleteGuarded() {
		return false, ""
	}
	g := f.DeleteGuard
	if g.MinRows > 0 && rows < g.MinRows {
		return true, fmt.Sprintf("a snapshot of %d rows, fewer than delete_guard.min_rows %d", rows, g.MinRows)
	}
	share := DefaultDeleteShare
	if g.MaxShare != nil {
		share = *g.MaxShare
	}
	if deletes > 0 && held > 0 && float64(deletes)/float64(held) > share {
		return true, fmt.Sprintf("%d deletes of the %d rows the feed holds, more than delete_guard.max_share %v", deletes, held, share)
	}
	return false, ""
}

// HasApproval reports whether a feed of the partner has an approval policy.
func (c *Config) HasApproval() bool {
	for i := range c.Feeds {
		if c.Feeds[i].Guarded() {
			return true
		}
	}
	return false
}

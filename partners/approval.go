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

// HasApproval reports whether a feed of the partner has an approval policy.
func (c *Config) HasApproval() bool {
	for i := range c.Feeds {
		if c.Feeds[i].Approval != nil {
			return true
		}
	}
	return false
}

package main

import "github.com/partner-intake/partner-intake/internal/inert"

// dbUser is an audit row's database user as `intake audit` shows it: "-"
// for rows recorded before the audit recorded it.
func dbUser(u string) string {
	if u == "" {
		return "-"
	}
	return inert.Text(u)
}

package intake

// SetMaxHeldIssues lowers how many rejected rows a scan holds in memory, so
// tests reach the streaming path with a small file; it returns the undo.
func SetMaxHeldIssues(n int) func() {
	old := maxHeldIssues
	maxHeldIssues = n
	return func() { maxHeldIssues = old }
}

package migrations

// Steps applies n migrations from the database's version (down when n
// is negative), for tests of an upgrade.
func Steps(dsn string, n int) error {
	m, err := open(dsn)
	if err != nil {
		return err
	}
	defer m.Close()
	return m.Steps(n)
}

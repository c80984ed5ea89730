package partners

import "fmt"

// Can is one operation's verdict in an access probe
// (sftpconn.ProbeAccess).
type Can string

// Verdicts.
const (
	CanYes     Can = "yes"
	CanNo      Can = "no"
	CanUntried Can = "untried" // nothing to try it on (e.g. rename when nothing could be created)
)

// Access is what the partner's account may do in ready/, as intake check
// finds it by trying: list it, read a file, create a file, rename it,
// delete it.
type Access struct {
	List, Read, Create, Rename, Delete Can
	// Left is a probe file the probe could not delete ("" normally).
	Left string
}

// String is the verdicts on one line.
func (a Access) String() string {
	return fmt.Sprintf("list %s, read %s, create %s, rename %s, delete %s", a.List, a.Read, a.Create, a.Rename, a.Delete)
}

// Fits says which claim modes the account allows. Every built mode
// (readiness rename, manifest and stable) claims by RENAME out of ready/
// and writes processing/, archive/, quarantine/ and reports/: it needs
// list, read, create and rename. An account that may list and read only
// fits readiness stable with claim: record (the claim kept in
// PostgreSQL, nothing on the site moved or written).
func (a Access) Fits() string {
	switch {
	case a.List == CanYes && a.Read == CanYes && a.Create == CanYes && a.Rename == CanYes:
		return "readiness rename, manifest or stable (claims by rename); claim: record too"
	case a.List == CanYes && a.Read == CanYes:
		return "only readiness: stable with claim: record (the claim kept in PostgreSQL; nothing on the site moved or written); claiming by rename needs create and rename"
	case a.List == CanYes && a.Read == CanUntried:
		return "unknown: ready/ holds no file to read and none could be created; every built mode needs read, create and rename"
	default:
		return "none: the account cannot list and read ready/"
	}
}

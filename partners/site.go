package partners

import "strings"

// Site is where a partner's tree is, as the server itself resolves it:
// the server (by the host key it proved), the account, and the root after
// SFTP REALPATH (".", a symbolic link, "..", a home directory spelled out
// and a host name or its address all come to one). Two partners whose
// sites are one tree, or one inside the other, would take each other's
// files (SiteOverlaps); sftpconn resolves it on a session.
type Site struct {
	HostKey, User, Root string
}

// Key is the site as one string, what a measured profile is kept under
// (intake_site_profile.site): another key is another site, measured
// afresh.
func (s Site) Key() string { return s.HostKey + " " + s.User + "@" + s.Root }

// SiteOverlaps reports whether two sites are one tree or one lies inside
// the other: the same server and account, and roots equal or nested.
func SiteOverlaps(a, b Site) bool {
	if a.HostKey == "" || a.HostKey != b.HostKey || a.User != b.User {
		return false
	}
	in := func(x, y string) bool { return x == y || y == "/" || strings.HasPrefix(x, y+"/") }
	return in(a.Root, b.Root) || in(b.Root, a.Root)
}

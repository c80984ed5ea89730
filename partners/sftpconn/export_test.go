package sftpconn

import "time"

// HeardSince reports whether the session's connection heard a reply on
// any channel after t: its keepalive skips its request when this holds
// for the last interval.
func HeardSince(s *Session, t time.Time) bool { return s.conn.heard.Load() > t.UnixNano() }

// OneSubsystemFallbacks is how many dials were made again with the main
// channel alone for a site that starts one sftp subsystem a connection.
func OneSubsystemFallbacks() int64 { return oneSubsystemFallbacks.Load() }

// ListsOnItsOwnChannel reports whether the session has (or may open) its
// listing channel: false once the site refused it.
func ListsOnItsOwnChannel(s *Session) bool {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	return !s.noLister
}

// DropListingChannel closes the session's listing channel as a broken
// reply would; the next listing opens a fresh one.
func DropListingChannel(s *Session) {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	if s.lister != nil {
		s.dropLocked(s.lister)
	}
}

// EndListingChannel ends the session's listing channel under it, as a
// site that closes the channel does: the SSH channel is closed without
// breaking its reader, which meets the channel's end.
func EndListingChannel(s *Session) {
	s.listMu.Lock()
	c := s.lister
	s.listMu.Unlock()
	if c != nil {
		c.ch.(*sessChan).ch.Close()
		<-c.done
	}
}

// ErrPartRead: ReadWhole met a short read (the caller reads the usual way).
var ErrPartRead = errPartRead

// SetListLimits sets MaxListNames and MaxReadDirEntries for a test; the
// returned func puts them back.
func SetListLimits(names, readDir int) func() {
	on, or := maxListNames, maxReadDirEntries
	maxListNames, maxReadDirEntries = names, readDir
	return func() { maxListNames, maxReadDirEntries = on, or }
}

// SetWholeListingBytes lowers WholeListingBytes; it returns the undo.
func SetWholeListingBytes(n int64) func() {
	old := wholeListingBytes
	wholeListingBytes = n
	return func() { wholeListingBytes = old }
}

// ListingRequests is how many SFTP requests the session has sent on its
// listing channels.
func ListingRequests(s *Session) int64 { return s.listWatch.sentAll.Load() }

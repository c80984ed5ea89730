package partners

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/reason"
)

// The ready rules: what in ready/ is claimable, and why the rest is not.
// The poller (intake/poll.go) claims by them and the reconciler
// (reconcile/matrix.go) reports by them, so both judge a listing alike.

// Why an entry of ready/ is not claimed is a reason.Code of kind
// reason.KindSkip; "" is none (the entry is a candidate). Its values label
// intake_skipped_total{reason}.

const (
	// MaxNameBytes bounds a remote name (the limit of every common file
	// system).
	MaxNameBytes = 255
	// PartialSuffix marks an upload still being written.
	PartialSuffix = ".part"
)

// Candidate is an entry of ready/ worth claiming.
type Candidate struct {
	Name     string
	Size     int64
	Feed     *Feed
	Manifest string
	MTime    time.Time
}

// Hostile reports whether a skipped entry is moved to quarantine (with a
// receipt saying why) rather than left for later: it will never become a
// valid file by waiting.
func Hostile(why reason.Code) bool {
	return why == reason.NotRegularFile || why == reason.BadName || why == reason.DeceptiveName || why == reason.NoFeed
}

// HostilePrefix names hostile entries claimed into processing/: the
// original name is never used in a path of ours.
const HostilePrefix = "hostile-"

// HostileName is a name generated for an entry held for why (Hostile):
// the prefix, the reason (which the hold reads back), and the time and
// random bytes that make it unique.
func HostileName(why reason.Code) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%s-%d-%s", HostilePrefix, why, time.Now().UnixNano(), hex.EncodeToString(b[:]))
}

// ClaimedHostile says why an entry of a processing/ dir, left there
// without a row (a claim whose row was not recorded), is to be held
// unread rather than run: not a regular file any more (swapped between
// the listing and the claim's RENAME), a name no safe path takes, or a
// name no feed of the partner matches any more (a feed removed or
// re-patterned since the claim); "" for a file of a feed. The caller has
// left out what is not a claim: names starting with a dot, hostile and
// probe entries, and the manifests of manifest readiness.
func (c *Config) ClaimedHostile(e os.FileInfo) reason.Code {
	switch name := e.Name(); {
	case !e.Mode().IsRegular():
		return reason.NotRegularFile
	case !SafeName(name):
		return reason.BadName
	case c.FeedFor(name) == nil:
		return reason.NoFeed
	}
	return ""
}

// Skipped is an entry of ready/ that is not claimed, and why.
type Skipped struct {
	Info   os.FileInfo
	Reason reason.Code
}

// ClassifyReady splits a listing of ready/ into claimable files (oldest
// first) and skipped entries. READDIR attributes are lstat-like on
// OpenSSH, so symlinks show as symlinks and are never followed; dotfiles,
// *.part, directories and other non-regular entries, unsafe names, names no
// feed matches, (manifest mode) data files without their manifest, and
// (stable mode) names matching stable.ignore are skipped. Stable mode's
// clock needs what earlier listings saw: ClassifyStable judges each
// candidate once ObserveReady has recorded this listing.
func ClassifyReady(p *Config, ents []os.FileInfo) ([]Candidate, []Skipped) {
	ents = append([]os.FileInfo(nil), ents...)
	names := map[string]os.FileInfo{}
	for _, e := range ents {
		names[e.Name()] = e
	}
	sort.Slice(ents, func(i, j int) bool {
		if !ents[i].ModTime().Equal(ents[j].ModTime()) {
			return ents[i].ModTime().Before(ents[j].ModTime())
		}
		return ents[i].Name() < ents[j].Name()
	})
	manifestMode := p.Readiness == ReadinessManifest
	var out []Candidate
	var skipped []Skipped
	for _, e := range ents {
		c, why := ClassifyEntry(p, e)
		if why == "" && manifestMode {
			m, ok := names[c.Name+ManifestSuffix]
			if !ok || !m.Mode().IsRegular() {
				why = reason.ManifestMissing
			} else {
				c.Manifest = c.Name + ManifestSuffix
			}
		}
		if why != "" {
			skipped = append(skipped, Skipped{Info: e, Reason: why})
			continue
		}
		out = append(out, c)
	}
	return out, skipped
}

// ClassifyEntry is one entry's verdict, all but the manifest check
// (which needs the rest of the listing): a candidate, or why it is
// skipped.
func ClassifyEntry(p *Config, e os.FileInfo) (Candidate, reason.Code) {
	name := e.Name()
	var why reason.Code
	switch {
	case strings.HasPrefix(name, "."):
		why = reason.Dotfile
	case strings.HasSuffix(name, PartialSuffix):
		why = reason.PartialUpload
	case !e.Mode().IsRegular():
		why = reason.NotRegularFile
	case !SafeName(name):
		why = nameSkip(name)
	case p.Readiness == ReadinessStable && p.Ignored(name):
		why = reason.IgnoredName // after the name checks: a hostile name is held whatever it ends in
	case p.Readiness == ReadinessManifest && strings.HasSuffix(name, ManifestSuffix):
		why = reason.ManifestFile
	}
	c := Candidate{Name: name, Size: e.Size(), MTime: e.ModTime()}
	if why == "" {
		if c.Feed = p.FeedFor(name); c.Feed == nil {
			why = reason.NoFeed
		}
	}
	return c, why
}

// Ignored reports whether a name matches one of the partner's
// stable.ignore patterns (readiness stable): a file an upload tool is
// still writing under a temporary name.
func (p *Config) Ignored(name string) bool {
	for _, pat := range p.Stable.Ignore {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}

// Unchanged is what PostgreSQL remembers of a candidate under readiness
// stable (intake/ledger ObserveReady): since when successive listings saw
// its size and mtime unchanged, and the database's clock now (shared by
// every replica, so no replica's own clock decides).
type Unchanged struct {
	Since time.Time
	Now   time.Time
}

// ClassifyStable is the verdict of readiness stable on a candidate that
// ClassifyEntry let through: "" (ready) once listings have seen its size
// and mtime unchanged for stable_for and its mtime is min_age old, else
// reason.NotStable. A file first seen in this listing is never ready
// (stable_for is positive), so a file is taken only after at least two
// listings stable_for apart agree on it. The mtime comes from the site's
// clock: a site clock running ahead delays min_age, never stable_for. It
// is only compared, never counted from: on a server that stamps its own
// (an object store's gateway at an upload's start or end, whole minutes)
// a file still growing shows an old mtime, and only its size changing
// between listings holds it back; a stamp that jumps starts the clock
// again.
func ClassifyStable(p *Config, c Candidate, u Unchanged) reason.Code {
	if u.Since.IsZero() || u.Now.Sub(u.Since) < p.Stable.StableFor || u.Now.Sub(c.MTime) < p.Stable.MinAge {
		return reason.NotStable
	}
	return ""
}

// SafeName reports whether a remote file name may be handled: valid UTF-8,
// no control characters, no Unicode format characters (category Cf: the
// bidirectional overrides, zero-width characters), no line or paragraph
// separators, no path separators, not "." or "..", at most 255 bytes.
// Spool paths never derive from names; this guards remote paths and
// reports, and what an ops terminal shows.
func SafeName(name string) bool {
	return nameSkip(name) == ""
}

// nameSkip is why a name is not safe (reason.BadName, reason.DeceptiveName),
// or "".
func nameSkip(name string) reason.Code {
	if name == "" || name == "." || name == ".." || len(name) > MaxNameBytes || !utf8.ValidString(name) {
		return reason.BadName
	}
	var skip reason.Code
	for _, r := range name {
		switch {
		case r < 0x20 || r == 0x7f || r == '/' || r == '\\' || (r >= 0x80 && r < 0xa0):
			return reason.BadName
		case r >= 0x80 && unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp):
			skip = reason.DeceptiveName
		}
	}
	return skip
}

// MaxManifestNames bounds the manifest names a listing remembers (manifest
// mode); past it, a data file's manifest is looked up with one LSTAT.
const MaxManifestNames = 10000

// Manifests are the manifests a streamed listing of ready/ passed
// (manifest mode), remembered up to MaxManifestNames: a data file and its
// manifest may come in either order, so whether a data file is complete
// is known once the listing ends.
type Manifests struct {
	names    map[string]bool
	overflow bool
}

// Add remembers a regular manifest file of the listing.
func (m *Manifests) Add(name string) {
	if m.names == nil {
		m.names = map[string]bool{}
	}
	if len(m.names) < MaxManifestNames {
		m.names[name] = true
	} else {
		m.overflow = true
	}
}

// Seen reports whether the listing passed the manifest and remembered it.
func (m *Manifests) Seen(name string) bool { return m.names[name] }

// Overflowed reports whether the listing passed more manifests than it
// remembered.
func (m *Manifests) Overflowed() bool { return m.overflow }

// Has reports whether the manifest is in ready/: remembered, or, when the
// listing passed more than it remembered, found there as a regular file
// by regular (one LSTAT on the site: sftpconn's Session.RegularInReady).
func (m *Manifests) Has(name string, regular func(name string) bool) bool {
	if m.names[name] {
		return true
	}
	return m.overflow && regular(name)
}

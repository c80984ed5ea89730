// Package partners holds what intake knows about one partner: its
// configuration, the layout of its remote directories, the rules of what
// in ready/ may be claimed, the manifest format, and what its site was
// measured to be (Profile, Site). The SFTP transport to the site is
// package partners/sftpconn, which reads this one; this one never
// imports it.
package partners

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/internal/names"
	"github.com/partner-intake/partner-intake/internal/setting"
)

// Readiness modes: how a partner tells us a file is complete.
const (
	// ReadinessRename: the partner uploads elsewhere and publishes into ready/
	// by an atomic rename; everything listed in ready/ is complete.
	ReadinessRename = "rename"
	// ReadinessManifest: a data file in ready/ is complete only once its
	// <name>.complete manifest exists and agrees with the downloaded bytes.
	ReadinessManifest = "manifest"
	// ReadinessStable: for partners who cannot rename. The partner writes
	// straight into ready/; a file is ready once its size and mtime have
	// not changed for stable.stable_for (observed over successive listings
	// and remembered in PostgreSQL) and it is older than stable.min_age.
	// Names matching stable.ignore are never taken.
	ReadinessStable = "stable"
)

// Claim modes: how a file is taken.
const (
	// ClaimRename: RENAME into processing/<worker>/ (the default).
	ClaimRename = "rename"
	// ClaimRecord: for read-only sites (the account may list and read,
	// not rename or delete). The claim lives only in PostgreSQL, keyed by
	// (partner, name, size, mtime); files are never moved and nothing is
	// written to the site: archive and quarantine are records and spool
	// copies. Needs readiness: stable.
	ClaimRecord = "record"
)

// Defaults applied by SetDefaults.
const (
	DefaultPoll        = "@every 10s"
	DefaultDialTimeout = 15 * time.Second
	// MinSFTPPacket is the request size every SFTP server must accept;
	// MaxSFTPPacket is OpenSSH's read limit (255 KiB).
	MinSFTPPacket         = 32 * 1024
	MaxSFTPPacket         = 255 * 1024
	DefaultKeepalive      = 15 * time.Second
	DefaultOpTimeout      = 60 * time.Second
	DefaultMaxFileBytes   = 1 << 30 // 1 GiB
	DefaultMaxRows        = 10_000_000
	DefaultMaxFilesPoll   = 100
	DefaultMaxRejectRatio = 0.10
	DefaultStaleUpload    = 6 * time.Hour
	DefaultMaxExpanded    = 4 << 30 // 4 GiB
	// DefaultMaxExpansionRatio: expanded bytes over compressed bytes.
	DefaultMaxExpansionRatio = 100
	DefaultConcurrency       = 4
	DefaultGroupFiles        = 32
	MaxGroupFiles            = 256
)

// Config is one partner.
type Config struct {
	// ID is the partner id: lower-case letters, digits, '-' and '_'. It is
	// part of every key, path, query, metric label and report.
	ID string `yaml:"id"`
	// SFTP is how to reach the partner's drop site.
	SFTP SFTP `yaml:"sftp"`
	// Poll is a robfig/cron/v3 spec ("*/5 * * * *") or "@every 30s".
	Poll string `yaml:"poll"`
	// Dirs names the remote directories.
	Dirs Dirs `yaml:"dirs"`
	// Readiness is "rename" (default), "manifest" or "stable".
	Readiness string `yaml:"readiness"`
	// Stable tunes readiness: stable (ignored otherwise).
	Stable Stable `yaml:"stable"`
	// Claim is "rename" (default) or "record" (read-only sites).
	Claim string `yaml:"claim"`
	// Concurrency is how many of the partner's files one daemon works on at
	// once (default 4; fewer on a server that holds fewer files of a
	// session open, as intake check measured it).
	Concurrency int `yaml:"concurrency"`
	// GroupFiles is how many of the partner's small files (under 64 KiB,
	// one chunk, no manifest, not compressed) one poll takes through the
	// pipeline together: their SFTP requests go out together and their
	// state changes are one statement each (default 32; 1 processes every
	// file on its own).
	GroupFiles int `yaml:"group_files"`
	// Limits bounds what one file may be.
	Limits Limits `yaml:"limits"`
	// Feeds: each file in ready/ must match exactly one feed's pattern.
	Feeds []Feed `yaml:"feeds"`
	// SharedSite: this partner's drop is on the same site (address and
	// user) and under the same sftp.root as another partner's, on purpose.
	// Both must say so; their dirs must still be separate (no directory of
	// one equal to or inside one of the other's): each partner claims all
	// of its ready/ and accounts for all of its processing/, archive/ and
	// quarantine/.
	SharedSite bool `yaml:"shared_site"`
	// Notify are webhooks for this partner's events (besides the global
	// notify list of the daemon's config).
	Notify []Notify `yaml:"notify"`
}

// Stable is how readiness: stable judges a file in ready/ complete.
type Stable struct {
	// StableFor is how long a file's size and mtime must stay the same,
	// seen unchanged by listings at least this far apart (default 1m).
	StableFor time.Duration `yaml:"stable_for"`
	// MinAge is how old (by its mtime) a file must be (default 1m).
	MinAge time.Duration `yaml:"min_age"`
	// Ignore lists name patterns (path.Match globs) of files still being
	// written that are never taken (default DefaultStableIgnore).
	Ignore []string `yaml:"ignore"`
}

// Defaults of readiness: stable.
const (
	DefaultStableFor = time.Minute
	DefaultMinAge    = time.Minute
)

// DefaultStableIgnore are the temporary names common upload tools write
// under (WinSCP *.filepart, browsers *.crdownload, editors ~*); dotfiles
// and *.part are skipped in every mode.
var DefaultStableIgnore = []string{"*.part", "*.tmp", "*.temp", "*.filepart", "*.partial", "*.crdownload", "*.swp", "~*"}

// SFTP is the connection to a partner's site. Exactly one of
// PrivateKeyFile, PasswordFile, PasswordEnv is set. KnownHostsFile is
// required: there is no way to skip host-key checking.
type SFTP struct {
	// Address is host:port.
	Address string `yaml:"address"`
	// User is the SSH login.
	User string `yaml:"user"`
	// PrivateKeyFile is an unencrypted OpenSSH private key.
	PrivateKeyFile string `yaml:"private_key_file"`
	// PasswordFile holds the password on its first line.
	PasswordFile string `yaml:"password_file"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `yaml:"password_env"`
	// KnownHostsFile pins the server's host key (OpenSSH known_hosts format).
	KnownHostsFile string `yaml:"known_hosts_file"`
	// Root is the remote directory the layout lives under ("." = login dir).
	Root string `yaml:"root"`
	// DialTimeout bounds TCP connect plus the SSH handshake.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// Keepalive is the interval of keepalive@openssh.com requests.
	Keepalive time.Duration `yaml:"keepalive"`
	// OpTimeout is how long an SFTP request may go without a reply from
	// the site (an inactivity deadline, renewed by every reply that ends
	// and every 4 KiB of one: a transfer that moves never expires, a site
	// trickling a byte now and then does). On expiry the session is
	// closed, every call on it fails, and the partner's poll backs off
	// alone.
	OpTimeout time.Duration `yaml:"op_timeout"`
	// MaxPacket is the SFTP read/write request size in bytes. 0 (auto):
	// 255 KiB when the server says it is OpenSSH 8.6 or later (whose
	// sftp-server announces that read limit), else 32 KiB, the size every
	// SFTP server must accept. Set it to force a size (32768..261120).
	MaxPacket int `yaml:"max_packet"`
	// LegacyAlgorithms offers the SHA-1 SSH algorithms too, after the
	// others, for an old server that has nothing better: the
	// diffie-hellman-group14-sha1 key exchange, the hmac-sha1 and
	// hmac-sha1-96 MACs, ssh-rsa signatures of the host key and of
	// intake's own RSA key (partners/sftpconn/algorithms.go). intake check warns
	// for it, and intake_partner_legacy_ssh_algorithms is 1.
	LegacyAlgorithms bool `yaml:"legacy_algorithms"`
}

// Dirs names the remote directories, relative to SFTP.Root.
type Dirs struct {
	Incoming   string `yaml:"incoming"`
	Ready      string `yaml:"ready"`
	Processing string `yaml:"processing"`
	Archive    string `yaml:"archive"`
	Quarantine string `yaml:"quarantine"`
	Reports    string `yaml:"reports"`
}

// Limits bounds one file. Files over a limit are quarantined unparsed.
type Limits struct {
	// MaxFileBytes is checked on the listed size and while streaming.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// MaxRows is the most data rows one file may hold.
	MaxRows int64 `yaml:"max_rows"`
	// MaxFilesPerPoll caps how many files one poll claims.
	MaxFilesPerPoll int `yaml:"max_files_per_poll"`
	// StaleUpload is how old a *.part in incoming/ may get before an alert.
	StaleUpload time.Duration `yaml:"stale_upload"`
	// MaxExpandedBytes caps what a compressed file may expand to, enforced
	// while streaming (archive headers are not trusted).
	MaxExpandedBytes int64 `yaml:"max_expanded_bytes"`
	// MaxExpansionRatio caps what a compressed file may expand to relative
	// to its compressed size (expanded bytes over compressed bytes,
	// default 100), enforced while streaming: a small bomb is stopped long
	// before MaxExpandedBytes.
	MaxExpansionRatio int64 `yaml:"max_expansion_ratio"`
	// MaxSpoolBytes is the partner's spool quota (0: none): while its
	// spooled bytes are at or over it, none of its files is claimed
	// (backpressure for this partner alone; retention frees the spool).
	MaxSpoolBytes int64 `yaml:"max_spool_bytes"`
}

// SetDefaults fills unset fields with their defaults.
func (c *Config) SetDefaults() {
	setting.Default(&c.Poll, DefaultPoll)
	setting.Default(&c.Readiness, ReadinessRename)
	setting.Default(&c.Claim, ClaimRename)
	if c.Readiness == ReadinessStable {
		setting.Default(&c.Stable.StableFor, DefaultStableFor)
		setting.Default(&c.Stable.MinAge, DefaultMinAge)
		if c.Stable.Ignore == nil {
			c.Stable.Ignore = append([]string(nil), DefaultStableIgnore...)
		}
	}
	setting.Default(&c.Concurrency, DefaultConcurrency)
	setting.Default(&c.GroupFiles, DefaultGroupFiles)
	setting.Default(&c.SFTP.Root, ".")
	setting.Default(&c.SFTP.DialTimeout, DefaultDialTimeout)
	setting.Default(&c.SFTP.Keepalive, DefaultKeepalive)
	setting.Default(&c.SFTP.OpTimeout, DefaultOpTimeout)
	d := &c.Dirs
	setting.Default(&d.Incoming, "incoming")
	setting.Default(&d.Ready, "ready")
	setting.Default(&d.Processing, "processing")
	setting.Default(&d.Archive, "archive")
	setting.Default(&d.Quarantine, "quarantine")
	setting.Default(&d.Reports, "reports")
	setting.Default(&c.Limits.MaxFileBytes, DefaultMaxFileBytes)
	setting.Default(&c.Limits.MaxRows, DefaultMaxRows)
	setting.Default(&c.Limits.MaxFilesPerPoll, DefaultMaxFilesPoll)
	setting.Default(&c.Limits.StaleUpload, DefaultStaleUpload)
	setting.Default(&c.Limits.MaxExpandedBytes, DefaultMaxExpanded)
	setting.Default(&c.Limits.MaxExpansionRatio, DefaultMaxExpansionRatio)
	for i := range c.Feeds {
		c.Feeds[i].SetDefaults()
	}
}

// Validate reports the first problem, naming the key to fix. key is the
// path of this partner in the config file, e.g. "partners[0]".
func (c *Config) Validate(key string) error {
	if !names.PartnerID(c.ID) { // spool paths, metric labels, keys: a safe alphabet
		return fmt.Errorf("%s.id: %q must match %s", key, c.ID, names.PartnerIDRule)
	}
	key = fmt.Sprintf("%s (id %s)", key, c.ID)
	s := c.SFTP
	if s.Address == "" || !strings.Contains(s.Address, ":") {
		return fmt.Errorf("%s.sftp.address: want host:port, got %q", key, s.Address)
	}
	if s.User == "" {
		return fmt.Errorf("%s.sftp.user: required", key)
	}
	n := 0
	for _, v := range []string{s.PrivateKeyFile, s.PasswordFile, s.PasswordEnv} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%s.sftp: set exactly one of private_key_file, password_file, password_env", key)
	}
	if s.PasswordEnv != "" && !names.EnvName(s.PasswordEnv) {
		// never echoed: it may be the password itself
		return fmt.Errorf("%s.sftp.password_env: must be the name of an environment variable (letters, digits, '_', '.', '-'), not the password", key)
	}
	if s.KnownHostsFile == "" {
		return fmt.Errorf("%s.sftp.known_hosts_file: required; host keys are always pinned (ssh-keyscan the server and verify the fingerprint out of band)", key)
	}
	// A negative interval would be a timer that never waits (a dial
	// that always times out) or a ticker that panics (keepalive).
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"dial_timeout", s.DialTimeout}, {"keepalive", s.Keepalive}, {"op_timeout", s.OpTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%s.sftp.%s: %s must be positive", key, d.name, d.v)
		}
	}
	if s.MaxPacket != 0 && (s.MaxPacket < MinSFTPPacket || s.MaxPacket > MaxSFTPPacket) {
		return fmt.Errorf("%s.sftp.max_packet: %d must be 0 (auto) or between %d and %d", key, s.MaxPacket, MinSFTPPacket, MaxSFTPPacket)
	}
	if c.Readiness != ReadinessRename && c.Readiness != ReadinessManifest && c.Readiness != ReadinessStable {
		return fmt.Errorf("%s.readiness: %q is not %q, %q or %q", key, c.Readiness, ReadinessRename, ReadinessManifest, ReadinessStable)
	}
	if c.Readiness == ReadinessStable {
		if c.Stable.StableFor <= 0 || c.Stable.MinAge < 0 {
			return fmt.Errorf("%s.stable: stable_for must be positive and min_age not negative", key)
		}
		for i, pat := range c.Stable.Ignore {
			if _, err := path.Match(pat, "x"); err != nil || pat == "" {
				return fmt.Errorf("%s.stable.ignore[%d]: %q is not a valid name pattern", key, i, pat)
			}
		}
	} else if c.Stable.StableFor != 0 || c.Stable.MinAge != 0 || c.Stable.Ignore != nil {
		return fmt.Errorf("%s.stable: only for readiness: stable", key)
	}
	if c.Claim != ClaimRename && c.Claim != ClaimRecord {
		return fmt.Errorf("%s.claim: %q is not %q or %q", key, c.Claim, ClaimRename, ClaimRecord)
	}
	if c.Claim == ClaimRecord && c.Readiness != ReadinessStable {
		return fmt.Errorf("%s.claim: record needs readiness: stable (a read-only site cannot publish by rename)", key)
	}
	dirs := c.Dirs.named()
	for _, d := range dirs {
		if strings.Contains(d.dir, "..") || strings.HasPrefix(d.dir, "/") || strings.ContainsAny(d.dir, "\x00\n") {
			return fmt.Errorf("%s.dirs.%s: %q must be a relative path below sftp.root without '..'", key, d.name, d.dir)
		}
	}
	// Each directory has one role: a claim under ready/, an archive
	// inside ready/ or a quarantine that is the archive would be listed,
	// claimed or accounted for twice.
	for i, a := range dirs {
		for _, b := range dirs[i+1:] {
			if nested(path.Clean(a.dir), path.Clean(b.dir)) {
				return fmt.Errorf("%s.dirs: %s %q and %s %q overlap; each directory must be separate (neither equal to nor inside another)",
					key, a.name, a.dir, b.name, b.dir)
			}
		}
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		return fmt.Errorf("%s.concurrency: %d must be between 1 and 64", key, c.Concurrency)
	}
	if c.GroupFiles < 1 || c.GroupFiles > MaxGroupFiles {
		return fmt.Errorf("%s.group_files: %d must be between 1 and %d", key, c.GroupFiles, MaxGroupFiles)
	}
	if c.Limits.MaxFileBytes < 0 || c.Limits.MaxRows < 0 || c.Limits.MaxFilesPerPoll < 0 || c.Limits.MaxExpandedBytes < 0 || c.Limits.MaxExpansionRatio < 0 || c.Limits.MaxSpoolBytes < 0 || c.Limits.StaleUpload < 0 {
		return fmt.Errorf("%s.limits: values must be positive", key)
	}
	if len(c.Feeds) == 0 {
		return fmt.Errorf("%s.feeds: at least one feed is required", key)
	}
	if err := ValidateNotify(key+".notify", c.Notify); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range c.Feeds {
		f := &c.Feeds[i]
		fkey := fmt.Sprintf("%s.feeds[%d]", key, i)
		if err := f.Validate(fkey, c.Readiness); err != nil {
			return err
		}
		if seen[f.Name] {
			return fmt.Errorf("%s.name: feed %q appears twice", fkey, f.Name)
		}
		seen[f.Name] = true
	}
	return nil
}

// Records reports whether the partner's claims are records only (claim:
// record): nothing on its site is moved or written.
func (c *Config) Records() bool { return c.Claim == ClaimRecord }

// Feed is the partner's feed of that name, or nil.
func (c *Config) Feed(name string) *Feed {
	for i := range c.Feeds {
		if c.Feeds[i].Name == name {
			return &c.Feeds[i]
		}
	}
	return nil
}

// FeedFor returns the feed whose pattern matches name, or nil.
func (c *Config) FeedFor(name string) *Feed {
	for i := range c.Feeds {
		if c.Feeds[i].re.MatchString(name) {
			return &c.Feeds[i]
		}
	}
	return nil
}

// FeedsOn names the partner's feeds that write target's table (the
// feed's own included; `orders` and `public.orders` are one table): their
// files' rows meet in one table, so their order is one (an older file of
// any of them may overwrite what a newer file of another found as it is).
func (c *Config) FeedsOn(target string) []string {
	schema, table := names.SplitTarget(target)
	var out []string
	for i := range c.Feeds {
		if s, t := names.SplitTarget(c.Feeds[i].Target); s == schema && t == table {
			out = append(out, c.Feeds[i].Name)
		}
	}
	return out
}

// namedDir is one of the remote directories with its key.
type namedDir struct{ name, dir string }

// named lists the directories in a fixed order (errors name the first).
func (d Dirs) named() []namedDir {
	return []namedDir{{"incoming", d.Incoming}, {"ready", d.Ready}, {"processing", d.Processing},
		{"archive", d.Archive}, {"quarantine", d.Quarantine}, {"reports", d.Reports}}
}

// nested reports whether two clean slash paths are equal or one lies
// inside the other ("." is the directory both are relative to).
func nested(a, b string) bool {
	return a == b || a == "." || b == "." || strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/")
}

// site is where a partner's drop lives: the address (host case-folded)
// and the login. Two addresses naming one host (a name and its IP) are
// not recognised as one site.
func (c *Config) site() string {
	return strings.ToLower(c.SFTP.Address) + "\x00" + c.SFTP.User
}

// SharedAccounts returns the partners that log in to one SFTP account
// (the same address, host case-folded, and user) with another partner,
// as groups of indexes into ps in config order; a partner alone on its
// account is in none. Partners on one account can each read, replace and
// link to the others' files whatever their roots: separate directories
// (CheckSites) keep their claims apart, not the partners.
func SharedAccounts(ps []Config) [][]int {
	var order []string
	bySite := map[string][]int{}
	for i := range ps {
		s := ps[i].site()
		if _, ok := bySite[s]; !ok {
			order = append(order, s)
		}
		bySite[s] = append(bySite[s], i)
	}
	var out [][]int
	for _, s := range order {
		if len(bySite[s]) > 1 {
			out = append(out, bySite[s])
		}
	}
	return out
}

// CheckSites refuses partners whose drops collide on one site (address and
// user): the same sftp.root unless both declare shared_site: true, and in
// any case a directory of one equal to or inside a directory of the other
// (each partner claims everything in its ready/ and holds what no feed of
// its own matches, and its reconciler reports whatever its processing/,
// archive/ and quarantine/ hold that is not its own). keys are the
// partners' config paths, e.g. "partners[1] (id beta)".
//
// The pairwise comparison that names the first collision is quadratic in
// the partners of a site (1,000 partners under one hub login took 13 s of
// CPU at start); it runs only when a sort of each site's directories
// (sitesCollide) has found that some collision exists.
func CheckSites(ps []Config, keys []string) error {
	if !sitesCollide(ps) {
		return nil
	}
	return checkSitesPairwise(ps, keys)
}

// checkSitesPairwise is CheckSites comparing every two partners of a site.
func checkSitesPairwise(ps []Config, keys []string) error {
	for j := range ps {
		for i := range ps[:j] {
			a, b := &ps[i], &ps[j]
			if a.site() != b.site() {
				continue
			}
			ra, rb := path.Clean(a.SFTP.Root), path.Clean(b.SFTP.Root)
			if ra == rb && !(a.SharedSite && b.SharedSite) {
				return fmt.Errorf("%s.sftp: same site (%s@%s) and root %q as %s; give each partner its own sftp.root, or set shared_site: true on both (with separate dirs)",
					keys[j], b.SFTP.User, b.SFTP.Address, b.SFTP.Root, keys[i])
			}
			for _, da := range a.Dirs.named() {
				for _, db := range b.Dirs.named() {
					pa, pb := path.Join(ra, da.dir), path.Join(rb, db.dir)
					if nested(pa, pb) {
						return fmt.Errorf("%s.dirs.%s: %q on site %s@%s overlaps %s.dirs.%s %q; each partner needs directories of its own",
							keys[j], db.name, pb, b.SFTP.User, b.SFTP.Address, keys[i], da.name, pa)
					}
				}
			}
		}
	}
	return nil
}

// sitesCollide reports whether any two partners' drops collide as
// CheckSites defines it, in O(n log n): per site, the partners' roots are
// counted and their directories sorted by path components, so that the
// directories a directory lies in (or equals) are the ones still on a
// stack when it is reached.
func sitesCollide(ps []Config) bool {
	type entry struct {
		parts   []string
		partner int
	}
	bySite := map[string][]int{}
	for i := range ps {
		bySite[ps[i].site()] = append(bySite[ps[i].site()], i)
	}
	for _, group := range bySite {
		if len(group) < 2 {
			continue
		}
		roots := map[string][]int{}
		var es []entry
		for _, i := range group {
			root := path.Clean(ps[i].SFTP.Root)
			roots[root] = append(roots[root], i)
			for _, d := range ps[i].Dirs.named() {
				p := path.Join(root, d.dir)
				if p == "." {
					return true // "." holds every other partner's directories
				}
				es = append(es, entry{strings.Split(p, "/"), i})
			}
		}
		for _, same := range roots {
			for _, i := range same {
				if len(same) > 1 && !ps[i].SharedSite {
					return true
				}
			}
		}
		sort.Slice(es, func(a, b int) bool { return slices.Compare(es[a].parts, es[b].parts) < 0 })
		var stack []entry
		for _, e := range es {
			for len(stack) > 0 {
				top := stack[len(stack)-1].parts
				if len(top) <= len(e.parts) && slices.Equal(top, e.parts[:len(top)]) {
					break
				}
				stack = stack[:len(stack)-1]
			}
			for _, a := range stack {
				if a.partner != e.partner {
					return true
				}
			}
			stack = append(stack, e)
		}
	}
	return false
}

package config

import (
	"strings"
	"testing"
)

// partnerBlock is the example's partner, as YAML list entry.
func partnerBlock(t *testing.T) string {
	src := example(t)
	return src[strings.Index(src, "  - id: acme"):]
}

// withPartner appends a second partner: the example's, edited.
func withPartner(t *testing.T, edits ...string) string {
	b := partnerBlock(t)
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(b, edits[i]) {
			t.Fatalf("the example's partner has no %q", edits[i])
		}
		b = strings.ReplaceAll(b, edits[i], edits[i+1])
	}
	return strings.TrimRight(example(t), "\n") + "\n" + b
}

// ownDirs moves every directory of a partner under prefix/.
var ownDirs = []string{
	"incoming: incoming", "incoming: beta/incoming", "ready: ready ", "ready: beta/ready ",
	"processing: processing", "processing: beta/processing", "archive: archive ", "archive: beta/archive ",
	"quarantine: quarantine", "quarantine: beta/quarantine", "reports: reports", "reports: beta/reports",
}

// Configuration that would let partners' files, claims or rows meet is
// refused, naming the key.
func TestConfigKeepsPartnersApart(t *testing.T) {
	tests := []struct {
		name    string
		src     func(t *testing.T) string
		wantAll []string // empty: the config is valid
	}{
		{"a second partner with its own root is valid", func(t *testing.T) string {
			return withPartner(t, "- id: acme", "- id: beta", "root: /drop ", "root: /drop-beta ")
		}, nil},
		{"a duplicate partner id", func(t *testing.T) string {
			return withPartner(t, "root: /drop ", "root: /drop-2 ")
		}, []string{"partners[1].id", `"acme" appears twice`, "partners[0]"}},
		{"a duplicate feed name within a partner", func(t *testing.T) string {
			src := example(t)
			feed := src[strings.Index(src, "      - name: orders"):]
			return src + strings.Replace(feed, "pattern: 'orders-", "pattern: 'other-", 1)
		}, []string{"partners[0] (id acme).feeds[1].name", `feed "orders" appears twice`}},
		{"ready is processing", func(t *testing.T) string {
			return strings.Replace(example(t), "processing: processing", "processing: ready", 1)
		}, []string{"partners[0] (id acme).dirs", `ready "ready" and processing "ready" overlap`}},
		{"archive inside ready", func(t *testing.T) string {
			return strings.Replace(example(t), "archive: archive ", "archive: ready/archive ", 1)
		}, []string{"partners[0] (id acme).dirs", `ready "ready" and archive "ready/archive" overlap`}},
		{"a directory that is the root holds all the others", func(t *testing.T) string {
			return strings.Replace(example(t), "reports: reports", "reports: .", 1)
		}, []string{"partners[0] (id acme).dirs", `reports "."`}},
		{"a trailing slash is the same directory", func(t *testing.T) string {
			return strings.Replace(example(t), "quarantine: quarantine", "quarantine: archive/", 1)
		}, []string{`archive "archive" and quarantine "archive/" overlap`}},
		{"two partners on one site and root", func(t *testing.T) string {
			return withPartner(t, "- id: acme", "- id: beta")
		}, []string{"partners[1] (id beta).sftp", "same site (intake@sftp.acme.example:22) and root", "partners[0] (id acme)", "shared_site: true"}},
		{"the address's host is compared without case", func(t *testing.T) string {
			return withPartner(t, "- id: acme", "- id: beta", "sftp.acme.example", "SFTP.Acme.example")
		}, []string{"partners[1] (id beta).sftp", "same site"}},
		{"shared_site on one partner only", func(t *testing.T) string {
			return withPartner(t, append([]string{"- id: acme", "- id: beta", "shared_site: false", "shared_site: true"}, ownDirs...)...)
		}, []string{"partners[1] (id beta).sftp", "shared_site: true on both"}},
		{"shared_site on the second partner only, with the same dirs", func(t *testing.T) string {
			return withPartner(t, "- id: acme", "- id: beta", "shared_site: false", "shared_site: true")
		}, []string{"partners[1] (id beta).sftp", "shared_site: true on both"}},
		{"shared_site on both, but the same dirs", func(t *testing.T) string {
			src := strings.Replace(example(t), "shared_site: false", "shared_site: true", 1)
			b := strings.Replace(partnerBlock(t), "- id: acme", "- id: beta", 1)
			return src + strings.Replace(b, "shared_site: false", "shared_site: true", 1)
		}, []string{"partners[1] (id beta).dirs.incoming", `"/drop/incoming"`, "overlaps partners[0] (id acme).dirs.incoming"}},
		{"shared_site on both, with dirs of their own", func(t *testing.T) string {
			src := strings.Replace(example(t), "shared_site: false", "shared_site: true", 1)
			b := partnerBlock(t)
			b = strings.Replace(b, "- id: acme", "- id: beta", 1)
			b = strings.Replace(b, "shared_site: false", "shared_site: true", 1)
			for i := 0; i < len(ownDirs); i += 2 {
				b = strings.Replace(b, ownDirs[i], ownDirs[i+1], 1)
			}
			return src + b
		}, nil},
		{"a root inside another partner's directory", func(t *testing.T) string {
			return withPartner(t, "- id: acme", "- id: beta", "root: /drop ", "root: /drop/archive/beta ")
		}, []string{"partners[1] (id beta).dirs.incoming", `"/drop/archive/beta/incoming" on site`, "overlaps partners[0] (id acme).dirs.archive"}},
		{"another login on the same host and root is another site", func(t *testing.T) string {
			return withPartner(t, "- id: acme", "- id: beta", "user: intake", "user: intake-beta")
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src(t)))
			if len(tt.wantAll) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("got no error")
			}
			for _, w := range tt.wantAll {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

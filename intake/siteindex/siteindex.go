// Package siteindex indexes the partners' sites as their servers
// resolve them, so that the sites overlapping one (the same server and
// account, roots equal or nested: partners.SiteOverlaps) are found by a
// look-up per directory of its root.
package siteindex

import (
	"path"
	"slices"
	"sync"

	"github.com/partner-intake/partner-intake/partners"
)

// Index is every partner's site as first dialled, indexed so that the
// sites overlapping one (partners.SiteOverlaps: the same server and
// account, roots equal or nested) are found by a look-up per directory of
// its root, not by comparing it with every other site: each poll asks
// (shared), and a fleet of 1,000 partners on one account polled every
// 30 s made that a million comparisons a cycle, a third of an idle
// daemon's CPU (docs/performance.md). A partner removed by a reload keeps
// its entry; shared asks whether one found is still configured.
type Index struct {
	mu sync.Mutex
	// by site account (host key and user): the partners whose root is a
	// directory, and those whose root lies under a directory
	at, under map[string]map[string][]string
	byID      map[string]partners.Site
}

// Put records id's site (again: a partner's site is put once per
// configuration of it, and a changed one replaces the old).
func (x *Index) Put(id string, s partners.Site) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byID == nil {
		x.byID, x.at, x.under = map[string]partners.Site{}, map[string]map[string][]string{}, map[string]map[string][]string{}
	}
	if old, ok := x.byID[id]; ok {
		if old == s {
			return
		}
		acct := siteAccount(old)
		x.at[acct][old.Root] = slices.DeleteFunc(x.at[acct][old.Root], func(v string) bool { return v == id })
		for _, dir := range ancestors(old.Root) {
			x.under[acct][dir] = slices.DeleteFunc(x.under[acct][dir], func(v string) bool { return v == id })
		}
	}
	x.byID[id] = s
	acct := siteAccount(s)
	if x.at[acct] == nil {
		x.at[acct], x.under[acct] = map[string][]string{}, map[string][]string{}
	}
	x.at[acct][s.Root] = append(x.at[acct][s.Root], id)
	for _, dir := range ancestors(s.Root) {
		x.under[acct][dir] = append(x.under[acct][dir], id)
	}
}

// Overlapping lists, sorted, the partners other than id whose site
// overlaps s: the same root, a root above it, or one under it.
func (x *Index) Overlapping(id string, s partners.Site) []string {
	if s.HostKey == "" {
		return nil // as partners.SiteOverlaps: a site without its server's key overlaps none
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	acct := siteAccount(s)
	var out []string
	add := func(ids []string) {
		for _, v := range ids {
			if v != id && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	add(x.at[acct][s.Root])
	for _, dir := range ancestors(s.Root) {
		add(x.at[acct][dir])
	}
	add(x.under[acct][s.Root])
	slices.Sort(out)
	return out
}

// siteAccount is a site's server and account, what overlapping sites
// share.
func siteAccount(s partners.Site) string { return s.HostKey + "\x00" + s.User }

// ancestors are the directories above a cleaned root, nearest first, "/"
// last ("/a/b": "/a", "/"); none for "/". As partners.SiteOverlaps has it,
// "/" is above every other root, a relative one too ("a/b": "a", "/"),
// and "." is above none.
func ancestors(root string) []string {
	var out []string
	for root != "/" {
		if root = path.Dir(root); root == "." {
			root = "/"
		}
		out = append(out, root)
	}
	return out
}

package partners

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/partner-intake/partner-intake/internal/names"
)

// NotifyEvents are the events a webhook may subscribe to (intake/ledger
// outbox.go writes them; docs/design.md "Notifications" says what each
// carries). awaiting_approval is written when a file's plan starts to wait
// for an ops decision (a feed's approval policy), again after a re-plan.
var NotifyEvents = []string{"quarantined", "failed", "rejected_rows", "late", "host_key_mismatch", "awaiting_approval"}

// Notify is one webhook: events of the subscribed kinds are POSTed to URL,
// signed with the secret held by each environment variable it names.
//
// A delivery in the database names its webhook by ID only: the URL and
// the secrets are taken from the config in force when it is sent, never
// from the database.
type Notify struct {
	// ID names the webhook in the deliveries recorded for it (and in
	// `intake notify dead`). Optional: without it the webhook's id is
	// DerivedNotifyID(URL), which changes when the URL does; set it to
	// keep a webhook's pending and dead deliveries across a URL change.
	ID string `yaml:"id"`
	// URL is an https URL without credentials; http only to a loopback
	// host (localhost, 127.0.0.0/8, ::1).
	URL string `yaml:"url"`
	// SecretEnv names the environment variable holding the HMAC secret;
	// the secret never appears in the config.
	SecretEnv string `yaml:"secret_env"`
	// SecretEnvs name further secrets, for a rotation: every request
	// carries one signature per secret (SecretEnv's first), so a receiver
	// holding either the old or the new secret verifies it.
	SecretEnvs []string `yaml:"secret_envs"`
	// Events are the kinds delivered to URL (NotifyEvents).
	Events []string `yaml:"events"`
}

// derivedIDPrefix starts every derived id; an explicit id may not.
const derivedIDPrefix = "url-"

// DerivedNotifyID is the id of a webhook configured without one: "url-"
// and the first 16 hex digits of the URL's sha256 (migration 013 backfills
// the deliveries recorded before ids existed with the same function).
func DerivedNotifyID(rawURL string) string {
	sum := sha256.Sum256([]byte(rawURL))
	return derivedIDPrefix + hex.EncodeToString(sum[:8])
}

// EndpointID is the webhook's id: ID, or DerivedNotifyID(URL).
func (n Notify) EndpointID() string {
	if n.ID != "" {
		return n.ID
	}
	return DerivedNotifyID(n.URL)
}

// Secrets are the names of the environment variables whose secrets sign
// the webhook's requests, SecretEnv first.
func (n Notify) Secrets() []string {
	return append([]string{n.SecretEnv}, n.SecretEnvs...)
}

// LookupNotify is the webhook a delivery naming id goes to, among lists
// in order: the first whose id is id, else the first whose URL id would
// derive (a delivery recorded before its webhook was given an id).
func LookupNotify(id string, lists ...[]Notify) (Notify, bool) {
	for _, list := range lists {
		for _, n := range list {
			if n.EndpointID() == id {
				return n, true
			}
		}
	}
	for _, list := range lists {
		for _, n := range list {
			if DerivedNotifyID(n.URL) == id {
				return n, true
			}
		}
	}
	return Notify{}, false
}

// LoopbackHost reports whether host (a URL's hostname) is localhost or a
// loopback address (127.0.0.0/8, ::1): the only hosts a webhook may reach
// over plain http.
func LoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ValidateNotify checks a list of webhooks, naming the key.
func ValidateNotify(key string, ns []Notify) error {
	seen := map[string]bool{}
	ids := map[string]bool{}
	for i, n := range ns {
		k := fmt.Sprintf("%s[%d]", key, i)
		u, err := url.Parse(n.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return fmt.Errorf("%s.url: must be an https URL without credentials", k)
		}
		if u.Scheme == "http" && !LoopbackHost(u.Hostname()) {
			return fmt.Errorf("%s.url: must use https: plain http is accepted only to localhost, 127.0.0.0/8 or ::1, not to %q", k, u.Hostname())
		}
		if seen[n.URL] {
			return fmt.Errorf("%s.url: appears twice in %s", k, key)
		}
		seen[n.URL] = true
		if n.ID != "" && (!names.PartnerID(n.ID) || strings.HasPrefix(n.ID, derivedIDPrefix)) {
			return fmt.Errorf("%s.id: %q must match %s and not start with %q (ids starting so are derived from a URL)", k, n.ID, names.PartnerIDRule, derivedIDPrefix)
		}
		if ids[n.EndpointID()] {
			return fmt.Errorf("%s.id: %q appears twice in %s", k, n.EndpointID(), key)
		}
		ids[n.EndpointID()] = true
		if !names.EnvName(n.SecretEnv) {
			return fmt.Errorf("%s.secret_env: required, the name of an environment variable holding the signing secret", k)
		}
		for j, e := range n.SecretEnvs {
			if !names.EnvName(e) {
				return fmt.Errorf("%s.secret_envs[%d]: must be the name of an environment variable holding a signing secret", k, j)
			}
			if slices.Contains(n.Secrets()[:j+1], e) {
				return fmt.Errorf("%s.secret_envs[%d]: %s is named twice", k, j, e)
			}
		}
		if len(n.Events) == 0 {
			return fmt.Errorf("%s.events: at least one of %v", k, NotifyEvents)
		}
		for j, e := range n.Events {
			if !slices.Contains(NotifyEvents, e) {
				return fmt.Errorf("%s.events[%d]: %q is not one of %v", k, j, e, NotifyEvents)
			}
			if slices.Contains(n.Events[:j], e) {
				return fmt.Errorf("%s.events[%d]: %q appears twice", k, j, e)
			}
		}
	}
	return nil
}

// ValidateNotifyIDs checks that no partner's webhook shares its id with
// a global webhook of another URL: a delivery names its webhook by id
// among the global ones and its partner's.
func ValidateNotifyIDs(global []Notify, parts []Config) error {
	byID := map[string]string{}
	for _, n := range global {
		byID[n.EndpointID()] = n.URL
	}
	for _, p := range parts {
		for i, n := range p.Notify {
			if u, ok := byID[n.EndpointID()]; ok && u != n.URL {
				return fmt.Errorf("partner %s: notify[%d].id: %q is the id of a global webhook with another URL", p.ID, i, n.EndpointID())
			}
		}
	}
	return nil
}

// Wants reports whether the webhook subscribes to event.
func (n Notify) Wants(event string) bool { return slices.Contains(n.Events, event) }

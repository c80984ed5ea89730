package partners

import (
	"fmt"
	"net/url"
	"slices"

	"github.com/partner-intake/partner-intake/internal/names"
)

// NotifyEvents are the events a webhook may subscribe to (intake/ledger
// outbox.go writes them; docs/design.md "Notifications" says what each
// carries). awaiting_approval is written when a file's plan starts to wait
// for an ops decision (a feed's approval policy), again after a re-plan.
var NotifyEvents = []string{"quarantined", "failed", "rejected_rows", "late", "host_key_mismatch", "awaiting_approval"}

// Notify is one webhook: events of the subscribed kinds are POSTed to URL,
// signed with the secret held by the environment variable SecretEnv.
type Notify struct {
	// URL is an http or https URL without credentials; use https unless
	// the receiver is local (http is accepted, not checked for that).
	URL string `yaml:"url"`
	// SecretEnv names the environment variable holding the HMAC secret;
	// the secret never appears in the config.
	SecretEnv string `yaml:"secret_env"`
	// Events are the kinds delivered to URL (NotifyEvents).
	Events []string `yaml:"events"`
}

// ValidateNotify checks a list of webhooks, naming the key.
func ValidateNotify(key string, ns []Notify) error {
	seen := map[string]bool{}
	for i, n := range ns {
		k := fmt.Sprintf("%s[%d]", key, i)
		u, err := url.Parse(n.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return fmt.Errorf("%s.url: must be an http or https URL without credentials", k)
		}
		if seen[n.URL] {
			return fmt.Errorf("%s.url: appears twice in %s", k, key)
		}
		seen[n.URL] = true
		if !names.EnvName(n.SecretEnv) {
			return fmt.Errorf("%s.secret_env: required, the name of an environment variable holding the signing secret", k)
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

// Wants reports whether the webhook subscribes to event.
func (n Notify) Wants(event string) bool { return slices.Contains(n.Events, event) }

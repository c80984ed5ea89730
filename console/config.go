// Package console is the review console `intake run` serves on a listener
// of its own when the config enables it: server-rendered pages of the held
// files, the plans waiting for approval, one file's story and the audit
// log, and the decisions on them as HTML forms, each through the same
// intake/ops functions the CLI calls. Every page needs a signed-in
// identity (OpenID Connect, or a header set by a trusted authenticating
// proxy) with a role: a viewer sees states and counts, a reviewer also
// sees values and decides.
package console

import (
	"fmt"
	"net/netip"
	"net/url"
	"os"
)

// Roles.
const (
	RoleViewer   = "viewer"
	RoleReviewer = "reviewer"
)

// Config is the console: block of the config file.
type Config struct {
	// Listen is host:port of the console's own listener; "" leaves the
	// console off.
	Listen string `yaml:"listen"`
	// BaseURL is the console's address as browsers reach it (the OpenID
	// redirect is BaseURL/auth/callback). Cookies are Secure unless it is
	// http://localhost or http://127.0.0.1 (tests).
	BaseURL string `yaml:"base_url"`
	Auth    Auth   `yaml:"auth"`
}

// Auth says how a browser signs in and which role an identity gets.
type Auth struct {
	// OIDC: sign in at an OpenID Connect provider (authorization code
	// with PKCE).
	OIDC *OIDC `yaml:"oidc"`
	// Proxy: an authenticating proxy in front of the console names the
	// user in a header; only requests from its addresses are believed.
	Proxy *Proxy `yaml:"proxy"`
	// Reviewers and Viewers name identities (the OIDC email, else
	// subject; the proxy's header) and their role; a role from the
	// provider's RolesClaim comes first.
	Reviewers []string `yaml:"reviewers"`
	Viewers   []string `yaml:"viewers"`
	// SessionKeyEnv names an environment variable holding the key (at
	// least 32 bytes) that signs session cookies; unset, a random key per
	// process (sessions end when intake restarts).
	SessionKeyEnv string `yaml:"session_key_env"`
}

// OIDC is the OpenID Connect provider.
type OIDC struct {
	Issuer   string `yaml:"issuer"`
	ClientID string `yaml:"client_id"`
	// ClientSecretEnv names the environment variable holding the client
	// secret ("" for a public client: PKCE alone).
	ClientSecretEnv string `yaml:"client_secret_env"`
	// RolesClaim names a claim (a string or a list of strings) whose
	// "reviewer" or "viewer" gives the role.
	RolesClaim string `yaml:"roles_claim"`
}

// Proxy is a trusted authenticating proxy.
type Proxy struct {
	// Header carries the signed-in user (e.g. X-Forwarded-User).
	Header string `yaml:"header"`
	// From are the proxy's addresses or prefixes (10.0.0.5, 10.0.0.0/24).
	From []string `yaml:"from"`
}

// Enabled: the console is configured.
func (c Config) Enabled() bool { return c.Listen != "" }

// Validate checks an enabled console's config; the error names the key.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("console.base_url: %q must be an http(s) URL (e.g. https://intake.example.com)", c.BaseURL)
	}
	if u.Scheme == "http" && !localURL(u) {
		return fmt.Errorf("console.base_url: %q must be https (http only for localhost)", c.BaseURL)
	}
	a := c.Auth
	if (a.OIDC == nil) == (a.Proxy == nil) {
		return fmt.Errorf("console.auth: exactly one of oidc or proxy is required")
	}
	if o := a.OIDC; o != nil {
		if o.Issuer == "" || o.ClientID == "" {
			return fmt.Errorf("console.auth.oidc: issuer and client_id are required")
		}
		if o.ClientSecretEnv != "" && os.Getenv(o.ClientSecretEnv) == "" {
			return fmt.Errorf("console.auth.oidc.client_secret_env: %s is not set", o.ClientSecretEnv)
		}
	}
	if p := a.Proxy; p != nil {
		if p.Header == "" || len(p.From) == 0 {
			return fmt.Errorf("console.auth.proxy: header and from are required")
		}
		if _, err := prefixes(p.From); err != nil {
			return fmt.Errorf("console.auth.proxy.from: %w", err)
		}
	}
	if a.SessionKeyEnv != "" && len(os.Getenv(a.SessionKeyEnv)) < 32 {
		return fmt.Errorf("console.auth.session_key_env: %s must hold at least 32 bytes", a.SessionKeyEnv)
	}
	return nil
}

func localURL(u *url.URL) bool {
	h := u.Hostname()
	return u.Scheme == "http" && (h == "localhost" || h == "127.0.0.1" || h == "::1")
}

func prefixes(from []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range from {
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an address nor a prefix", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// Cookie names and lifetimes.
const (
	sessionCookie = "intake_console"
	loginCookie   = "intake_console_login"
	sessionTTL    = 8 * time.Hour
	loginTTL      = 10 * time.Minute
)

// Identity is a signed-in user: who and with which role. CSRF is the
// token every form of theirs carries.
type Identity struct {
	Name string    `json:"n"`
	Role string    `json:"-"` // judged at each request (authn.role)
	Exp  time.Time `json:"e"`
	CSRF string    `json:"c"`
	// Claimed: the roles the OpenID provider's roles claim gave at
	// sign-in
	Claimed []string `json:"cl,omitempty"`
}

// Reviewer: the identity sees values and decides.
func (i *Identity) Reviewer() bool { return i.Role == RoleReviewer }

// authn signs browsers in and reads who they are.
type authn struct {
	cfg     Auth
	key     []byte
	secure  bool
	base    *url.URL
	proxies []netip.Prefix

	redirect string
	// client is the OpenID provider's, nil until its discovery document
	// has been read (New tries once, Start keeps trying in the background)
	client atomic.Pointer[oidcClient]
}

// oidcClient is what discovery gives: the endpoints and the ID token
// verifier.
type oidcClient struct {
	verifier *oidc.IDTokenVerifier
	oauth    *oauth2.Config
}

// errSignInDown: OpenID sign-in is configured but the provider's
// discovery has not been read yet.
var errSignInDown = errors.New("sign-in unavailable: the OpenID provider has not answered yet")

// discoveryTimeout bounds one discovery attempt (and each later JWKS
// fetch of the provider's keys).
const discoveryTimeout = 10 * time.Second

// discover reads the provider's discovery document once and, when it
// answers, makes sign-in available. ctx is kept by the provider's key
// set: the console's lifetime, not one attempt's.
func (a *authn) discover(ctx context.Context) error {
	o := a.cfg.OIDC
	ctx = oidc.ClientContext(ctx, &http.Client{Timeout: discoveryTimeout})
	provider, err := oidc.NewProvider(ctx, o.Issuer)
	if err != nil {
		return fmt.Errorf("console.auth.oidc.issuer %s: %w", o.Issuer, err)
	}
	secret := ""
	if o.ClientSecretEnv != "" {
		secret = os.Getenv(o.ClientSecretEnv)
	}
	a.client.Store(&oidcClient{
		verifier: provider.Verifier(&oidc.Config{ClientID: o.ClientID}),
		oauth: &oauth2.Config{
			ClientID: o.ClientID, ClientSecret: secret, Endpoint: provider.Endpoint(),
			RedirectURL: a.redirect,
			Scopes:      []string{oidc.ScopeOpenID, "email", "profile"},
		},
	})
	return nil
}

// Discovery retries: the first after discoveryRetryMin, each wait
// doubled up to discoveryRetryMax.
var (
	discoveryRetryMin = 250 * time.Millisecond
	discoveryRetryMax = time.Minute
)

// rediscover retries discovery with capped exponential backoff until it
// succeeds or ctx ends.
func (a *authn) rediscover(ctx context.Context, log *slog.Logger) {
	wait := discoveryRetryMin
	for a.client.Load() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if err := a.discover(ctx); err != nil {
			log.Warn("console sign-in unavailable, retrying", "err", err, "retry_in", min(2*wait, discoveryRetryMax))
			wait = min(2*wait, discoveryRetryMax)
			continue
		}
		log.Info("console sign-in available", "issuer", a.cfg.OIDC.Issuer)
	}
}

func newAuthn(ctx context.Context, c Config, log *slog.Logger) (*authn, error) {
	base, err := url.Parse(c.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("console.base_url: %w", err)
	}
	a := &authn{cfg: c.Auth, base: base, secure: !localURL(base)}
	if c.Auth.SessionKeyEnv != "" {
		a.key = []byte(os.Getenv(c.Auth.SessionKeyEnv))
	} else {
		a.key = make([]byte, 32)
		if _, err := rand.Read(a.key); err != nil {
			return nil, err
		}
	}
	if p := c.Auth.Proxy; p != nil {
		if a.proxies, err = prefixes(p.From); err != nil {
			return nil, fmt.Errorf("console.auth.proxy.from: %w", err)
		}
	}
	if c.Auth.OIDC != nil {
		a.redirect = strings.TrimSuffix(c.BaseURL, "/") + "/auth/callback"
		// a provider that does not answer yet does not stop the console:
		// sign-in answers 503 until a retry reads its discovery
		if err := a.discover(ctx); err != nil {
			log.Warn("console sign-in unavailable, retrying", "err", err)
		}
	}
	return a, nil
}

// sign and open: a cookie value is base64(JSON) "." base64(HMAC-SHA256).
func (a *authn) sign(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, a.key)
	m.Write(b)
	return base64.RawURLEncoding.EncodeToString(b) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

func (a *authn) open(s string, v any) bool {
	body, mac, ok := strings.Cut(s, ".")
	if !ok {
		return false
	}
	// strict: one encoding per value, no ignored padding bits
	b, err1 := base64.RawURLEncoding.Strict().DecodeString(body)
	got, err2 := base64.RawURLEncoding.Strict().DecodeString(mac)
	if err1 != nil || err2 != nil {
		return false
	}
	m := hmac.New(sha256.New, a.key)
	m.Write(b)
	return hmac.Equal(got, m.Sum(nil)) && json.Unmarshal(b, v) == nil
}

func (a *authn) setCookie(w http.ResponseWriter, name, value string, ttl time.Duration) {
	a.setCookieSite(w, name, value, ttl, http.SameSiteStrictMode)
}

func (a *authn) setCookieSite(w http.ResponseWriter, name, value string, ttl time.Duration, site http.SameSite) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: int(ttl.Seconds()),
		HttpOnly: true, Secure: a.secure, SameSite: site})
}

func (a *authn) clearCookie(w http.ResponseWriter, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: a.secure, SameSite: http.SameSiteStrictMode})
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// roleLists are the config's reviewers and viewers.
type roleLists struct{ reviewers, viewers []string }

// rolesOf is auth's reviewers and viewers.
func rolesOf(auth Auth) roleLists {
	return roleLists{reviewers: slices.Clone(auth.Reviewers), viewers: slices.Clone(auth.Viewers)}
}

// role is the role of name: the provider's claim first, then the lists
// in force (l); "" when it has none (refused).
func (l *roleLists) role(name string, claimed []string) string {
	switch {
	case slices.Contains(claimed, RoleReviewer):
		return RoleReviewer
	case slices.Contains(claimed, RoleViewer):
		return RoleViewer
	case slices.Contains(l.reviewers, name):
		return RoleReviewer
	case slices.Contains(l.viewers, name):
		return RoleViewer
	}
	return ""
}

// fromProxy: the request came from a configured proxy address.
func (a *authn) fromProxy(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	for _, p := range a.proxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// errNoRole: the identity is signed in but has no role here.
var errNoRole = errors.New("no console role")

// identify returns the request's identity, its role by the lists in
// force (roles): the trusted proxy's header, or a valid session cookie;
// nil when there is none, or the cookie's name has no role now (it signs
// in again: the provider's roles claim may give it one).
func (a *authn) identify(r *http.Request, roles *roleLists) (*Identity, error) {
	if p := a.cfg.Proxy; p != nil {
		name := r.Header.Get(p.Header)
		if name == "" || !a.fromProxy(r) {
			return nil, nil // a header from anyone else is not believed
		}
		role := roles.role(name, nil)
		if role == "" {
			return nil, errNoRole
		}
		// the proxy signs every request in: the CSRF token is bound to
		// the user by the session key
		m := hmac.New(sha256.New, a.key)
		m.Write([]byte("csrf\x00" + name))
		return &Identity{Name: name, Role: role, CSRF: base64.RawURLEncoding.EncodeToString(m.Sum(nil))}, nil
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, nil
	}
	var id Identity
	if !a.open(c.Value, &id) || time.Now().After(id.Exp) {
		return nil, nil
	}
	// the role as the lists say now: a reload that takes a name off
	// them ends its sessions' role at their next request
	if id.Role = roles.role(id.Name, id.Claimed); id.Role == "" {
		return nil, nil
	}
	return &id, nil
}

// loginState is what the browser carries between /auth/login and the
// provider's redirect back: the state, nonce and PKCE verifier, signed.
type loginState struct {
	State, Nonce, Verifier, Next string
	Exp                          time.Time
}

// localNext is where the browser goes once signed in: next when it is a
// path of this console, else "/". A browser strips tabs and line breaks
// from a URL and reads a backslash as a slash, so "/\t/evil.example" would
// leave the console: next is refused when it holds any of them, a space
// or another control byte, or starts with two slashes.
func localNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c == 0x7f || c == '\\' {
			return "/"
		}
	}
	return next
}

// login starts the authorization code flow with PKCE.
func (a *authn) login(w http.ResponseWriter, r *http.Request, oc *oidcClient) {
	next := localNext(r.URL.Query().Get("next"))
	st := loginState{State: randomToken(), Nonce: randomToken(), Verifier: oauth2.GenerateVerifier(), Next: next, Exp: time.Now().Add(loginTTL)}
	v, err := a.sign(st)
	if err != nil {
		http.Error(w, "sign-in failed", http.StatusInternalServerError)
		return
	}
	// Lax, not Strict: the provider's redirect back is a cross-site
	// navigation, on which a browser sends no Strict cookie. It holds
	// no session, only this sign-in's state, nonce and verifier.
	a.setCookieSite(w, loginCookie, v, loginTTL, http.SameSiteLaxMode)
	http.Redirect(w, r, oc.oauth.AuthCodeURL(st.State, oidc.Nonce(st.Nonce), oauth2.S256ChallengeOption(st.Verifier)), http.StatusFound)
}

// callback ends the flow: the code exchanged with the verifier, the ID
// token verified (signature, issuer, audience, expiry, nonce), a session
// cookie set.
func (a *authn) callback(w http.ResponseWriter, r *http.Request, roles *roleLists) (string, error) {
	if a.cfg.OIDC == nil {
		return "", errors.New("no OpenID provider configured")
	}
	oc := a.client.Load()
	if oc == nil {
		return "", errSignInDown
	}
	c, err := r.Cookie(loginCookie)
	if err != nil {
		return "", errors.New("no sign-in under way")
	}
	a.clearCookie(w, loginCookie)
	var st loginState
	if !a.open(c.Value, &st) || time.Now().After(st.Exp) {
		return "", errors.New("sign-in expired")
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		return "", fmt.Errorf("the provider refused: %s", e)
	}
	if !hmac.Equal([]byte(q.Get("state")), []byte(st.State)) {
		return "", errors.New("state mismatch")
	}
	tok, err := oc.oauth.Exchange(r.Context(), q.Get("code"), oauth2.VerifierOption(st.Verifier))
	if err != nil {
		return "", fmt.Errorf("code exchange: %w", err)
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok {
		return "", errors.New("no id_token in the token response")
	}
	idt, err := oc.verifier.Verify(r.Context(), raw)
	if err != nil {
		return "", fmt.Errorf("id token: %w", err)
	}
	if !hmac.Equal([]byte(idt.Nonce), []byte(st.Nonce)) {
		return "", errors.New("nonce mismatch")
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return "", fmt.Errorf("id token claims: %w", err)
	}
	name, _ := claims["email"].(string)
	if name == "" {
		name = idt.Subject
	}
	var claimed []string
	if rc := a.cfg.OIDC.RolesClaim; rc != "" {
		switch v := claims[rc].(type) {
		case string:
			claimed = []string{v}
		case []any:
			for _, e := range v {
				if s, ok := e.(string); ok {
					claimed = append(claimed, s)
				}
			}
		}
	}
	// the session keeps the claim's roles, the lists are read at each
	// request
	claimed = slices.DeleteFunc(claimed, func(c string) bool { return c != RoleReviewer && c != RoleViewer })
	if roles.role(name, claimed) == "" {
		return "", errNoRole
	}
	sess, err := a.sign(Identity{Name: name, Exp: time.Now().Add(sessionTTL), CSRF: randomToken(), Claimed: claimed})
	if err != nil {
		return "", err
	}
	a.setCookie(w, sessionCookie, sess, sessionTTL)
	return st.Next, nil
}

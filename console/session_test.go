package console_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// oidcConsole is a console at https://intake.test signing in with a
// provider of its own, where email is a viewer.
func oidcConsole(t *testing.T, email string) (*console.Server, *provider) {
	t.Helper()
	_, pool := testenv.DB(t)
	idp := newProvider(t, "intake-console", email)
	s, err := console.New(context.Background(), console.Config{
		Listen: "127.0.0.1:0", BaseURL: "https://intake.test",
		Auth: console.Auth{OIDC: &console.OIDC{Issuer: idp.srv.URL, ClientID: "intake-console"}, Viewers: []string{email}},
	}, console.Deps{Pool: pool, Scope: console.Scope{Partners: []string{"acme"}}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s, idp
}

// Through the OpenID flow (no browser): an unsigned page sends the
// browser to sign in; the sign-in's cookie is Lax, the session cookie
// HttpOnly, Secure and SameSite=Strict on an https console; the session
// opens pages; a session cookie changed by one character, or a callback
// whose state is not the sign-in's, is refused.
func TestSessionCookieIsStrictSecureAndSigned(t *testing.T) {
	const email = "sam@example.com"
	s, idp := oidcConsole(t, email)
	h := s.Handler()
	get := func(target string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", target, nil)
		for _, c := range cookies {
			r.AddCookie(c)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	cookie := func(w *httptest.ResponseRecorder, name string) *http.Cookie {
		for _, c := range w.Result().Cookies() {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no cookie %s in %v", name, w.Header()["Set-Cookie"])
		return nil
	}

	w := get("/held")
	if w.Code != http.StatusFound || !strings.HasPrefix(w.Header().Get("Location"), "/auth/login") {
		t.Fatalf("unsigned page: got %d to %q, want a redirect to sign in", w.Code, w.Header().Get("Location"))
	}
	w = get(w.Header().Get("Location"))
	login := cookie(w, "intake_console_login")
	if login.SameSite != http.SameSiteLaxMode || !login.HttpOnly || !login.Secure {
		t.Errorf("sign-in cookie: %+v", login)
	}
	authorize := w.Header().Get("Location")
	if !strings.HasPrefix(authorize, idp.srv.URL+"/authorize") || !strings.Contains(authorize, "code_challenge_method=S256") {
		t.Fatalf("sign-in goes to %q", authorize)
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(authorize)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	back, _ := url.Parse(resp.Header.Get("Location"))
	if back.Host != "intake.test" || back.Path != "/auth/callback" {
		t.Fatalf("the provider sends the browser to %q", back)
	}

	forged := *back
	q := forged.Query()
	q.Set("state", "not-the-state")
	forged.RawQuery = q.Encode()
	if w := get(forged.RequestURI(), login); w.Code != http.StatusForbidden {
		t.Errorf("callback with another state: got %d, want 403", w.Code)
	}

	w = get(back.RequestURI(), login)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `http-equiv="refresh"`) {
		t.Fatalf("callback: got %d\n%s", w.Code, w.Body.String())
	}
	sess := cookie(w, "intake_console")
	if sess.SameSite != http.SameSiteStrictMode || !sess.HttpOnly || !sess.Secure || sess.Path != "/" {
		t.Errorf("session cookie: %+v", sess)
	}
	if w := get("/held", sess); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), email) {
		t.Errorf("page with the session: got %d", w.Code)
	}
	// a reload that takes the viewer off the lists ends the session's
	// role at its next request (the role is not in the cookie): it is
	// sent to sign in again
	s.Reload(console.Auth{}, console.Scope{Partners: []string{"acme"}})
	if w := get("/held", sess); w.Code != http.StatusFound || !strings.HasPrefix(w.Header().Get("Location"), "/auth/login") {
		t.Errorf("page with the session of a viewer taken off the lists: got %d to %q, want a redirect to sign in", w.Code, w.Header().Get("Location"))
	}
	s.Reload(console.Auth{Viewers: []string{email}}, console.Scope{Partners: []string{"acme"}})
	if w := get("/held", sess); w.Code != http.StatusOK {
		t.Errorf("page with the session once the viewer is back: got %d, want 200", w.Code)
	}
	bad := *sess
	// the signed body's first character: '{' encodes to "e"
	bad.Value = "f" + bad.Value[1:]
	if w := get("/held", &bad); w.Code != http.StatusFound {
		t.Errorf("page with a changed session cookie: got %d, want a redirect to sign in", w.Code)
	}
}

// The console starts while its OpenID provider does not answer: sign-in
// answers 503 with a page saying it is retried, and once the provider
// is up (started after the console) a background retry of its
// discovery makes sign-in work without a restart.
func TestStartsWhileTheProviderIsDownAndSignsInOnceItIsUp(t *testing.T) {
	_, pool := testenv.DB(t)
	// the provider's address, free until it starts
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	const email = "sam@example.com"
	s, err := console.New(context.Background(), console.Config{
		Listen: "127.0.0.1:0", BaseURL: "http://127.0.0.1",
		Auth: console.Auth{OIDC: &console.OIDC{Issuer: "http://" + addr, ClientID: "intake-console"}, Viewers: []string{email}},
	}, console.Deps{Pool: pool, Scope: console.Scope{Partners: []string{"acme"}}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("the console must start while its provider is down: %v", err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	noFollow := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	login := func() (int, string, string) {
		resp, err := noFollow.Get("http://" + s.Addr() + "/auth/login?next=/held")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}
	code, _, body := login()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "Sign-in unavailable, retrying") {
		t.Fatalf("sign-in while the provider is down: got %d\n%s", code, body)
	}
	// a page still sends the browser to sign in, which says the same
	resp, err := noFollow.Get("http://" + s.Addr() + "/held")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("unsigned page while the provider is down: got %d, want a redirect to sign in", resp.StatusCode)
	}

	idp := newProviderUnstarted(t, "intake-console", email)
	idp.srv.Listener.Close()
	if idp.srv.Listener, err = net.Listen("tcp", addr); err != nil {
		t.Fatal(err)
	}
	idp.srv.Start()
	var loc string
	testenv.WaitFor(t, 30*time.Second, func() bool {
		code, loc, _ = login()
		return code == http.StatusFound
	}, func() string { return "sign-in still answers " + strconv.Itoa(code) })
	if !strings.HasPrefix(loc, idp.srv.URL+"/authorize") || !strings.Contains(loc, "code_challenge_method=S256") {
		t.Fatalf("sign-in goes to %q", loc)
	}
}

// Sign-in returns the browser only to a path of the console: a next that
// a browser would read as another site once it strips tabs and line
// breaks, or reads a backslash as a slash, goes to "/" instead.
func TestSignInReturnsOnlyToAPathOfTheConsole(t *testing.T) {
	s, _ := oidcConsole(t, "sam@example.com")
	h := s.Handler()
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// the page the callback shows after a sign-in that began at next
	signedIn := func(next string) string {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/auth/login?next="+url.QueryEscape(next), nil))
		resp, err := noFollow.Get(w.Header().Get("Location"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		back, _ := url.Parse(resp.Header.Get("Location"))
		r := httptest.NewRequest("GET", back.RequestURI(), nil)
		for _, c := range w.Result().Cookies() {
			r.AddCookie(c)
		}
		cb := httptest.NewRecorder()
		h.ServeHTTP(cb, r)
		if cb.Code != http.StatusOK {
			t.Fatalf("callback after next %q: got %d", next, cb.Code)
		}
		return cb.Body.String()
	}
	if body := signedIn("/held?partner=acme"); !strings.Contains(body, `content="0;url=/held?partner=acme"`) {
		t.Fatalf("a path of the console is not where sign-in returns:\n%s", body)
	}
	for _, next := range []string{"/\t/evil.example", "/\n/evil.example", "/\\evil.example", "//evil.example", "https://evil.example", "/ /evil.example"} {
		if body := signedIn(next); !strings.Contains(body, `content="0;url=/"`) {
			t.Errorf("next %q: the signed-in page does not return to /:\n%s", next, body)
		}
	}
}

package console_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/syspkg"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// provider is a tiny OpenID Connect provider: discovery, JWKS, an
// authorize endpoint that signs its one user in at once, and a token
// endpoint that checks the PKCE verifier and returns an RS256 ID token.
type provider struct {
	t        *testing.T
	srv      *httptest.Server
	key      *rsa.PrivateKey
	clientID string
	email    string
	roles    []string // the roles claim of its ID tokens

	mu    sync.Mutex
	codes map[string]grant
	// pkce: every token request carried a verifier matching its challenge
	pkce int
}

type grant struct{ nonce, challenge, redirect string }

func newProvider(t *testing.T, clientID, email string) *provider {
	p := newProviderUnstarted(t, clientID, email)
	p.srv.Start()
	return p
}

// newProviderUnstarted is the provider before it listens: set
// p.srv.Listener to choose its address, then p.srv.Start().
func newProviderUnstarted(t *testing.T, clientID, email string) *provider {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{t: t, key: key, clientID: clientID, email: email, roles: []string{"reviewer"}, codes: map[string]grant{}}
	m := http.NewServeMux()
	m.HandleFunc("GET /.well-known/openid-configuration", p.discovery)
	m.HandleFunc("GET /jwks", p.jwks)
	m.HandleFunc("GET /authorize", p.authorize)
	m.HandleFunc("POST /token", p.token)
	p.srv = httptest.NewUnstartedServer(m)
	t.Cleanup(p.srv.Close)
	return p
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func (p *provider) discovery(w http.ResponseWriter, _ *http.Request) {
	u := p.srv.URL
	json.NewEncoder(w).Encode(map[string]any{
		"issuer": u, "authorization_endpoint": u + "/authorize", "token_endpoint": u + "/token", "jwks_uri": u + "/jwks",
		"response_types_supported": []string{"code"}, "subject_types_supported": []string{"public"},
		"id_token_signing_alg_values_supported": []string{"RS256"}, "code_challenge_methods_supported": []string{"S256"},
	})
}

func (p *provider) jwks(w http.ResponseWriter, _ *http.Request) {
	json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1",
		"n": b64(p.key.N.Bytes()), "e": b64(big.NewInt(int64(p.key.E)).Bytes()),
	}}})
}

func (p *provider) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("client_id") != p.clientID || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" {
		http.Error(w, "bad authorize request", http.StatusBadRequest)
		return
	}
	code := b64([]byte(time.Now().String()))
	p.mu.Lock()
	p.codes[code] = grant{nonce: q.Get("nonce"), challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri")}
	p.mu.Unlock()
	back, _ := url.Parse(q.Get("redirect_uri"))
	v := back.Query()
	v.Set("code", code)
	v.Set("state", q.Get("state"))
	back.RawQuery = v.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

func (p *provider) token(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	g, ok := p.codes[r.PostFormValue("code")]
	delete(p.codes, r.PostFormValue("code"))
	p.mu.Unlock()
	sum := sha256.Sum256([]byte(r.PostFormValue("code_verifier")))
	if !ok || b64(sum[:]) != g.challenge || r.PostFormValue("redirect_uri") != g.redirect {
		http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.pkce++
	p.mu.Unlock()
	now := time.Now()
	claims, _ := json.Marshal(map[string]any{
		"iss": p.srv.URL, "aud": p.clientID, "sub": "u-1", "email": p.email, "nonce": g.nonce,
		"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(), "roles": p.roles,
	})
	head, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "k1"})
	signing := b64(head) + "." + b64(claims)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, p.key, crypto.SHA256, digest[:])
	if err != nil {
		p.t.Error(err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 300, "id_token": signing + "." + b64(sig)})
}

// A reviewer signs in through OpenID Connect in headless Chromium,
// releases a held file, approves a waiting plan and replays an archived
// file with the forms on the pages, and opens the partners page from the
// navigation; the three audit rows name the signed-in user, and the token
// endpoint saw the PKCE verifier.
func TestBrowserSignInReleaseAndApprove(t *testing.T) {
	chromium, err := syspkg.Find([]string{"/usr/bin/chromium"}, "chromium")
	if err != nil {
		t.Fatal(err)
	}
	_, pool := testenv.DB(t)
	held := seedHeld(t, pool, "orders-1.csv")
	waiting := seedWaiting(t, pool)
	archived := seedArchived(t, pool)
	const email = "olivia@example.com"
	idp := newProvider(t, "intake-console", email)

	// the console's address is known before it is built: the redirect
	// URL the provider is given is under it
	ts := httptest.NewUnstartedServer(nil)
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	base := "http://localhost:" + port
	con, err := console.New(context.Background(), console.Config{
		Listen: "127.0.0.1:0", BaseURL: base,
		Auth: console.Auth{OIDC: &console.OIDC{Issuer: idp.srv.URL, ClientID: "intake-console", RolesClaim: "roles"}},
	}, console.Deps{Pool: pool, Scope: console.Scope{Partners: []string{"acme"}}, Worker: intake.OpsWorker("ops"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Replay: daemonReplay(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = con.Handler()
	ts.Start()
	t.Cleanup(ts.Close)

	ctx := headlessChromium(t, chromium)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	// shot captures the page; INTAKE_CONSOLE_SCREENSHOTS=dir keeps it
	// there (docs/console/ holds the ones docs/console.md shows)
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if len(png) < 8 || (string(png[1:4]) != "PNG" && string(png[:3]) != "\xff\xd8\xff") {
			t.Fatalf("screenshot %s is no image", name)
		}
		if dir := os.Getenv("INTAKE_CONSOLE_SCREENSHOTS"); dir != "" {
			if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps := func(what string, a ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, a...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	steps("sign in and open the held queue",
		chromedp.Navigate(base+"/held"),
		chromedp.WaitVisible(chromedp.CSS("#held")))
	me := text("#me")
	shot("held.png")
	steps("release the held file",
		chromedp.Click(chromedp.CSS(`a[href="/files/`+itoa(held)+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#release")))
	shot("file.png")
	steps("release it",
		chromedp.SendKeys(chromedp.CSS(`#release input[name="reason"]`), "checked in the browser"),
		chromedp.Submit(chromedp.CSS(`#release`)),
		chromedp.WaitVisible(chromedp.CSS("#done")))
	doneRelease := text("#done")
	steps("approve the waiting plan",
		chromedp.Navigate(base+"/plans/"+itoa(waiting)),
		chromedp.WaitVisible(chromedp.CSS("#approve")))
	shot("plan.png")
	steps("approve it",
		chromedp.SendKeys(chromedp.CSS(`#approve input[name="reason"]`), "plan reviewed"),
		chromedp.Submit(chromedp.CSS(`#approve`)),
		chromedp.WaitVisible(chromedp.CSS("#done")))
	doneApprove := text("#done")
	state := text("#state")
	steps("replay the archived file",
		chromedp.Navigate(base+"/files/"+itoa(archived)),
		chromedp.SendKeys(chromedp.CSS(`#replay input[name="reason"]`), "mapping fixed"),
		chromedp.Submit(chromedp.CSS(`#replay`)),
		chromedp.WaitVisible(chromedp.CSS("#done")))
	doneReplay := text("#done")
	steps("open the partners page from the navigation",
		chromedp.Click(chromedp.CSS(`nav a[href="/partners"]`)),
		chromedp.WaitVisible(chromedp.CSS("#partner-acme")))
	partnerState := text("#partner-acme .state")
	shot("partners.png")
	steps("open the audit log", chromedp.Navigate(base+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	shot("audit.png")
	if me != email {
		t.Errorf("signed in as %q, want %q", me, email)
	}
	idp.mu.Lock()
	pkce := idp.pkce
	idp.mu.Unlock()
	if pkce != 1 {
		t.Errorf("token requests with a matching PKCE verifier: got %d, want 1", pkce)
	}
	for _, c := range []struct {
		done   string
		id     int64
		action string
	}{{doneRelease, held, "release"}, {doneApprove, waiting, "approve"}, {doneReplay, 0, "replay"}} {
		request := strings.TrimSuffix(strings.TrimSpace(c.done[strings.LastIndex(c.done, " ")+1:]), ".")
		if c.id == 0 { // the replay's audit row is the replay's, a new intake
			c.id, _ = strconv.ParseInt(one(t, pool, `SELECT intake_id FROM file_intake WHERE replay_of = $1`, archived), 10, 64)
		}
		got := one(t, pool, `SELECT actor || ' ' || action || ' ' || intake_id FROM intake_audit WHERE request_id = $1`, request)
		if want := email + " " + c.action + " " + itoa(c.id); got != want {
			t.Errorf("audit of %s: got %q, want %q", request, got, want)
		}
	}
	if partnerState != "not polled yet" {
		t.Errorf("the partners page shows acme %q, want not polled yet", partnerState)
	}
	if !strings.HasPrefix(state, "spooled") {
		t.Errorf("approved file's state on its page: got %q, want spooled", state)
	}
}

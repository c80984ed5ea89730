package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	proxyAddr = "127.0.0.1:40000"
	reviewer  = "alice@example.com"
	reviewer2 = "bea@example.com"
	viewer    = "victor@example.com"
	// secret is a cell value of the seeded plan: no viewer may see it
	secret = "SECRET-VALUE-42"
)

// newConsole is a console behind a trusted proxy on 127.0.0.1; each of
// with changes its dependencies before it is built.
func newConsole(t *testing.T, pool *pgxpool.Pool, with ...func(*console.Deps)) http.Handler {
	t.Helper()
	return newServer(t, pool, with...).Handler()
}

// newServer is newConsole's server.
func newServer(t *testing.T, pool *pgxpool.Pool, with ...func(*console.Deps)) *console.Server {
	t.Helper()
	deps := console.Deps{Pool: pool, Scope: console.Scope{Partners: []string{"acme"}}, Worker: intake.OpsWorker("ops"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range with {
		f(&deps)
	}
	s, err := console.New(context.Background(), console.Config{
		Listen: "127.0.0.1:0", BaseURL: "http://localhost:8080",
		Auth: console.Auth{
			Proxy:     &console.Proxy{Header: "X-Forwarded-User", From: []string{"127.0.0.1"}},
			Reviewers: []string{reviewer, reviewer2}, Viewers: []string{viewer},
		},
	}, deps)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// do sends a request as user (no header when ""), from the proxy's address.
func do(t *testing.T, h http.Handler, user, method, target string, form url.Values) (int, http.Header, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, target, body)
	r.RemoteAddr = proxyAddr
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if user != "" {
		r.Header.Set("X-Forwarded-User", user)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Header(), w.Body.String()
}

var (
	csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	holdRe = regexp.MustCompile(`name="hold" value="([^"]+)"`)
)

// holdOn is the hold a file page's decision forms name.
func holdOn(t *testing.T, page string) string {
	t.Helper()
	m := holdRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no hold on the page's forms:\n%s", page)
	}
	return m[1]
}

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

// seedHeld records a file held for reject_rate, as the pipeline leaves one.
func seedHeld(t *testing.T, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, reason,
		    worker_id, lease_until, content_sha256) VALUES ('acme', 'orders', $1, 'quarantine/'||$1, 10, 'quarantined', 'reject_rate',
		    'w1', pg_catalog.now(), 'ab12') RETURNING intake_id`, name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO intake_quarantine (intake_id, partner_id, reason, content_sha256, path)
		VALUES ($1, 'acme', 'reject_rate', 'ab12', 'quarantine/'||$2)`, id, name); err != nil {
		t.Fatal(err)
	}
	return id
}

// seedWaiting records a file awaiting approval of plan hash "h1" with a
// change: one update carrying secret.
func seedWaiting(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		    state, reason, worker_id, lease_until, content_sha256, rows_total, plan_hash, plan_counts, planned_at)
		VALUES ('acme', 'orders', 'orders-2.csv', 'processing/w1/orders-2.csv', 10, 'awaiting_approval', 'awaiting_approval', 'w1',
		    pg_catalog.now(), 'cd34', 3, 'h1', '{"creates": 1, "updates": 2}', pg_catalog.now())
		RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	seedChanges(t, pool, id, `SELECT 2, 'update', 'K-7', '{"amount": ["1.00", "`+secret+`"]}'::jsonb`)
	return id
}

// seedChanges records the plan changes of intake id that sel returns
// (line, action, key, changed) as the plan records them: a change per
// row, a column row per changed column.
func seedChanges(t *testing.T, pool *pgxpool.Pool, id int64, sel string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `WITH c AS (
		    INSERT INTO intake_plan_change (intake_id, seq, line, action, key, changed)
		    SELECT $1, s.line, s.line, s.action, s.key, s.changed FROM (`+sel+`) AS s(line, action, key, changed)
		    RETURNING seq, changed)
		INSERT INTO intake_plan_change_column (intake_id, col, seq)
		SELECT $1, k, c.seq FROM c, pg_catalog.jsonb_object_keys(c.changed) k WHERE c.changed IS NOT NULL`, id); err != nil {
		t.Fatal(err)
	}
}

func one(t *testing.T, pool *pgxpool.Pool, q string, args ...any) string {
	t.Helper()
	s := testenv.Strings(t, pool, q, args...)
	if len(s) != 1 {
		t.Fatalf("%s: got %q, want one row", q, s)
	}
	return s[0]
}

// No page is served without a signed-in identity: no header, a header
// from an address that is not the proxy's, and an identity without a
// role are all refused; every answer carries the strict CSP.
func TestNoPageWithoutSignIn(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	code, hdr, _ := do(t, h, "", "GET", "/held", nil)
	if code != http.StatusUnauthorized {
		t.Errorf("no identity: got %d, want 401", code)
	}
	if got := hdr.Get("Content-Security-Policy"); !strings.Contains(got, "default-src 'none'") || strings.Contains(got, "unsafe-inline") {
		t.Errorf("CSP: got %q", got)
	}
	r := httptest.NewRequest("GET", "/held", nil)
	r.RemoteAddr = "192.0.2.7:5555"
	r.Header.Set("X-Forwarded-User", reviewer)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Errorf("header from a stranger: got %d, want 401", w.Code)
	}
	if code, _, _ := do(t, h, "mallory@example.com", "GET", "/held", nil); code != http.StatusForbidden {
		t.Errorf("identity without a role: got %d, want 403", code)
	}
	if code, _, _ := do(t, h, reviewer, "GET", "/held", nil); code != http.StatusOK {
		t.Errorf("reviewer: got %d, want 200", code)
	}
}

// A reviewer sees a held file in the queue and on its page; a release
// without the form's CSRF token is refused and changes nothing; with it
// the file is released under a fresh request id whose audit row names
// the reviewer. Partner text (a file name with markup) is escaped.
func TestReviewerReleasesHeldFile(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	name := `<script>x</script>orders-1.csv`
	id := seedHeld(t, pool, name)
	// two of its rows applied before it was held: they stand after the
	// release, which starts its counts over
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET rows_applied = 2 WHERE intake_id = $1`, id); err != nil {
		t.Fatal(err)
	}

	code, _, body := do(t, h, reviewer, "GET", "/held", nil)
	if code != http.StatusOK || !strings.Contains(body, `href="/files/`) || !strings.Contains(body, "reject_rate") {
		t.Fatalf("held queue: %d\n%s", code, body)
	}
	if strings.Contains(body, "<script>x") || !strings.Contains(body, "&lt;script&gt;x") {
		t.Errorf("the file name is not escaped:\n%s", body)
	}
	target := "/files/" + itoa(id)
	code, _, body = do(t, h, reviewer, "GET", target, nil)
	if code != http.StatusOK || !strings.Contains(body, `id="release"`) {
		t.Fatalf("file page: %d\n%s", code, body)
	}
	token, hold := csrfOf(t, body), holdOn(t, body)

	code, _, _ = do(t, h, reviewer, "POST", target+"/release", url.Values{"reason": {"checked the rejects"}})
	if code != http.StatusForbidden {
		t.Errorf("release without CSRF: got %d, want 403", code)
	}
	code, _, _ = do(t, h, reviewer, "POST", target+"/release", url.Values{"reason": {"checked"}, "csrf": {"forged"}})
	if code != http.StatusForbidden {
		t.Errorf("release with a wrong CSRF token: got %d, want 403", code)
	}
	if got := one(t, pool, `SELECT state FROM intake_quarantine WHERE intake_id = $1`, id); got != "open" {
		t.Fatalf("after refused releases the file is %s, want open", got)
	}

	// a form naming no hold, or another hold than the file's, decides nothing
	for _, form := range []url.Values{{"reason": {"checked"}, "csrf": {token}}, {"reason": {"checked"}, "csrf": {token}, "hold": {hold + "0"}}} {
		if code, _, body := do(t, h, reviewer, "POST", target+"/release", form); code != http.StatusConflict || !strings.Contains(body, "hold") {
			t.Errorf("release naming hold %q: got %d, want 409 naming the hold\n%s", form.Get("hold"), code, body)
		}
	}
	if got := one(t, pool, `SELECT state FROM intake_quarantine WHERE intake_id = $1`, id); got != "open" {
		t.Fatalf("after releases naming no hold or another the file is %s, want open", got)
	}
	code, hdr, _ := do(t, h, reviewer, "POST", target+"/release", url.Values{"reason": {"checked the rejects"}, "csrf": {token}, "hold": {hold}})
	if code != http.StatusSeeOther {
		t.Fatalf("release: got %d, want 303", code)
	}
	loc, _ := url.Parse(hdr.Get("Location"))
	request := loc.Query().Get("request")
	if !strings.HasPrefix(request, "req-") {
		t.Fatalf("redirect %q carries no request id", hdr.Get("Location"))
	}
	if got := one(t, pool, `SELECT q.state || ' ' || f.state FROM intake_quarantine q JOIN file_intake f USING (intake_id) WHERE intake_id = $1`, id); got != "released spooled" {
		t.Errorf("after release: got %q, want released spooled", got)
	}
	if got := one(t, pool, `SELECT actor || ' ' || action || ' ' || reason FROM intake_audit WHERE request_id = $1`, request); got != reviewer+" release checked the rejects" {
		t.Errorf("audit: got %q", got)
	}
	code, _, body = do(t, h, reviewer, "GET", loc.RequestURI(), nil)
	if code != http.StatusOK || !strings.Contains(body, request) || !strings.Contains(body, reviewer) || !strings.Contains(body, `id="done"`) {
		t.Errorf("the file's page does not show the decision's request and actor: %d\n%s", code, body)
	}
	if !strings.Contains(body, "0 applied, ") || !strings.Contains(body, "2 applied by its runs before its release, which stand") {
		t.Errorf("the released file's page does not show the rows applied before its release:\n%s", body)
	}
	// a link naming a request the file's audit does not hold claims nothing
	if _, _, body := do(t, h, reviewer, "GET", target+"?request=req-0000000000000000", nil); strings.Contains(body, `id="done"`) {
		t.Errorf("a made-up request is said to be a recorded decision:\n%s", body)
	}
	// a second release of the same file is refused as on the CLI
	code, _, _ = do(t, h, reviewer, "POST", target+"/release", url.Values{"reason": {"again"}, "csrf": {token}, "hold": {hold}})
	if code != http.StatusConflict {
		t.Errorf("second release: got %d, want 409", code)
	}
}

// A viewer sees a waiting plan's counts but none of its keys or values,
// gets no decision form, and a decision it posts (with its own valid
// CSRF token) is refused; a reviewer sees the values.
func TestViewerSeesNoValuesAndCannotDecide(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	id := seedWaiting(t, pool)
	target := "/plans/" + itoa(id)

	code, _, body := do(t, h, viewer, "GET", target, nil)
	if code != http.StatusOK || !strings.Contains(body, "<dt>updates</dt><dd>2</dd>") {
		t.Fatalf("viewer's plan page: %d\n%s", code, body)
	}
	if strings.Contains(body, secret) || strings.Contains(body, "K-7") || strings.Contains(body, `id="approve"`) {
		t.Errorf("a viewer sees a value, a key or a decision form:\n%s", body)
	}
	token := csrfOf(t, body) // the sign-out form's
	code, _, _ = do(t, h, viewer, "POST", target+"/approve", url.Values{"reason": {"ok"}, "plan_hash": {"h1"}, "csrf": {token}})
	if code != http.StatusForbidden {
		t.Errorf("viewer's approve: got %d, want 403", code)
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, id); got != "awaiting_approval" {
		t.Errorf("after a viewer's approve the file is %s", got)
	}
	code, _, body = do(t, h, reviewer, "GET", target, nil)
	if code != http.StatusOK || !strings.Contains(body, secret) || !strings.Contains(body, "K-7") || !strings.Contains(body, `id="approve"`) {
		t.Errorf("reviewer's plan page lacks the values or the form: %d\n%s", code, body)
	}
	// the changes table filters in SQL: no deletes in this plan
	_, _, body = do(t, h, reviewer, "GET", target+"?action=delete", nil)
	if strings.Contains(body, "K-7") || !strings.Contains(body, "No changes.") {
		t.Errorf("filter by delete still shows the update:\n%s", body)
	}
}

// An approval bound to a hash that is not the plan's current one is
// refused and leaves the file waiting; the page's own hash approves it,
// audited under the reviewer's name and the request id.
func TestStalePlanHashIsRefused(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	id := seedWaiting(t, pool)
	target := "/plans/" + itoa(id)
	_, _, body := do(t, h, reviewer, "GET", target, nil)
	token := csrfOf(t, body)
	if !strings.Contains(body, `name="plan_hash" value="h1"`) {
		t.Fatalf("the approve form does not carry the page's hash:\n%s", body)
	}
	if n := strings.Count(body, `name="plan_hash" value="h1"`); n != 2 {
		t.Fatalf("%d forms carry the page's hash, want the approve and the reject forms:\n%s", n, body)
	}
	for _, action := range []string{"approve", "reject"} {
		code, _, body := do(t, h, reviewer, "POST", target+"/"+action, url.Values{"reason": {"ok"}, "plan_hash": {"h0"}, "csrf": {token}})
		if code != http.StatusConflict || !strings.Contains(body, "not the current plan") {
			t.Errorf("%s of a stale hash: got %d, want 409 naming the plan change\n%s", action, code, body)
		}
		code, _, body = do(t, h, reviewer, "POST", target+"/"+action, url.Values{"reason": {"ok"}, "csrf": {token}})
		if code != http.StatusConflict || !strings.Contains(body, "names no plan") {
			t.Errorf("%s naming no plan: got %d, want 409\n%s", action, code, body)
		}
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, id); got != "awaiting_approval" {
		t.Fatalf("after stale decisions the file is %s", got)
	}
	code, hdr, _ := do(t, h, reviewer, "POST", target+"/approve", url.Values{"reason": {"reviewed"}, "plan_hash": {"h1"}, "csrf": {token}})
	if code != http.StatusSeeOther {
		t.Fatalf("approve: got %d, want 303", code)
	}
	loc, _ := url.Parse(hdr.Get("Location"))
	request := loc.Query().Get("request")
	if got := one(t, pool, `SELECT state || ' ' || plan_decision || ' ' || approved_plan_hash FROM file_intake WHERE intake_id = $1`, id); got != "spooled approved h1" {
		t.Errorf("after approve: got %q", got)
	}
	if got := one(t, pool, `SELECT actor || ' ' || action || ' ' || detail FROM intake_audit WHERE request_id = $1`, request); got != reviewer+" approve plan h1" {
		t.Errorf("audit: got %q", got)
	}
	_, _, body = do(t, h, reviewer, "GET", "/audit?request="+request, nil)
	if !strings.Contains(body, reviewer) || !strings.Contains(body, "approve") {
		t.Errorf("audit page does not find the request:\n%s", body)
	}
	// decided, its plan keeps its counts and says where its changes went
	_, _, body = do(t, h, reviewer, "GET", target, nil)
	if !strings.Contains(body, `id="changes-gone"`) || strings.Contains(body, "No changes.") || strings.Contains(body, `id="approve"`) {
		t.Errorf("a decided plan's page:\n%s", body)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// With ops.four_eyes, the reviewer who released a file cannot approve its
// plan on the console; another reviewer can. Every reviewer acts through
// the console's one database login, so four eyes compares the signed-in
// reviewers, whichever way the release was made.
func TestFourEyesOnTheConsoleComparesSignedInReviewers(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool, func(d *console.Deps) { d.Scope.FourEyes = true })
	id := seedWaiting(t, pool)
	if _, err := pool.Exec(context.Background(), `INSERT INTO intake_audit (actor, action, partner_id, intake_id, reason)
		VALUES ($1, 'release', 'acme', $2, 'checked the rejects')`, reviewer, id); err != nil {
		t.Fatal(err)
	}
	target := "/plans/" + itoa(id)
	approve := func(who string) (int, string) {
		_, _, body := do(t, h, who, "GET", target, nil)
		code, _, body := do(t, h, who, "POST", target+"/approve", url.Values{"reason": {"ok"}, "plan_hash": {"h1"}, "csrf": {csrfOf(t, body)}})
		return code, body
	}
	if code, body := approve(reviewer); code != http.StatusConflict || !strings.Contains(body, "four eyes") || !strings.Contains(body, "actor "+reviewer+" released it") {
		t.Fatalf("approval by the reviewer who released it: got %d, want 409 naming four eyes\n%s", code, body)
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, id); got != "awaiting_approval" {
		t.Fatalf("after a refused approval the file is %s", got)
	}
	if code, body := approve(reviewer2); code != http.StatusSeeOther {
		t.Fatalf("approval by another reviewer: got %d, want 303\n%s", code, body)
	}
	if got := one(t, pool, `SELECT state || ' ' || plan_decision FROM file_intake WHERE intake_id = $1`, id); got != "spooled approved" {
		t.Errorf("after the other reviewer's approval: got %q", got)
	}
}

// A reload reaches the console at its next request, with no restart: a
// partner added is covered (its held file's page opens), a reviewer taken
// off the lists has no role, and four eyes turned on refuses the approval
// of the reviewer who released the file.
func TestTheConsoleFollowsAReload(t *testing.T) {
	_, pool := testenv.DB(t)
	s := newServer(t, pool)
	h := s.Handler()
	waiting := seedWaiting(t, pool)
	if _, err := pool.Exec(context.Background(), `INSERT INTO intake_audit (actor, action, partner_id, intake_id, reason)
		VALUES ($1, 'release', 'acme', $2, 'checked the rejects')`, reviewer, waiting); err != nil {
		t.Fatal(err)
	}
	var beta int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, reason,
		    worker_id, lease_until, content_sha256) VALUES ('beta', 'orders', 'b.csv', 'quarantine/b.csv', 10, 'quarantined', 'reject_rate',
		    'w1', pg_catalog.now(), 'ab12') RETURNING intake_id`).Scan(&beta); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := do(t, h, reviewer, "GET", "/files/"+itoa(beta), nil); code != http.StatusNotFound {
		t.Fatalf("another partner's file before the reload: got %d, want 404", code)
	}
	if code, _, _ := do(t, h, reviewer2, "GET", "/held", nil); code != http.StatusOK {
		t.Fatalf("the second reviewer before the reload: got %d", code)
	}

	s.Reload(console.Auth{Reviewers: []string{reviewer}, Viewers: []string{viewer}},
		console.Scope{Partners: []string{"acme", "beta"}, FourEyes: true})

	if code, _, body := do(t, h, reviewer, "GET", "/files/"+itoa(beta), nil); code != http.StatusOK || !strings.Contains(body, "b.csv") {
		t.Errorf("the added partner's file after the reload: got %d, want 200 naming it", code)
	}
	if code, _, body := do(t, h, reviewer2, "GET", "/held", nil); code != http.StatusForbidden || !strings.Contains(body, "no console role") {
		t.Errorf("the reviewer taken off the list: got %d, want 403 (no role)", code)
	}
	target := "/plans/" + itoa(waiting)
	_, _, page := do(t, h, reviewer, "GET", target, nil)
	code, _, body := do(t, h, reviewer, "POST", target+"/approve", url.Values{"reason": {"ok"}, "plan_hash": {"h1"}, "csrf": {csrfOf(t, page)}})
	if code != http.StatusConflict || !strings.Contains(body, "four eyes") {
		t.Errorf("approval by the reviewer who released it, four eyes on by the reload: got %d, want 409\n%s", code, body)
	}
}

// The console runs as a lifecycle.Service on a listener of its own: it
// answers over TCP once started (unsigned: 401 with its CSP), and Stop,
// twice, closes the listener.
func TestConsoleServesOnItsOwnListenerUntilStopped(t *testing.T) {
	_, pool := testenv.DB(t)
	s, err := console.New(context.Background(), console.Config{
		Listen: "127.0.0.1:0", BaseURL: "http://localhost:8080",
		Auth: console.Auth{Proxy: &console.Proxy{Header: "X-Forwarded-User", From: []string{"127.0.0.1"}}, Reviewers: []string{reviewer}},
	}, console.Deps{Pool: pool, Scope: console.Scope{Partners: []string{"acme"}}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	resp, err := http.Get("http://" + addr + "/held")
	if err != nil {
		s.Stop()
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("unsigned request: got %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/held", nil)
	req.Header.Set("X-Forwarded-User", reviewer)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("reviewer over TCP from the proxy's address: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	s.Stop()
	s.Stop()
	http.DefaultClient.CloseIdleConnections()
	if _, err := http.Get("http://" + addr + "/held"); err == nil {
		t.Error("the console still answers after Stop")
	}
}

// Discard and reject go through the same forms and functions: the held
// file is closed for good and the plan rejected, each audited under the
// reviewer and its request id.
func TestReviewerDiscardsAndRejects(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	held := seedHeld(t, pool, "orders-9.csv")
	execIn(t, pool, `UPDATE file_intake SET receipt_path = 'reports/orders-9.1.receipt.json' WHERE intake_id = $1`, held) // the hold's
	waiting := seedWaiting(t, pool)
	_, _, body := do(t, h, reviewer, "GET", "/files/"+itoa(held), nil)
	token, hold := csrfOf(t, body), holdOn(t, body)
	for _, c := range []struct{ target, audit string }{
		{"/files/" + itoa(held) + "/discard", "discard"},
		{"/plans/" + itoa(waiting) + "/reject", "reject"},
	} {
		code, hdr, _ := do(t, h, reviewer, "POST", c.target, url.Values{"reason": {"not this one"}, "csrf": {token}, "hold": {hold}, "plan_hash": {"h1"}})
		if code != http.StatusSeeOther {
			t.Fatalf("%s: got %d, want 303", c.target, code)
		}
		loc, _ := url.Parse(hdr.Get("Location"))
		if got := one(t, pool, `SELECT actor || ' ' || action FROM intake_audit WHERE request_id = $1`, loc.Query().Get("request")); got != reviewer+" "+c.audit {
			t.Errorf("%s audit: got %q", c.target, got)
		}
	}
	if got := one(t, pool, `SELECT q.state || ' ' || f.state FROM intake_quarantine q JOIN file_intake f USING (intake_id) WHERE intake_id = $1`, held); got != "discarded discarded" {
		t.Errorf("after discard: got %q", got)
	}
	// not published to the partner (no site here): the page says so, and
	// that the receipt the partner reads is still the hold's
	if _, _, body := do(t, h, reviewer, "GET", "/files/"+itoa(held), nil); !strings.Contains(body,
		`not yet published (the reconciler publishes it); the hold's stands until then: reports/orders-9.1.receipt.json`) {
		t.Errorf("the page of a discard not yet published:\n%s", body)
	}
	if got := one(t, pool, `SELECT state || ' ' || plan_decision FROM file_intake WHERE intake_id = $1`, waiting); got != "spooled rejected" {
		t.Errorf("after reject: got %q", got)
	}
}

// seedSample records a file awaiting approval whose plan holds 120
// updates K-1 … K-120 (line n+1): the odd ones change amount to V-<n> (a
// cell value), the even ones change status.
func seedSample(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		    state, reason, worker_id, lease_until, content_sha256, rows_total, plan_hash, plan_counts, planned_at)
		VALUES ('acme', 'orders', 'orders-s.csv', 'processing/w1/orders-s.csv', 10, 'awaiting_approval', 'awaiting_approval', 'w1',
		    pg_catalog.now(), 'ef56', 120, 'h2', '{"updates": 120}', pg_catalog.now())
		RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	seedChanges(t, pool, id, `SELECT i + 1, 'update', 'K-' || i,
		    CASE WHEN i % 2 = 1 THEN jsonb_build_object('amount', jsonb_build_array('1.00', 'V-' || i))
		         ELSE jsonb_build_object('status', jsonb_build_array('old', 'new')) END
		FROM generate_series(1, 120) i`)
	return id
}

// keyCell is how the changes table prints a key.
func keyCell(k string) string { return `<td class="key">` + k + `</td>` }

// A reviewer filters a plan's changes by key (prefix or exact) and by
// column, with a GET form, each filter applied in SQL with the keyset
// paging: the rows and the pages are the filtered ones, and a filter
// value with markup comes back escaped. A viewer sees no key or value
// whatever the filters ask.
func TestPlanChangesFilterByKeyAndColumn(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	id := seedSample(t, pool)
	target := "/plans/" + itoa(id)

	_, _, body := do(t, h, reviewer, "GET", target, nil)
	for _, want := range []string{`method="get" action="/plans/` + itoa(id) + `"`, `name="key"`, `name="column"`, `name="match"`,
		"120 changes in the plan", keyCell("K-50"), `rel="next" href="/plans/` + itoa(id) + `?after=51&amp;plan=h2"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the plan page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, keyCell("K-51")) || strings.Contains(body, `rel="prev"`) {
		t.Errorf("the first page shows past its 50 rows or links back:\n%s", body)
	}
	for _, c := range []struct {
		query      string
		has, hasNo []string
	}{
		// K-1, K-10 … K-19, K-100 … K-120
		{"?key=K-1", []string{keyCell("K-1"), keyCell("K-19"), keyCell("K-120")}, []string{keyCell("K-2"), keyCell("K-20"), `rel="next"`}},
		{"?key=K-1&match=exact", []string{keyCell("K-1"), "V-1"}, []string{keyCell("K-10"), keyCell("K-11")}},
		{"?column=status", []string{keyCell("K-2"), keyCell("K-100"), `rel="next" href="/plans/` + itoa(id) + `?after=101&amp;column=status&amp;plan=h2"`},
			[]string{keyCell("K-1"), "amount", keyCell("K-102")}},
		// the next page of a filtered table is cut from the filtered rows
		{"?column=status&after=101&plan=h2", []string{keyCell("K-102"), keyCell("K-120"), `rel="prev" href="/plans/` + itoa(id) + `?before=103&amp;column=status&amp;plan=h2"`},
			[]string{keyCell("K-100"), keyCell("K-101"), `rel="next"`}},
		// the first page's link names the plan too
		{"?column=status&after=101&plan=h2", []string{`rel="first" href="/plans/` + itoa(id) + `?column=status&amp;plan=h2"`}, nil},
		// and the page before it is the first one again
		{"?column=status&before=103", []string{keyCell("K-2"), keyCell("K-100")}, []string{keyCell("K-102"), `rel="prev"`}},
		{"?column=status&key=K-11", []string{keyCell("K-110"), keyCell("K-118")}, []string{keyCell("K-11"), keyCell("K-111")}},
		{"?column=amount&key=K-7&match=exact", []string{"V-7"}, []string{keyCell("K-70")}},
		{"?column=nosuch", []string{"No changes."}, []string{`class="key"`}},
		// a key or column no text column holds finds nothing, not an error
		{"?key=K%00", []string{"No changes."}, []string{`class="key"`}},
		{"?column=%ff", []string{"No changes."}, []string{`class="key"`}},
	} {
		code, _, body := do(t, h, reviewer, "GET", target+c.query, nil)
		if code != http.StatusOK {
			t.Errorf("%s: got %d\n%s", c.query, code, body)
			continue
		}
		for _, s := range c.has {
			if !strings.Contains(body, s) {
				t.Errorf("%s: %q missing", c.query, s)
			}
		}
		for _, s := range c.hasNo {
			if strings.Contains(body, s) {
				t.Errorf("%s: %q shown", c.query, s)
			}
		}
	}
	// a next page of a plan planned again since the page before
	if code, _, body := do(t, h, reviewer, "GET", target+"?after=51&plan=h1", nil); code != http.StatusConflict ||
		!strings.Contains(body, "planned again since the page before") || strings.Contains(body, `class="key"`) {
		t.Errorf("a next page of a plan planned again: got %d, want 409 and no changes\n%s", code, body)
	}
	_, _, body = do(t, h, reviewer, "GET", target+"?key="+url.QueryEscape(`<b>x</b>`), nil)
	if strings.Contains(body, "<b>x") || !strings.Contains(body, `value="&lt;b&gt;x&lt;/b&gt;"`) {
		t.Errorf("the key filter is not escaped:\n%s", body)
	}
	code, _, body := do(t, h, viewer, "GET", target+"?key=K-1&match=exact&column=amount", nil)
	if code != http.StatusOK || strings.Contains(body, "V-1") || strings.Contains(body, "K-1") || strings.Contains(body, `id="changes"`) {
		t.Errorf("a viewer's filtered plan page shows keys or values: %d\n%s", code, body)
	}
}

// seedArchived records a finished (archived) file of acme.
func seedArchived(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		    state, worker_id, lease_until, batch_id, content_sha256, size_bytes, data_sha256, data_size, finished_at, archive_path)
		VALUES ('acme', 'orders', 'orders-a.csv', 'processing/w1/orders-a.csv', 10, 'archived', 'w1', pg_catalog.now(), 'B1',
		    'aa11', 10, 'aa11', 10, pg_catalog.now(), 'archive/orders-a.csv')
		RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// withDaemon gives the console the replay of a daemon of acme, as
// `intake run` wires it: intake.Daemon.Replay, what `intake replay` calls.
func withDaemon(t *testing.T, pool *pgxpool.Pool) func(*console.Deps) {
	t.Helper()
	replay := daemonReplay(t, pool)
	return func(deps *console.Deps) { deps.Replay = replay }
}

// daemonReplay is the Replay of a daemon of acme, stopped at the test's end.
func daemonReplay(t *testing.T, pool *pgxpool.Pool) func(context.Context, intake.ReplayRequest) (*ledger.Intake, error) {
	t.Helper()
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := intake.New(intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1},
		[]partners.Config{{ID: "acme"}}, pool, sp, prometheus.NewRegistry(), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d.Replay
}

// A reviewer replays a finished file from its page: the form posts its
// CSRF token, the replay is recorded through the daemon's Replay (handed
// to a daemon) under a fresh request id whose audit row names the
// reviewer, and the browser lands on the replay's page. A second replay
// while the first is live is refused, as is a replay of a held file; a
// viewer gets no form and its post is refused; a post without the token
// is refused. None of the refusals records a replay.
func TestReviewerReplaysFinishedFile(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool, withDaemon(t, pool))
	id := seedArchived(t, pool)
	held := seedHeld(t, pool, "orders-h.csv")
	target := "/files/" + itoa(id)
	replays := func() int64 {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE replay_of IS NOT NULL`)
	}

	code, _, body := do(t, h, viewer, "GET", target, nil)
	if code != http.StatusOK || strings.Contains(body, `id="replay"`) {
		t.Fatalf("viewer's file page: %d, or a replay form\n%s", code, body)
	}
	code, _, _ = do(t, h, viewer, "POST", target+"/replay", url.Values{"reason": {"again"}, "csrf": {csrfOf(t, body)}})
	if code != http.StatusForbidden {
		t.Errorf("viewer's replay: got %d, want 403", code)
	}
	code, _, body = do(t, h, reviewer, "GET", target, nil)
	if code != http.StatusOK || !strings.Contains(body, `action="/files/`+itoa(id)+`/replay"`) {
		t.Fatalf("reviewer's file page has no replay form: %d\n%s", code, body)
	}
	token := csrfOf(t, body)
	if code, _, _ = do(t, h, reviewer, "POST", target+"/replay", url.Values{"reason": {"mapping fixed"}}); code != http.StatusForbidden {
		t.Errorf("replay without CSRF: got %d, want 403", code)
	}
	if n := replays(); n != 0 {
		t.Fatalf("refused replays recorded %d rows", n)
	}

	code, hdr, _ := do(t, h, reviewer, "POST", target+"/replay", url.Values{"reason": {"mapping fixed"}, "csrf": {token}})
	if code != http.StatusSeeOther {
		t.Fatalf("replay: got %d, want 303", code)
	}
	loc, _ := url.Parse(hdr.Get("Location"))
	request := loc.Query().Get("request")
	row := one(t, pool, `SELECT intake_id || ' ' || state || ' ' || batch_id FROM file_intake WHERE replay_of = $1`, id)
	replayID, _, _ := strings.Cut(row, " ")
	if !strings.HasSuffix(row, " spooled B1") || loc.Path != "/files/"+replayID {
		t.Fatalf("replay row %q, redirected to %q", row, loc)
	}
	if got := one(t, pool, `SELECT actor || ' ' || action || ' ' || reason || ' ' || intake_id FROM intake_audit WHERE request_id = $1`, request); got != reviewer+" replay mapping fixed "+replayID {
		t.Errorf("audit: got %q", got)
	}
	// idempotent: the live replay refuses a second one, naming it
	code, _, body = do(t, h, reviewer, "POST", target+"/replay", url.Values{"reason": {"again"}, "csrf": {token}})
	if code != http.StatusConflict || !strings.Contains(body, "intake "+replayID) {
		t.Errorf("second replay: got %d, want 409 naming intake %s\n%s", code, replayID, body)
	}
	// a file that has not finished (held) is not replayed
	code, _, body = do(t, h, reviewer, "POST", "/files/"+itoa(held)+"/replay", url.Values{"reason": {"x"}, "csrf": {token}})
	if code != http.StatusConflict || !strings.Contains(body, "only finished files are replayed") {
		t.Errorf("replay of a held file: got %d, want 409\n%s", code, body)
	}
	if n := replays(); n != 1 {
		t.Errorf("%d replays recorded, want 1", n)
	}
}

// The partners page shows each partner as `intake status` reads it: the
// state by its last polls and the last error, the held files, the late
// delivery windows, the feeds the daemon holds and why, and the server's
// measured capability; a viewer sees it, and the navigation links it.
// Without a daemon beside it the console says it does not know the held
// feeds.
func TestPartnersPage(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	seedHeld(t, pool, "orders-p.csv")
	for _, q := range []string{
		`INSERT INTO intake_partner_poll (partner_id, worker_id, last_ok_at, last_error_at, last_error)
		 VALUES ('acme', 'w1', pg_catalog.now() - interval '10 minutes', pg_catalog.now() - interval '1 minute', 'dial tcp: connection refused')`,
		`INSERT INTO intake_feed_late (partner_id, feed, scheduled_at, deadline, raised_by)
		 VALUES ('acme', 'invoices', pg_catalog.now() - interval '3 hours', pg_catalog.now() - interval '2 hours', 'w1')`,
		`INSERT INTO intake_site_profile (partner_id, site, rename_overwrites, posix_rename, fsync) VALUES ('acme', 'sftp.acme:22', false, true, true)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	h := newConsole(t, pool, func(d *console.Deps) {
		d.HeldFeeds = func() map[string]map[string]string {
			return map[string]map[string]string{"acme": {"orders": "permission denied for table <orders>"}}
		}
	})
	code, _, body := do(t, h, viewer, "GET", "/partners", nil)
	if code != http.StatusOK {
		t.Fatalf("viewer's partners page: %d\n%s", code, body)
	}
	for _, want := range []string{
		`<a href="/partners">Partners</a>`,
		`id="partner-acme"`,
		`<dd class="state">failing, 1 feed(s) held</dd>`,
		"dial tcp: connection refused",
		`<a href="/held">1</a>`,
		"<td>invoices</td>",
		"open: no accepted file",
		"<td>orders</td><td>permission denied for table &lt;orders&gt;</td>",
		"extensions posix-rename,fsync",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the partners page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", body)
	}
	_, _, body = do(t, newConsole(t, pool), reviewer, "GET", "/partners", nil)
	if !strings.Contains(body, "Not known to this console") {
		t.Errorf("a console without a daemon claims to know the held feeds:\n%s", body)
	}
	// its last poll good, but long ago for its schedule: stale, not up;
	// polled every hour, not yet
	if _, err := pool.Exec(ctx, `UPDATE intake_partner_poll SET last_ok_at = pg_catalog.now() - interval '20 minutes', last_error_at = NULL`); err != nil {
		t.Fatal(err)
	}
	for spec, want := range map[string]string{"@every 1m": `<dd class="state">stale: `, "@every 1h": `<dd class="state">up</dd>`} {
		_, _, body = do(t, newConsole(t, pool, func(d *console.Deps) { d.Scope.Polls = map[string]string{"acme": spec} }), viewer, "GET", "/partners", nil)
		if !strings.Contains(body, want) {
			t.Errorf("polled %s, last 20 minutes ago: the page lacks %q", spec, want)
		}
	}
}

// A released file in flight keeps the paths of its hold's reports until
// its run decides (ledger.Reopen): its page says they are the earlier
// decision's, not this run's. A held file's page names where it is held.
func TestAFileInFlightShowsItsEarlierDecisionsReportsAsSuch(t *testing.T) {
	_, pool := testenv.DB(t)
	h := newConsole(t, pool)
	id := seedHeld(t, pool, "orders-5.csv")
	execIn(t, pool, `UPDATE file_intake SET archive_path = 'quarantine/5.orders-5.csv', receipt_path = 'reports/orders-5.5.receipt.json' WHERE intake_id = $1`, id)
	_, _, body := do(t, h, reviewer, "GET", "/files/"+itoa(id), nil)
	if !strings.Contains(body, "<dt>held in</dt>") || !strings.Contains(body, "<dt>receipt</dt><dd>reports/orders-5.5.receipt.json") {
		t.Fatalf("the held file's page does not name where it is held and its receipt:\n%s", body)
	}
	for _, state := range []string{"applying", "awaiting_approval"} {
		execIn(t, pool, `UPDATE file_intake SET state = $2, reason = NULL, archive_path = NULL, rejects_path = 'reports/orders-5.5.rejects.csv' WHERE intake_id = $1`, id, state)
		_, _, body = do(t, h, reviewer, "GET", "/files/"+itoa(id), nil)
		if !strings.Contains(body, "the earlier decision's, until this run decides: reports/orders-5.5.receipt.json, reports/orders-5.5.rejects.csv") ||
			strings.Contains(body, "<dt>receipt</dt>") {
			t.Fatalf("the page of a file %s shows its earlier decision's reports as its own:\n%s", state, body)
		}
	}
}

// A batch conflict released with the older file as the winner discards
// the held file, and the discard is published to the partner right away,
// as a discard is: without it the partner read the file quarantined until
// the next reconciler run.
func TestReleasingABatchConflictToTheOlderFilePublishesTheDiscard(t *testing.T) {
	_, pool := testenv.DB(t)
	var published []int64
	h := newConsole(t, pool, func(d *console.Deps) {
		d.Scope.Publish = func(_ context.Context, id int64) error { published = append(published, id); return nil }
	})
	id := seedHeld(t, pool, "orders-9.csv")
	for _, q := range []string{`UPDATE file_intake SET reason = 'batch_conflict' WHERE intake_id = $1`,
		`UPDATE intake_quarantine SET reason = 'batch_conflict' WHERE intake_id = $1`} {
		if _, err := pool.Exec(context.Background(), q, id); err != nil {
			t.Fatal(err)
		}
	}
	target := "/files/" + itoa(id)
	_, _, body := do(t, h, reviewer, "GET", target, nil)
	form := url.Values{"reason": {"the first file stands"}, "csrf": {csrfOf(t, body)}, "hold": {holdOn(t, body)}, "winner": {"old"}}
	if code, _, body := do(t, h, reviewer, "POST", target+"/release", form); code != http.StatusSeeOther {
		t.Fatalf("release: got %d, want 303\n%s", code, body)
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, id); got != "discarded" {
		t.Fatalf("after the release the file is %s, want discarded", got)
	}
	if len(published) != 1 || published[0] != id {
		t.Fatalf("published %v, want the discard of intake %d", published, id)
	}
}

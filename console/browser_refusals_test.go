package console_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/syspkg"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// browserSession is headless Chromium signed in to a console of acme
// through idp, with the identity roles says.
type browserSession struct {
	t    *testing.T
	ctx  context.Context
	base string
}

func signedInBrowser(t *testing.T, pool *pgxpool.Pool, email string, roles ...string) *browserSession {
	t.Helper()
	chromium, err := syspkg.Find([]string{"/usr/bin/chromium"}, "chromium")
	if err != nil {
		t.Fatal(err)
	}
	idp := newProvider(t, "intake-console", email)
	idp.roles = roles
	ts := httptest.NewUnstartedServer(nil)
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	base := "http://localhost:" + port
	con, err := console.New(context.Background(), console.Config{
		Listen: "127.0.0.1:0", BaseURL: base,
		Auth: console.Auth{OIDC: &console.OIDC{Issuer: idp.srv.URL, ClientID: "intake-console", RolesClaim: "roles"}},
	}, console.Deps{Pool: pool, Scope: console.Scope{Partners: []string{"acme"}}, Worker: intake.OpsWorker("ops"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = con.Handler()
	ts.Start()
	t.Cleanup(ts.Close)
	return &browserSession{t: t, ctx: headlessChromium(t, chromium), base: base}
}

// headlessChromium starts Chromium at path for the test and returns the
// context its steps run under (90 s). The start is tried twice: on a
// loaded machine Chromium has exited before it printed its DevTools
// address ("chrome failed to start", nothing of the test's run yet).
func headlessChromium(t *testing.T, path string) context.Context {
	t.Helper()
	var err error
	for range 2 {
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless,
			chromedp.Flag("disable-gpu", true), chromedp.UserDataDir(t.TempDir()))
		actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, cancelB := chromedp.NewContext(actx)
		// the first Do starts the browser under bctx (no timeout there: it
		// would stop the browser); the steps run under a deadline
		if err = chromedp.Do(bctx); err == nil {
			t.Cleanup(cancelA)
			t.Cleanup(cancelB)
			ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
			t.Cleanup(cancel)
			return ctx
		}
		cancelB()
		cancelA()
		t.Logf("chromium did not start: %v", err)
	}
	t.Fatal(err)
	return nil
}

func (b *browserSession) do(what string, a ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, a...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval runs JavaScript in the page and returns its value.
func eval[T any](b *browserSession, js string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// A viewer, signed in through OpenID Connect in a real browser, sees the
// held file and the waiting plan with their counts but no form to
// decide and no cell value; a decision posted from the viewer's page
// anyway is refused and changes nothing.
func TestBrowserViewerSeesNoValueAndCannotDecide(t *testing.T) {
	_, pool := testenv.DB(t)
	held := seedHeld(t, pool, "orders-1.csv")
	waiting := seedWaiting(t, pool)
	b := signedInBrowser(t, pool, "victor@example.com", "viewer")

	b.do("open the held file", chromedp.Navigate(b.base+"/files/"+itoa(held)), chromedp.WaitVisible(chromedp.CSS("#state")))
	if n := eval[int](b, `document.querySelectorAll("form[method=post]:not(.who)").length`); n != 0 {
		t.Errorf("the viewer's file page has %d decision forms, want none", n)
	}
	b.do("open the waiting plan", chromedp.Navigate(b.base+"/plans/"+itoa(waiting)), chromedp.WaitVisible(chromedp.CSS("#state")))
	page := eval[string](b, `document.documentElement.outerHTML`)
	if strings.Contains(page, secret) {
		t.Error("the viewer's plan page shows a cell value")
	}
	if !strings.Contains(page, "K-7") && !strings.Contains(page, "update") {
		t.Errorf("the viewer's plan page shows no change at all: %.300s", page)
	}
	if n := eval[int](b, `document.querySelectorAll("#approve, #reject").length`); n != 0 {
		t.Errorf("the viewer's plan page has %d decision forms, want none", n)
	}
	// the viewer posts a release anyway, a form made in the page with the
	// viewer's own CSRF token (the sign-out form's): the role refuses it
	b.do("post a release as the viewer",
		chromedp.Evaluate[chromedp.Void](`(() => {
			const f = document.createElement("form");
			f.method = "post"; f.action = "/files/`+itoa(held)+`/release";
			for (const [k, v] of [["csrf", document.querySelector('form.who input[name="csrf"]').value], ["reason", "viewer tries"]]) {
				const i = document.createElement("input"); i.type = "hidden"; i.name = k; i.value = v; f.appendChild(i);
			}
			document.body.appendChild(f); f.submit();
		})()`),
		chromedp.WaitVisible(chromedp.CSS("#message")))
	if msg := eval[string](b, `document.querySelector("#message").textContent`); !strings.Contains(msg, "Only a reviewer decides") {
		t.Errorf("a viewer's release shows %q, want it refused to a viewer", msg)
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, held); got != "quarantined" {
		t.Errorf("the held file is %s after the viewer's release, want quarantined", got)
	}
	if got := one(t, pool, `SELECT count(*) FROM intake_audit`); got != "0" {
		t.Errorf("%s audit rows after the viewer's refused release, want none", got)
	}
}

// A reviewer's decision without its CSRF token is refused on the page,
// and so is an approval of a plan hash that is no longer the file's (the
// file was planned again after the page was read), as on the CLI; neither
// changes the file or writes an audit row.
func TestBrowserRefusesADecisionWithoutItsTokenAndAStalePlan(t *testing.T) {
	_, pool := testenv.DB(t)
	held := seedHeld(t, pool, "orders-1.csv")
	waiting := seedWaiting(t, pool)
	b := signedInBrowser(t, pool, "rita@example.com", "reviewer")

	b.do("open the held file", chromedp.Navigate(b.base+"/files/"+itoa(held)), chromedp.WaitVisible(chromedp.CSS("#release")))
	b.do("release it without the form's CSRF token",
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#release input[name="csrf"]').remove()`),
		chromedp.SendKeys(chromedp.CSS(`#release input[name="reason"]`), "checked"),
		chromedp.Submit(chromedp.CSS(`#release`)),
		chromedp.WaitVisible(chromedp.CSS("#message")))
	if msg := eval[string](b, `document.querySelector("#message").textContent`); !strings.Contains(msg, "CSRF token is missing or wrong") {
		t.Errorf("a release without its token shows %q, want the CSRF refusal", msg)
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, held); got != "quarantined" {
		t.Errorf("the held file is %s after a release without its token, want quarantined", got)
	}

	b.do("open the waiting plan", chromedp.Navigate(b.base+"/plans/"+itoa(waiting)), chromedp.WaitVisible(chromedp.CSS("#approve")))
	// planned again meanwhile: the page's hash is stale
	execIn(t, pool, `UPDATE file_intake SET plan_hash = 'h2' WHERE intake_id = $1`, waiting)
	b.do("approve the plan read before",
		chromedp.SendKeys(chromedp.CSS(`#approve input[name="reason"]`), "plan reviewed"),
		chromedp.Submit(chromedp.CSS(`#approve`)),
		chromedp.WaitVisible(chromedp.CSS("#message")))
	if msg := eval[string](b, `document.querySelector("#message").textContent`); !strings.Contains(msg, "refused") || !strings.Contains(msg, "plan") {
		t.Errorf("an approval of a stale plan hash shows %q, want it refused naming the plan", msg)
	}
	if got := one(t, pool, `SELECT state || ' ' || coalesce(approved_plan_hash, '-') FROM file_intake WHERE intake_id = $1`, waiting); got != "awaiting_approval -" {
		t.Errorf("the waiting file is %q after a stale approval, want awaiting_approval, unapproved", got)
	}
	if got := one(t, pool, `SELECT count(*) FROM intake_audit`); got != "0" {
		t.Errorf("%s audit rows after two refused decisions, want none", got)
	}
}

func execIn(t *testing.T, pool *pgxpool.Pool, q string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), q, args...); err != nil {
		t.Fatal(err)
	}
}

// A reviewer reviews a plan the daemon made of a real file in the
// browser: filters its changes by a column (the GET form, no script),
// sees exactly the rows whose column changes, approves the plan shown,
// and the daemon's next poll lands the file's rows; the audit names the
// signed-in user.
func TestBrowserFiltersApprovesAndTheRowsLand(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := intake.New(intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1},
		[]partners.Config{site.Validated(t)}, pool, sp, prometheus.NewRegistry(), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	// the target holds F-2 and F-3 with another amount: the file updates
	// their amount alone and creates F-1
	execIn(t, pool, `INSERT INTO orders (partner_id, order_id, email, amount, status, placed_at, qty, last_intake_id) VALUES
		('acme', 'F-2', 'c2@example.com', 1, 'paid', '2026-11-03T10:00:00Z', 2, 0),
		('acme', 'F-3', 'c3@example.com', 1, 'paid', '2026-11-04T10:00:00Z', 3, 0)`)
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("F", 3))
	if err := d.PollOnce(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	id, _ := strconv.ParseInt(one(t, pool, `SELECT intake_id FROM file_intake WHERE partner_id = 'acme' AND state = 'awaiting_approval'`), 10, 64)

	const email = "rosa@example.com"
	b := signedInBrowser(t, pool, email, "reviewer")
	b.do("open the plan", chromedp.Navigate(b.base+"/plans/"+itoa(id)), chromedp.WaitVisible(chromedp.CSS("#changes")))
	if keys := eval[[]string](b, `[...document.querySelectorAll("#changes td.key")].map(td => td.textContent)`); strings.Join(keys, " ") != "(F-1) (F-2) (F-3)" {
		t.Fatalf("the plan's changes show keys %q, want F-1 F-2 F-3", keys)
	}
	// the page before the filter has a table of changes too: the filter's
	// own page is waited for (its load), not a selector
	if _, err := chromedp.RunResponse(b.ctx,
		chromedp.SendKeys(chromedp.CSS(`form.filter input[name="column"]`), "amount"),
		chromedp.Submit(chromedp.CSS(`form.filter`))); err != nil {
		t.Fatalf("filter by the amount column: %v", err)
	}
	b.do("read the filter's page", chromedp.WaitVisible(chromedp.CSS("#changes")))
	if url := eval[string](b, `location.search`); !strings.Contains(url, "column=amount") {
		t.Fatalf("the filter's page is %q, want the column in its query", url)
	}
	if keys := eval[[]string](b, `[...document.querySelectorAll("#changes td.key")].map(td => td.textContent)`); strings.Join(keys, " ") != "(F-2) (F-3)" {
		t.Fatalf("the changes of the amount column show keys %q, want F-2 F-3", keys)
	}
	if old := eval[[]string](b, `[...document.querySelectorAll("#changes .old")].map(s => s.textContent)`); strings.Join(old, " ") != "1.00 1.00" {
		t.Errorf("the amount's old values %q, want 1.00 1.00", old)
	}
	b.do("approve the plan",
		chromedp.SendKeys(chromedp.CSS(`#approve input[name="reason"]`), "two amounts corrected, one new order"),
		chromedp.Submit(chromedp.CSS(`#approve`)),
		chromedp.WaitVisible(chromedp.CSS("#done")))
	if err := d.PollOnce(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if got := one(t, pool, `SELECT state FROM file_intake WHERE intake_id = $1`, id); got != "archived" {
		t.Fatalf("the approved file is %s after the daemon's poll, want archived", got)
	}
	if got := one(t, pool, `SELECT string_agg(order_id || '=' || amount, ' ' ORDER BY order_id) FROM orders WHERE partner_id = 'acme' AND last_intake_id = $1`, id); got != "F-1=10.01 F-2=20.02 F-3=30.03" {
		t.Errorf("rows the approved file wrote: %q", got)
	}
	if got := one(t, pool, `SELECT actor FROM intake_audit WHERE intake_id = $1 AND action = 'approve'`, id); got != email {
		t.Errorf("the approval's audit names %q, want %q", got, email)
	}
}

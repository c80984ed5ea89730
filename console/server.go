package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// PageSize is how many rows a page shows.
const PageSize = 50

// csp allows nothing inline: styles come from /static only, and no page
// runs script.
const csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Deps is what the console acts with.
type Deps struct {
	Pool *pgxpool.Pool
	// Scope is what the console covers from its start; a reload changes
	// it (Server.Reload).
	Scope Scope
	// EveryReplicaPolls: affinity none, every live replica polls every
	// partner (else the one rendezvous hashing names).
	EveryReplicaPolls bool
	// Worker is the ops identity recorded as a decided row's worker.
	Worker string
	// HeldFeeds is this process's daemon's feeds held now because their
	// target table cannot be written, per partner, feed and why
	// (intake.Daemon.PartnerStates); nil: not known to the console.
	HeldFeeds func() map[string]map[string]string
	// Replay is the daemon's (intake.Daemon.Replay), what `intake replay`
	// calls; nil: the console offers no replay.
	Replay func(ctx context.Context, q intake.ReplayRequest) (*ledger.Intake, error)
	Log    *slog.Logger
}

// Scope is what of the config the console follows at a reload: the
// partners it covers and what it says of them, how it decides, and how
// a discard is told. Its reviewers and viewers are the config's lists
// (Auth), which a reload changes with it.
type Scope struct {
	// Partners the console covers (the config's).
	Partners []string
	// Polls: each partner's poll schedule (its config's poll), which says
	// when its polls are stale (ops.PollStale).
	Polls map[string]string
	// SnapshotFeeds: "partner/feed" of every snapshot feed (an approval
	// of a superseded snapshot is refused, as on the CLI).
	SnapshotFeeds []string
	// FourEyes (the config's ops.four_eyes) refuses an approval by the
	// signed-in reviewer who released the file or requested its replay,
	// on the console or on the CLI as --actor; the database's policy of
	// `intake grants --four-eyes` asks the same.
	FourEyes bool
	// Publish tells the partner about a discard right after it (nil:
	// the reconciler does, on its next round).
	Publish func(ctx context.Context, id int64) error
}

// view is what a reload changes, taken whole by each request: the scope
// and who has which role.
type view struct {
	Scope
	roles roleLists
}

// Reload makes the console follow a reloaded config: from the next
// request on it covers sc and gives roles by auth's reviewers and
// viewers, to signed-in sessions too (a session's role is judged at each
// request). The rest of auth, and the console's other settings, are the
// start's.
func (s *Server) Reload(auth Auth, sc Scope) {
	s.view.Store(&view{Scope: sc, roles: rolesOf(auth)})
}

// in is the scope the request is served in: the view its sign-in check
// took (signedIn), so that one request never mixes two reloads.
func in(r *http.Request) *view { return r.Context().Value(viewKey{}).(*view) }

// Server is the console: a lifecycle.Service on its own listener, and the
// page writer its handlers share (render, message, failed).
type Server struct {
	life  lifecycle.Base
	cfg   Config
	deps  Deps
	auth  *authn
	pages map[string]*template.Template
	mux   *http.ServeMux
	// view: what the console covers now and who has which role (Reload)
	view atomic.Pointer[view]

	ln lifecycle.Listener

	// its handlers by concern, each over this server
	signIn
	pageViews
	decisionForms
}

// New builds the console; with OIDC it reads the provider's discovery
// document (under ctx).
func New(ctx context.Context, cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a, err := newAuthn(ctx, cfg, deps.Log)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, deps: deps, auth: a, pages: map[string]*template.Template{}}
	s.view.Store(&view{Scope: deps.Scope, roles: rolesOf(cfg.Auth)})
	s.signIn, s.pageViews, s.decisionForms = signIn{s}, pageViews{s}, decisionForms{s}
	funcs := template.FuncMap{
		"text": inert.Text,
		"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"whenp": func(t *time.Time) string {
			if t == nil {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"deref": func(p *string) string {
			if p == nil {
				return "∅"
			}
			return inert.Text(*p)
		},
	}
	for _, p := range []string{"held", "partners", "file", "plans", "plan", "audit", "message", "signedin"} {
		s.pages[p] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+p+".html"))
	}
	static, _ := fs.Sub(staticFS, "static")
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /auth/login", s.login)
	m.HandleFunc("GET /auth/callback", s.callback)
	m.HandleFunc("POST /auth/logout", s.signedIn(s.logout))
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/held", http.StatusSeeOther) })
	m.HandleFunc("GET /held", s.signedIn(s.held))
	m.HandleFunc("GET /partners", s.signedIn(s.partners))
	m.HandleFunc("GET /files/{id}", s.signedIn(s.file))
	m.HandleFunc("GET /plans", s.signedIn(s.plans))
	m.HandleFunc("GET /plans/{id}", s.signedIn(s.plan))
	m.HandleFunc("GET /audit", s.signedIn(s.audit))
	m.HandleFunc("POST /files/{id}/release", s.signedIn(s.decide("release")))
	m.HandleFunc("POST /files/{id}/discard", s.signedIn(s.decide("discard")))
	m.HandleFunc("POST /plans/{id}/approve", s.signedIn(s.decide("approve")))
	m.HandleFunc("POST /plans/{id}/reject", s.signedIn(s.decide("reject")))
	m.HandleFunc("POST /files/{id}/replay", s.signedIn(s.replay))
	s.mux = m
	return s, nil
}

// Handler is the console's handler, every response with its security
// headers.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-store")
		s.mux.ServeHTTP(w, r)
	})
}

// signIn is the console's side of authentication (auth.go holds the
// protocols): sign-in and out, the callback, the signed-in gate every
// page passes, and the forms' CSRF check.
type signIn struct{ *Server }

// login starts an OpenID sign-in; while the provider's discovery has not
// been read it answers 503 with a page saying sign-in is retried.
func (s *signIn) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Auth.OIDC == nil {
		s.message(w, http.StatusUnauthorized, nil, "Sign-in required", "Sign-in is by the authenticating proxy.")
		return
	}
	oc := s.auth.client.Load()
	if oc == nil {
		s.signInDown(w)
		return
	}
	s.auth.login(w, r, oc)
}

// signInDown: the OpenID provider has not answered yet.
func (s *signIn) signInDown(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "10")
	s.message(w, http.StatusServiceUnavailable, nil, "Sign-in unavailable",
		"Sign-in unavailable, retrying: the identity provider has not answered yet. Try again in a minute.")
}

// Start listens and serves until Stop; while the OpenID provider's
// discovery has not been read, it retries it in the background.
func (s *Server) Start(ctx context.Context) error {
	ctx, err := s.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	if err := s.ln.Serve(ctx, &s.life, s.cfg.Listen, srv, s.deps.Log, "console"); err != nil {
		return err
	}
	s.deps.Log.Info("serving the review console", "addr", s.ln.Addr(), "base_url", s.cfg.BaseURL)
	if s.cfg.Auth.OIDC != nil && s.auth.client.Load() == nil {
		s.life.Go(func() { s.auth.rediscover(ctx, s.deps.Log) })
	}
	return nil
}

// Stop shuts the listener down and waits for the server's goroutines.
func (s *Server) Stop() { s.life.Stop() }

// Addr is the listener's address once started ("" before).
func (s *Server) Addr() string { return s.ln.Addr() }

type (
	ctxKey  struct{}
	viewKey struct{}
)

func identityOf(r *http.Request) *Identity { return r.Context().Value(ctxKey{}).(*Identity) }

// signedIn serves h only to a signed-in identity with a role: a browser
// without one is sent to sign in (OIDC) or refused (proxy).
func (s *signIn) signedIn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := s.view.Load()
		id, err := s.auth.identify(r, &v.roles)
		if errors.Is(err, errNoRole) {
			s.message(w, http.StatusForbidden, nil, "Not allowed", "This identity has no console role (viewer or reviewer).")
			return
		}
		if id == nil {
			if s.cfg.Auth.OIDC != nil && r.Method == http.MethodGet {
				http.Redirect(w, r, "/auth/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
				return
			}
			s.message(w, http.StatusUnauthorized, nil, "Sign-in required", "Sign in to use the console.")
			return
		}
		ctx := context.WithValue(context.WithValue(r.Context(), ctxKey{}, id), viewKey{}, v)
		h(w, r.WithContext(ctx))
	}
}

func (s *signIn) callback(w http.ResponseWriter, r *http.Request) {
	next, err := s.auth.callback(w, r, &s.view.Load().roles)
	if errors.Is(err, errSignInDown) {
		s.signInDown(w)
		return
	}
	if err != nil {
		// the reason is ours (no token or claim text)
		s.deps.Log.Warn("console sign-in refused", "err", err)
		s.message(w, http.StatusForbidden, nil, "Sign-in refused", err.Error())
		return
	}
	// a page of the console's own, not a redirect: the callback is
	// reached from the provider's site, and a browser sends the
	// SameSite=Strict session cookie only on a navigation that starts on
	// the console's (the page's refresh and link do)
	s.render(w, http.StatusOK, "signedin", page{Title: "Signed in", Data: next})
}

func (s *signIn) logout(w http.ResponseWriter, r *http.Request) {
	if !s.csrfOK(r) {
		s.message(w, http.StatusForbidden, identityOf(r), "Refused", "The form's CSRF token is missing or wrong.")
		return
	}
	s.auth.clearCookie(w, sessionCookie)
	s.message(w, http.StatusOK, nil, "Signed out", "You are signed out.")
}

// page is what every template gets.
type page struct {
	Me    *Identity
	Title string
	Data  any
}

func (s *Server) render(w http.ResponseWriter, status int, name string, p page) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.pages[name].Execute(w, p); err != nil {
		s.deps.Log.Error("console render", "page", name, "err", err)
	}
}

type messageData struct{ Text string }

func (s *Server) message(w http.ResponseWriter, status int, me *Identity, title, text string) {
	s.render(w, status, "message", page{Me: me, Title: title, Data: messageData{text}})
}

func (s *Server) failed(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.deps.Log.Error("console read", "what", what, "err", err)
	s.message(w, http.StatusInternalServerError, identityOf(r), "Error", "The database could not be read; try again.")
}

func pageArg(r *http.Request) int {
	n, err := strconv.Atoi(r.URL.Query().Get("page"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// pager is a page's position among total rows.
type pager struct {
	Page, Pages int
	Total       int64
	Prev, Next  string // links ("" when none)
}

func newPager(u *url.URL, pageNo int, total int64) pager {
	pages := int((total + PageSize - 1) / PageSize)
	p := pager{Page: pageNo, Pages: max(pages, 1), Total: total}
	link := func(n int) string {
		q := u.Query()
		q.Set("page", strconv.Itoa(n))
		return u.Path + "?" + q.Encode()
	}
	if pageNo > 1 {
		p.Prev = link(pageNo - 1)
	}
	if pageNo < pages {
		p.Next = link(pageNo + 1)
	}
	return p
}

// pageViews serves the pages that read: held files, partners, a file's
// story, the plans waiting and one plan, the audit log (the reads are
// intake/ledger/console.go's and intake/ops').
type pageViews struct{ *Server }

func (s *pageViews) held(w http.ResponseWriter, r *http.Request) {
	n := pageArg(r)
	items, total, err := ops.HeldPage(r.Context(), s.deps.Pool, in(r).Partners, (n-1)*PageSize, PageSize)
	if err != nil {
		s.failed(w, r, "held", err)
		return
	}
	s.render(w, http.StatusOK, "held", page{Me: identityOf(r), Title: "Held files", Data: struct {
		Items []ledger.QuarantineItem
		Pager pager
	}{items, newPager(r.URL, n, total)}})
}

// partnerView is one partner as the partners page shows it.
type partnerView struct {
	ops.StatusRow
	State string // "up", "failing", "stale: …", "not polled yet"
	// Everyone: every live replica polls the partner (affinity none)
	Everyone  bool
	HeldFeeds []heldFeed
	// HeldKnown: the console runs beside a daemon that says which feeds
	// it holds.
	HeldKnown  bool
	NeedsHuman int
	Capability string
}

type heldFeed struct{ Feed, Why string }

// partners serves the partners page: what `intake status` reads (through
// ops.Status), per partner: its state by its last polls, the replica that
// polls it, held files and waiting plans, late delivery windows, the
// feeds this process's daemon holds, the server's measured capability and
// the last poll error. No cell value is on it: a viewer sees it.
func (s *pageViews) partners(w http.ResponseWriter, r *http.Request) {
	sc := in(r)
	polls := sc.Polls
	rows, err := ops.Status(r.Context(), s.deps.Pool, sc.Partners)
	if err != nil {
		s.failed(w, r, "partners", err)
		return
	}
	var held map[string]map[string]string
	if s.deps.HeldFeeds != nil {
		held = s.deps.HeldFeeds()
	}
	views := make([]partnerView, len(rows))
	now := time.Now()
	for i, row := range rows {
		v := partnerView{StatusRow: row, HeldKnown: s.deps.HeldFeeds != nil, Everyone: s.deps.EveryReplicaPolls}
		switch {
		case row.LastOK == nil && row.LastError == nil:
			v.State = "not polled yet"
		case row.LastError != nil && (row.LastOK == nil || row.LastError.After(*row.LastOK)):
			v.State = "failing"
		case polls != nil && ops.PollStale(polls[row.Partner], row.LastOK, now):
			v.State = "stale: no poll since the one its schedule had due"
		default:
			v.State = "up"
		}
		for feed, why := range held[row.Partner] {
			v.HeldFeeds = append(v.HeldFeeds, heldFeed{feed, why})
		}
		slices.SortFunc(v.HeldFeeds, func(a, b heldFeed) int { return strings.Compare(a.Feed, b.Feed) })
		for _, f := range row.Findings {
			if f.NeedsHuman {
				v.NeedsHuman++
			}
		}
		if row.Site != nil {
			v.Capability = row.Site.Profile.String()
		}
		views[i] = v
	}
	s.render(w, http.StatusOK, "partners", page{Me: identityOf(r), Title: "Partners", Data: views})
}

func pathID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return id, err == nil && id > 0
}

func (s *pageViews) file(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(r)
	if !ok {
		s.message(w, http.StatusNotFound, identityOf(r), "Not found", "No such file.")
		return
	}
	st, err := ops.Story(r.Context(), s.deps.Pool, id, in(r).Partners)
	if err != nil {
		s.failed(w, r, "file", err)
		return
	}
	if st == nil {
		s.message(w, http.StatusNotFound, identityOf(r), "Not found", fmt.Sprintf("No intake %d among the configured partners.", id))
		return
	}
	audit, err := ops.AuditPage(r.Context(), s.deps.Pool, in(r).Partners, ledger.AuditFilter{IntakeID: id}, 0, PageSize)
	if err != nil {
		s.failed(w, r, "file audit", err)
		return
	}
	s.render(w, http.StatusOK, "file", page{Me: identityOf(r), Title: fmt.Sprintf("Intake %d", id), Data: struct {
		S       *ledger.FileStory
		Info    ledger.StateInfo // of its state: Holding (not decided yet), the reports are an earlier decision's; InQuarantine, the archive path is its place there
		Audit   []ledger.AuditEntry
		Held    bool
		Waiting bool
		Replay  bool
		Done    string
	}{st, ledger.State(st.State).Info(), audit, st.QState == "open", st.State == string(ledger.StateAwaitingApproval),
		s.deps.Replay != nil && (st.State == string(ledger.StateArchived) || st.State == string(ledger.StateDuplicate)),
		recorded(audit, r.URL.Query().Get("request"))}})
}

// recorded is request when the file's audit holds a decision under it
// (the page a decision lands on says it was recorded), else "": a link
// naming another request, or none, claims nothing.
func recorded(audit []ledger.AuditEntry, request string) string {
	if request == "" {
		return ""
	}
	for _, a := range audit {
		if a.Request == request {
			return request
		}
	}
	return ""
}

func (s *pageViews) plans(w http.ResponseWriter, r *http.Request) {
	n := pageArg(r)
	ps, total, err := ops.WaitingPlans(r.Context(), s.deps.Pool, in(r).Partners, (n-1)*PageSize, PageSize)
	if err != nil {
		s.failed(w, r, "plans", err)
		return
	}
	type row struct {
		ledger.WaitingPlan
		C target.PlanCounts
	}
	rows := make([]row, len(ps))
	for i, p := range ps {
		rows[i].WaitingPlan = p
		json.Unmarshal(p.Counts, &rows[i].C) // counts intake wrote; a bad one shows zeros
	}
	s.render(w, http.StatusOK, "plans", page{Me: identityOf(r), Title: "Plans waiting for approval", Data: struct {
		Rows  []row
		Pager pager
	}{rows, newPager(r.URL, n, total)}})
}

// actions a plan's changes can be filtered by.
var changeActions = []string{"", "create", "update", "delete", "conflict", "rejected"}

func (s *pageViews) plan(w http.ResponseWriter, r *http.Request) {
	me := identityOf(r)
	id, ok := pathID(r)
	if !ok {
		s.message(w, http.StatusNotFound, me, "Not found", "No such plan.")
		return
	}
	q := r.URL.Query()
	f := ledger.ChangeFilter{Action: q.Get("action"), Key: q.Get("key"), KeyExact: q.Get("match") == "exact", Column: q.Get("column")}
	found := false
	for _, a := range changeActions {
		found = found || a == f.Action
	}
	if !found {
		f.Action = ""
	}
	after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
	before, _ := strconv.ParseInt(q.Get("before"), 10, 64)
	// the counts, and the page of changes beside them (one snapshot): a
	// viewer sees counts only, the changes' keys and values are cell
	// values, not read from the database for them at all
	limit := 0
	if me.Reviewer() {
		limit = PageSize + 1
	}
	v, rows, err := ops.PlanPage(r.Context(), s.deps.Pool, id, in(r).Partners, f, max(after, 0), max(before, 0), limit)
	if err != nil {
		s.failed(w, r, "plan", err)
		return
	}
	if v == nil || v.Hash == "" {
		s.message(w, http.StatusNotFound, me, "Not found", fmt.Sprintf("Intake %d has no plan among the configured partners.", id))
		return
	}
	if h := q.Get("plan"); h != "" && h != v.Hash {
		// a page after the first, of a plan planned again since: its
		// changes are another plan's than the pages read before
		s.message(w, http.StatusConflict, me, "Plan changed",
			fmt.Sprintf("The plan of intake %d was planned again since the page before: read it again from its first page (/plans/%d).", id, id))
		return
	}
	var c target.PlanCounts
	json.Unmarshal(v.Counts, &c) // counts intake wrote; a bad one shows zeros
	var changes []planChange
	var kp keysetPager
	if me.Reviewer() {
		kp = newKeysetPager(r.URL, rows, after, before, v.Hash)
		if len(rows) > PageSize {
			if before > 0 {
				rows = rows[1:] // the extra row is the earliest
			} else {
				rows = rows[:PageSize]
			}
		}
		for _, row := range rows {
			ch := planChange{PlanChangeRow: row}
			json.Unmarshal(row.Changed, &ch.Cols) // values intake wrote; a bad one shows none
			changes = append(changes, ch)
		}
	}
	s.render(w, http.StatusOK, "plan", page{Me: me, Title: fmt.Sprintf("Plan of intake %d", id), Data: struct {
		V        *ledger.PlanView
		C        target.PlanCounts
		Total    int64
		Filtered bool
		Changes  []planChange
		Pager    keysetPager
		F        ledger.ChangeFilter
		Actions  []string
		Waiting  bool
	}{v, c, c.Creates + c.Updates + c.Deletes + c.Conflicts() + c.NotFound + c.Duplicates, f != (ledger.ChangeFilter{}),
		changes, kp, f, changeActions[1:], v.State == string(ledger.StateAwaitingApproval)}})
}

// planChange is a row of a plan's changes table.
type planChange struct {
	ledger.PlanChangeRow
	Cols map[string][2]*string
}

// keysetPager links a keyset-paged table's first, previous and next
// pages (by the seq of the rows shown), the filters kept.
type keysetPager struct {
	First, Prev, Next string
}

// newKeysetPager: rows is the page as read, one more than PageSize when
// there is more in the direction it was read (after: later; before:
// earlier), of the plan whose hash is plan: the first, previous and next
// pages name it, and are refused once the file is planned again.
func newKeysetPager(u *url.URL, rows []ledger.PlanChangeRow, after, before int64, plan string) keysetPager {
	link := func(k string, seq int64) string {
		q := u.Query()
		q.Del("after")
		q.Del("before")
		q.Del("page")
		q.Set("plan", plan) // the first page too: it is refused once the plan changed
		if k != "" {
			q.Set(k, strconv.FormatInt(seq, 10))
		}
		if len(q) == 0 {
			return u.Path
		}
		return u.Path + "?" + q.Encode()
	}
	var p keysetPager
	more := len(rows) > PageSize
	shown := rows
	if more && before > 0 {
		shown = rows[1:]
	} else if more {
		shown = rows[:PageSize]
	}
	if after > 0 || before > 0 {
		p.First = link("", 0)
	}
	if len(shown) == 0 {
		return p
	}
	if (before > 0 && more) || (before == 0 && after > 0) {
		p.Prev = link("before", shown[0].Seq)
	}
	if (before == 0 && more) || before > 0 {
		p.Next = link("after", shown[len(shown)-1].Seq)
	}
	return p
}

func (s *pageViews) audit(w http.ResponseWriter, r *http.Request) {
	n := pageArg(r)
	q := r.URL.Query()
	fileID, _ := strconv.ParseInt(q.Get("intake"), 10, 64)
	request, text := q.Get("request"), q.Get("q")
	es, err := ops.AuditPage(r.Context(), s.deps.Pool, in(r).Partners,
		ledger.AuditFilter{IntakeID: max(fileID, 0), Request: request, Text: text}, (n-1)*PageSize, PageSize+1)
	if err != nil {
		s.failed(w, r, "audit", err)
		return
	}
	pg := pager{Page: n}
	u := *r.URL
	if len(es) > PageSize {
		es = es[:PageSize]
		q.Set("page", strconv.Itoa(n+1))
		u.RawQuery = q.Encode()
		pg.Next = u.RequestURI()
	}
	if n > 1 {
		q.Set("page", strconv.Itoa(n-1))
		u.RawQuery = q.Encode()
		pg.Prev = u.RequestURI()
	}
	s.render(w, http.StatusOK, "audit", page{Me: identityOf(r), Title: "Audit log", Data: struct {
		Entries []ledger.AuditEntry
		Pager   pager
		Intake  int64
		Request string
		Text    string
	}{es, pg, fileID, request, text}})
}

// csrfOK: the form carries the identity's CSRF token.
func (s *signIn) csrfOK(r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && hmac.Equal([]byte(got), []byte(identityOf(r).CSRF))
}

func newRequestID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return "req-" + hex.EncodeToString(b[:])
}

// decisionForms serves the forms that decide: release, discard, approve,
// reject (through intake/ops), and a replay (through the daemon).
type decisionForms struct{ *Server }

// reviewerPost admits a form posted to act on a file: its body bounded,
// its CSRF token the identity's, the identity a reviewer's, the file's id
// in the path. Refused, it answers the page itself (ok false). verb and
// does name the act in the refusal ("decide", "decides").
func (s *decisionForms) reviewerPost(w http.ResponseWriter, r *http.Request, verb, does string) (me *Identity, id int64, ok bool) {
	me = identityOf(r)
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !s.csrfOK(r) {
		s.message(w, http.StatusForbidden, me, "Refused", "The form's CSRF token is missing or wrong: reload the page and "+verb+" again.")
		return me, 0, false
	}
	if !me.Reviewer() {
		s.message(w, http.StatusForbidden, me, "Refused", "Only a reviewer "+does+".")
		return me, 0, false
	}
	if id, ok = pathID(r); !ok {
		s.message(w, http.StatusNotFound, me, "Not found", "No such file.")
		return me, 0, false
	}
	return me, id, true
}

// decide serves a decision form: a reviewer's, with its CSRF token,
// through the intake/ops function the CLI calls, under a fresh request id
// recorded on the audit row, with the signed-in identity as the actor.
func (s *decisionForms) decide(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		me, id, ok := s.reviewerPost(w, r, "decide", "decides")
		if !ok {
			return
		}
		reason := r.PostFormValue("reason")
		request := newRequestID()
		ctx := r.Context()
		sc := in(r)
		var err error
		switch action {
		case "release", "discard":
			d := ops.Decision{IntakeID: id, Actor: me.Name, Reason: reason, Winner: r.PostFormValue("winner"),
				Partners: sc.Partners, Worker: s.deps.Worker, Request: request, Hold: r.PostFormValue("hold")}
			if d.Hold == "" {
				err = fmt.Errorf("%w: the form names no hold: reload the file's page and decide again", ledger.ErrDecision)
			} else {
				if action == "release" {
					// a batch conflict released with the older file as
					// the winner discards this one
					err = ops.Release(ctx, s.deps.Pool, d)
				} else {
					err = ops.Discard(ctx, s.deps.Pool, d)
				}
				if err == nil && sc.Publish != nil {
					// publishes a discard the decision made, nothing else
					if perr := sc.Publish(ctx, id); perr != nil {
						// the decision stands; the reconciler publishes it
						s.deps.Log.Warn("console "+action+": publishing left to the reconciler", "intake_id", id, "request", request, "err", perr)
					}
				}
			}
		case "approve", "reject":
			d := ledger.PlanDecision{IntakeID: id, Partners: sc.Partners, Actor: me.Name, Reason: reason,
				PlanHash: r.PostFormValue("plan_hash"), SnapshotFeeds: sc.SnapshotFeeds, Request: request,
				FourEyes: sc.FourEyes, SharedLogin: true}
			switch {
			case d.PlanHash == "":
				err = fmt.Errorf("%w: the form names no plan: reload the plan's page and decide again", ledger.ErrPlanDecision)
			case action == "approve":
				err = ops.Approve(ctx, s.deps.Pool, d)
			default:
				err = ops.Reject(ctx, s.deps.Pool, d)
			}
		}
		if errors.Is(err, ledger.ErrDecision) || errors.Is(err, ledger.ErrPlanDecision) {
			s.message(w, http.StatusConflict, me, "Refused", fmt.Sprintf("%s of intake %d refused (request %s): %v", action, id, request, err))
			return
		}
		if err != nil {
			s.deps.Log.Error("console decision", "action", action, "intake_id", id, "request", request, "err", err)
			s.message(w, http.StatusInternalServerError, me, "Error",
				fmt.Sprintf("%s of intake %d failed (request %s): the audit log under that request says whether it was recorded.", action, id, request))
			return
		}
		s.deps.Log.Info("console decision", "action", action, "intake_id", id, "request", request, "actor", me.Name)
		http.Redirect(w, r, fmt.Sprintf("/files/%d?request=%s", id, request), http.StatusSeeOther)
	}
}

// replay serves the replay form of a finished file: a reviewer's, with its
// CSRF token, through the daemon's Replay, which `intake replay` calls,
// under a fresh request id recorded on the replay's audit row with the
// signed-in identity as the actor. The replay is recorded and handed to
// a daemon (the next reconcile run takes it over), not run inside the
// request. Its rules are the CLI's: a file that is not finished, a
// snapshot superseded since, a second replay while one is live are
// refused (409).
func (s *decisionForms) replay(w http.ResponseWriter, r *http.Request) {
	me, id, ok := s.reviewerPost(w, r, "replay", "replays")
	if !ok {
		return
	}
	if s.deps.Replay == nil {
		s.message(w, http.StatusServiceUnavailable, me, "Unavailable", "This console replays nothing: replay with intake replay.")
		return
	}
	request := newRequestID()
	in, err := s.deps.Replay(r.Context(), intake.ReplayRequest{ID: id, Actor: me.Name, Reason: r.PostFormValue("reason"),
		Request: request, Handover: true})
	if errors.Is(err, ledger.ErrDecision) {
		s.message(w, http.StatusConflict, me, "Refused", fmt.Sprintf("replay of intake %d refused (request %s): %v", id, request, err))
		return
	}
	if err != nil || in == nil {
		s.deps.Log.Error("console replay", "intake_id", id, "request", request, "err", err)
		s.message(w, http.StatusInternalServerError, me, "Error",
			fmt.Sprintf("replay of intake %d failed (request %s): the audit log under that request says whether it was recorded.", id, request))
		return
	}
	s.deps.Log.Info("console decision", "action", "replay", "intake_id", id, "replay_id", in.ID, "request", request, "actor", me.Name)
	http.Redirect(w, r, fmt.Sprintf("/files/%d?request=%s", in.ID, request), http.StatusSeeOther)
}

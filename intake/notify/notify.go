// Package notify delivers the outbox's events to webhooks. Events are written by intake/ledger in the transaction of the state
// change that causes them; this service, run by every replica (leader-free),
// fans each event out to the endpoints subscribed to it, claims due
// deliveries with FOR UPDATE SKIP LOCKED and a lease, POSTs them signed,
// and retries with exponential backoff until the receiver answers 2xx or
// the delivery's budget (notify_delivery.budget, default 72h) is spent,
// when it is marked dead, counted and alerted — never dropped silently.
//
// Delivery is at least once: a replica that dies after the POST and
// before recording it leaves the lease to expire and the delivery is sent
// again, with the same body and event id. Receivers deduplicate on the
// event id (Intake-Event-Id).
//
// Where a delivery goes is the config's business, never the database's: a
// delivery row names its endpoint by id only, and the URL and the secrets
// are those of that id in the config in force when it is sent. A row
// naming an id the config does not know (among the global webhooks and
// its partner's) is not sent: it is marked dead with the reason, logged
// and counted (result="refused").
//
// Signature (docs/design.md "Notifications"): header
// `Intake-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`,
// with one v1= per secret the endpoint names (a rotation); the body
// carries the endpoint's id, so a request cannot be replayed to another
// endpoint unnoticed.
package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/partners"
)

// Config is notify_delivery: how the events are delivered.
type Config struct {
	// Timeout bounds one POST (default 10s).
	Timeout time.Duration `yaml:"timeout"`
	// MinBackoff is the wait after the first failed attempt (default 5s);
	// it doubles per attempt up to MaxBackoff (default 15m), ±20 %.
	MinBackoff time.Duration `yaml:"min_backoff"`
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// Budget: a delivery still failing this long after it was first due
	// is marked dead (default 72h).
	Budget time.Duration `yaml:"budget"`
	// Poll is how often each replica looks for due deliveries (default 2s).
	Poll time.Duration `yaml:"poll"`
	// Keep is how long delivered and dead events stay in the outbox (default 720h).
	Keep time.Duration `yaml:"keep"`
	// ConsoleURL is the review console's base URL (console.base_url) when
	// the console is served: a file's event then carries its page,
	// console_url (Body). Not a key of notify_delivery.
	ConsoleURL string `yaml:"-"`
}

// Validate fills defaults and checks bounds.
func (c *Config) Validate() error {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Timeout, 10*time.Second)
	def(&c.MinBackoff, 5*time.Second)
	def(&c.MaxBackoff, 15*time.Minute)
	def(&c.Budget, 72*time.Hour)
	def(&c.Poll, 2*time.Second)
	def(&c.Keep, 720*time.Hour)
	switch {
	case c.Timeout < 100*time.Millisecond || c.Timeout > 5*time.Minute:
		return fmt.Errorf("notify_delivery.timeout: %s must be between 100ms and 5m", c.Timeout)
	case c.MinBackoff < 10*time.Millisecond || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("notify_delivery: min_backoff must be at least 10ms and max_backoff at least min_backoff")
	case c.Budget < c.MaxBackoff:
		return fmt.Errorf("notify_delivery.budget: %s must be at least max_backoff", c.Budget)
	case c.Poll < 10*time.Millisecond || c.Poll > time.Minute:
		return fmt.Errorf("notify_delivery.poll: %s must be between 10ms and 1m", c.Poll)
	case c.Keep < c.Budget:
		return fmt.Errorf("notify_delivery.keep: %s must be at least budget", c.Keep)
	}
	return nil
}

// Lease is how long a claimed delivery is held before another replica may
// send it again: a claim's deliveries go out senders at a time, so the
// last of them may start claimBatch/senders timeouts after the claim.
func (c Config) Lease() time.Duration {
	return time.Duration(claimBatch/senders+1)*c.Timeout + 5*time.Second
}

// Limits of one pass.
const (
	fanOutBatch = 200
	claimBatch  = 16
	senders     = 4
	// DeadShownFor: intake_notify_dead counts deliveries that died within it.
	DeadShownFor = 24 * time.Hour
)

// Service is the delivery service.
type Service struct {
	life   lifecycle.Base
	ledger *ledger.Ledger
	worker string
	cfg    Config
	log    *slog.Logger
	client *http.Client

	mu     sync.Mutex
	global []partners.Notify
	per    map[string][]partners.Notify

	deliveries *prometheus.CounterVec
	pending    prometheus.Gauge
	oldest     prometheus.Gauge
	dead       prometheus.Gauge
	errs       prometheus.Counter
	lastPurge  time.Time
}

// New returns a stopped delivery service (cfg validated).
func New(db *pgxpool.Pool, worker string, cfg Config, global []partners.Notify, parts []partners.Config, reg prometheus.Registerer, log *slog.Logger) *Service {
	s := &Service{ledger: ledger.New(db, 0), worker: worker, cfg: cfg, log: log.With("component", "notify"),
		client: &http.Client{Timeout: cfg.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	s.SetConfig(global, parts)
	s.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "intake_notify_deliveries_total",
		Help: "Webhook delivery attempts by event and result: delivered, failed (retried later), dead (budget spent), refused (endpoint id not in the config: not sent, marked dead)."}, []string{"event", "result"})
	s.pending = prometheus.NewGauge(prometheus.GaugeOpts{Name: "intake_notify_pending",
		Help: "Webhook deliveries not yet delivered (cluster-wide, from the database)."})
	s.oldest = prometheus.NewGauge(prometheus.GaugeOpts{Name: "intake_notify_oldest_pending_age_seconds",
		Help: "Age of the oldest event with a delivery pending (cluster-wide)."})
	s.dead = prometheus.NewGauge(prometheus.GaugeOpts{Name: "intake_notify_dead",
		Help: "Webhook deliveries marked dead (retry budget spent) within the last 24h (cluster-wide)."})
	s.errs = prometheus.NewCounter(prometheus.CounterOpts{Name: "intake_notify_errors_total",
		Help: "Outbox statements that failed (fan-out, claim, record); retried at the next poll."})
	reg.MustRegister(s.deliveries, s.pending, s.oldest, s.dead, s.errs)
	return s
}

// SetConfig makes global and the partners' webhooks those of events fanned
// out from now on (a reload), and those every delivery is sent to from now
// on: a delivery keeps its endpoint's id, and is sent to the URL, signed
// with the secrets, that id has in the config in force.
func (s *Service) SetConfig(global []partners.Notify, parts []partners.Config) {
	per := map[string][]partners.Notify{}
	for _, p := range parts {
		per[p.ID] = p.Notify
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.global, s.per = global, per
}

// MissingSecrets names the secret_env and secret_envs variables of the
// webhooks that are not set (intake run refuses to start with any).
func MissingSecrets(global []partners.Notify, parts []partners.Config) []string {
	var out []string
	seen := map[string]bool{}
	check := func(ns []partners.Notify) {
		for _, n := range ns {
			for _, env := range n.Secrets() {
				if os.Getenv(env) == "" && !seen[env] {
					seen[env] = true
					out = append(out, env)
				}
			}
		}
	}
	check(global)
	for _, p := range parts {
		check(p.Notify)
	}
	return out
}

func (s *Service) route(ev ledger.OutboxEvent) []ledger.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ledger.Endpoint
	for _, list := range [][]partners.Notify{s.global, s.per[ev.Partner]} {
		for _, n := range list {
			if n.Wants(ev.Event) {
				out = append(out, ledger.Endpoint{ID: n.EndpointID()})
			}
		}
	}
	return out
}

// endpoint is the webhook a delivery of partner's event names by id in
// the config in force: a global one, else one of the partner's
// (partners.LookupNotify: an id derived from a configured URL still finds
// that webhook once it has an id of its own).
func (s *Service) endpoint(partner, id string) (partners.Notify, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return partners.LookupNotify(id, s.global, s.per[partner])
}

// Start runs the passes every poll until Stop.
func (s *Service) Start(ctx context.Context) error {
	ctx, err := s.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	s.life.Go(func() { lifecycle.RunEvery(ctx, s.cfg.Poll, func() { s.RunOnce(ctx) }) })
	return nil
}

// Stop ends the passes; a POST in flight is cancelled (its delivery is
// claimed again after its lease).
func (s *Service) Stop() { s.life.Stop() }

// RunOnce fans out new events, delivers what is due (several batches while
// there are more) and refreshes the gauges.
func (s *Service) RunOnce(ctx context.Context) {
	for i := 0; i < 10; i++ {
		n, err := s.ledger.FanOut(ctx, fanOutBatch, s.route)
		if err != nil {
			s.fail(ctx, "fan-out", err)
			break
		}
		if n < fanOutBatch {
			break
		}
	}
	for i := 0; i < 10 && ctx.Err() == nil; i++ {
		ds, err := s.ledger.ClaimDeliveries(ctx, s.worker, s.cfg.Lease(), claimBatch)
		if err != nil {
			s.fail(ctx, "claim", err)
			break
		}
		s.sendAll(ctx, ds)
		if len(ds) < claimBatch {
			break
		}
	}
	if g, err := s.ledger.OutboxState(ctx, DeadShownFor); err != nil {
		s.fail(ctx, "gauges", err)
	} else {
		s.pending.Set(float64(g.Pending))
		s.oldest.Set(g.OldestPendingAge.Seconds())
		s.dead.Set(float64(g.DeadRecent))
	}
	if time.Since(s.lastPurge) > 10*time.Minute {
		s.lastPurge = time.Now()
		if _, err := s.ledger.PurgeOutbox(ctx, s.cfg.Keep, 1000); err != nil {
			s.fail(ctx, "purge", err)
		}
	}
}

func (s *Service) fail(ctx context.Context, step string, err error) {
	if ctx.Err() != nil {
		return
	}
	s.errs.Inc()
	s.log.Error("notify: outbox statement failed", "step", step, "err", pgerr.Redact(err))
}

func (s *Service) sendAll(ctx context.Context, ds []ledger.Delivery) {
	sem := make(chan struct{}, senders)
	var wg sync.WaitGroup
	for _, d := range ds {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.deliver(ctx, d)
		}()
	}
	wg.Wait()
}

// deliver POSTs one delivery and records the outcome.
func (s *Service) deliver(ctx context.Context, d ledger.Delivery) {
	n, known := s.endpoint(d.Partner, d.EndpointID)
	if !known {
		reason := fmt.Sprintf("endpoint %q is not in the config (of partner %s or global): not sent", d.EndpointID, d.Partner)
		if err := s.ledger.RefuseDelivery(ctx, d, s.worker, reason); err != nil {
			if !errors.Is(err, ledger.ErrDeliveryLost) {
				s.fail(ctx, "refuse", err)
			}
			return
		}
		s.deliveries.WithLabelValues(d.Event, "refused").Inc()
		s.log.Error("notification refused: its endpoint is not in the config", "partner", d.Partner, "event", d.Event,
			"event_id", d.EventID, "endpoint_id", d.EndpointID)
		return
	}
	status, err := s.post(ctx, d, n, time.Now())
	if ctx.Err() != nil {
		return // stopping: the lease runs out and the delivery is sent again
	}
	log := s.log.With("partner", d.Partner, "event", d.Event, "event_id", d.EventID, "endpoint_id", d.EndpointID, "endpoint", ShownURL(n.URL), "attempt", d.Attempt)
	if err == nil {
		if aerr := s.ledger.AckDelivery(ctx, d, s.worker, status); aerr != nil && !errors.Is(aerr, ledger.ErrDeliveryLost) {
			s.fail(ctx, "ack", aerr)
			return
		}
		s.deliveries.WithLabelValues(d.Event, "delivered").Inc()
		log.Debug("notification delivered", "status", status)
		return
	}
	dead, ferr := s.ledger.FailDelivery(ctx, d, s.worker, status, err.Error(), s.backoff(d.Attempt), s.cfg.Budget)
	if ferr != nil {
		if !errors.Is(ferr, ledger.ErrDeliveryLost) {
			s.fail(ctx, "record failure", ferr)
		}
		return
	}
	if dead {
		s.deliveries.WithLabelValues(d.Event, "dead").Inc()
		log.Error("notification dead: the retry budget is spent", "status", status, "err", err.Error(), "budget", s.cfg.Budget.String())
		return
	}
	s.deliveries.WithLabelValues(d.Event, "failed").Inc()
	log.Warn("notification failed; retrying later", "status", status, "err", err.Error())
}

// backoff after the attempt-th failed attempt: MinBackoff doubled per
// attempt, at most MaxBackoff, ±20 %.
func (s *Service) backoff(attempt int) time.Duration {
	b := s.cfg.MinBackoff
	for i := 1; i < attempt && b < s.cfg.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, s.cfg.MaxBackoff)
	return time.Duration(float64(b) * (0.8 + 0.4*rand.Float64()))
}

// Body is the JSON document POSTed for a delivery; the same bytes on
// every attempt while the config stands. It names the endpoint it is
// meant for (endpoint: its id), under the signature: a receiver refuses a
// body naming another. With console (the review console's base URL) an
// event about a file (its data names an intake_id) carries that file's
// page in the console, console_url.
func Body(d ledger.Delivery, console string) []byte {
	page := ""
	if console != "" {
		var f struct {
			IntakeID int64 `json:"intake_id"`
		}
		if json.Unmarshal(d.Payload, &f) == nil && f.IntakeID > 0 {
			page = strings.TrimRight(console, "/") + "/files/" + strconv.FormatInt(f.IntakeID, 10)
		}
	}
	b, _ := json.Marshal(struct {
		ID         int64           `json:"id"`
		Event      string          `json:"event"`
		Partner    string          `json:"partner"`
		Endpoint   string          `json:"endpoint"`
		OccurredAt string          `json:"occurred_at"`
		ConsoleURL string          `json:"console_url,omitempty"`
		Data       json.RawMessage `json:"data"`
	}{d.EventID, d.Event, d.Partner, d.EndpointID, d.CreatedAt.UTC().Format(time.RFC3339Nano), page, d.Payload})
	return b
}

// Sign is the Intake-Signature header value for body at t: t= and one
// v1= per secret, in order.
func Sign(secrets [][]byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	out := "t=" + ts
	for _, secret := range secrets {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(ts))
		m.Write([]byte{'.'})
		m.Write(body)
		out += ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	return out
}

// errStatus is a receiver's answer other than 2xx.
type errStatus int

func (e errStatus) Error() string { return fmt.Sprintf("receiver answered %d", int(e)) }

// post sends d to n, the endpoint its id names in the config.
func (s *Service) post(ctx context.Context, d ledger.Delivery, n partners.Notify, now time.Time) (int, error) {
	var secrets [][]byte
	for _, env := range n.Secrets() {
		secret := os.Getenv(env)
		if secret == "" {
			return 0, fmt.Errorf("secret_env %s is not set: nothing is sent unsigned", env)
		}
		secrets = append(secrets, []byte(secret))
	}
	body := Body(d, s.cfg.ConsoleURL)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "partner-intake")
	req.Header.Set("Intake-Event", d.Event)
	req.Header.Set("Intake-Event-Id", strconv.FormatInt(d.EventID, 10))
	req.Header.Set("Intake-Endpoint", d.EndpointID)
	req.Header.Set("Intake-Delivery-Attempt", strconv.Itoa(d.Attempt))
	req.Header.Set("Intake-Signature", Sign(secrets, now, body))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, errors.New(transportError(err))
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, errStatus(resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// transportError is err without the URL (whose query may carry a token).
func transportError(err error) string {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner.Error()
		}
	}
	return "request failed"
}

// ShownURL is the URL as logs show it, and as `notify dead` lists it,
// which redeliver takes back: its scheme and host, "/…" for a path or
// query (the receiver's token, Slack's or Teams'), and 8 hex digits of the
// whole URL's md5 that tell two endpoints of one host apart.
func ShownURL(raw string) string {
	sum := md5.Sum([]byte(raw))
	return urlRest.ReplaceAllString(raw, "$1/…") + " #" + hex.EncodeToString(sum[:4])
}

// urlRest matches a URL with a path or query after its host.
var urlRest = regexp.MustCompile(`^(?i)([a-z][a-z0-9+.-]*://[^/?#]*)[/?#].+$`)

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
)

func defaultActor() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

// quarantineCommand is `intake quarantine`.
func quarantineCommand() *cobra.Command {
	var f quarantineFlags
	cmd := &cobra.Command{
		Use:         "quarantine list|show ID|release ID|discard ID --config FILE [--hold TOKEN --reason TEXT] [--actor NAME] [--winner new|old]",
		Short:       "review held files; every decision is audited",
		Example:     `intake quarantine release 42 --hold lk2ml8b4x9c --config /etc/intake/intake.yaml --reason "partner confirmed the resend"`,
		Annotations: map[string]string{annSubs: "list show release discard"},
	}
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.StringVar(&f.partner, "partner", "", "list: only this partner")
	fs.BoolVar(&f.openOnly, "open", false, "list: only files still waiting for a decision")
	fs.StringVar(&f.reason, "reason", "", "release/discard: why (audited)")
	fs.StringVar(&f.actor, "actor", defaultActor(), "release/discard: who decides (audited)")
	fs.StringVar(&f.winner, "winner", "", "release of a batch conflict: new (the held bytes win) or old")
	fs.StringVar(&f.hold, "hold", "", "release/discard: the hold decided on, as list and show print it (refused if the file was held again since)")
	requiredBy(cmd, "reason", "release", "discard")
	requiredBy(cmd, "hold", "release", "discard")
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int { return cmdQuarantine(f, args, stdout, stderr) })
}

// quarantineFlags are intake quarantine's flags.
type quarantineFlags struct {
	path, partner, reason, actor, winner, hold string
	openOnly                                   bool
}

// cmdQuarantine: list, show, release, discard held files.
func cmdQuarantine(f quarantineFlags, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: intake quarantine list|show|release|discard --config FILE …")
		return 2
	}
	sub, args := args[0], args[1:]
	id := int64(0)
	if sub != "list" {
		var ok bool
		if id, ok = idArg("quarantine "+sub, args, stderr); !ok {
			return 2
		}
	}
	ctx, e, scope, done, code := openScoped(f.path, f.partner, stderr)
	if e == nil {
		return code
	}
	defer done()
	switch sub {
	case "list", "show":
		items, err := ops.ListQuarantine(ctx, e.pool, scope, f.openOnly)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		if sub == "list" {
			fmt.Fprintln(tw, "INTAKE\tPARTNER\tSTATE\tREASON\tHOLD\tBATCH\tHELD\tFILE\tPATH")
		}
		shown := 0
		for _, q := range items {
			if sub == "show" && q.IntakeID != id {
				continue
			}
			shown++
			if sub == "list" {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.IntakeID, q.Partner, q.State, q.Reason, q.Hold, inert.Text(q.BatchID),
					q.HeldAt.UTC().Format("2006-01-02 15:04"), inert.Text(q.FileName), inert.Text(q.Path))
				continue
			}
			fmt.Fprintf(tw, "intake\t%d\npartner\t%s\nfile\t%s\nbatch\t%s\nsha256\t%s\nreason\t%s\nhold\t%s\nheld at\t%s\nheld in\t%s\nstate\t%s (file %s)\n",
				q.IntakeID, q.Partner, inert.Text(q.FileName), inert.Text(q.BatchID), q.SHA256, q.Reason, q.Hold, q.HeldAt.UTC(), inert.Text(q.Path), q.State, q.IntakeStat)
			if q.DecidedAt != nil {
				fmt.Fprintf(tw, "decided\t%s by %s: %s\n", q.DecidedAt.UTC(), inert.Text(q.DecidedBy), inert.Text(q.Decision))
			}
		}
		tw.Flush()
		if sub == "show" && shown == 0 {
			fmt.Fprintf(stderr, "intake %d is not held\n", id)
			return 1
		}
		return 0
	case "release", "discard":
		request := newRequestID()
		d := ops.Decision{IntakeID: id, Actor: f.actor, Reason: f.reason, Winner: f.winner, Partners: scope,
			Worker: intake.OpsWorker(e.cfg.WorkerID), Request: request, Hold: f.hold}
		fmt.Fprintf(stdout, "intake %d: %s by %s, request %s\n", id, sub, inert.Text(f.actor), request)
		actingAs(ctx, e, f.actor, stdout)
		err := act(func() error {
			if sub == "release" {
				return ops.Release(ctx, e.pool, d)
			}
			return ops.Discard(ctx, e.pool, d)
		})
		if err != nil {
			if code := decisionFailed(ctx, e.pool, stderr, "quarantine "+sub, id, request,
				fmt.Sprintf("running the command again is refused then, for intake %d is no longer held", id), err); code != 0 {
				return code
			}
		}
		// The decision is recorded; telling the partner is the next step,
		// and a reconciler finishes it if this one fails: not a failure of
		// the command.
		if err := ops.PublishDecision(ctx, e.pool, e.cfg.Partners, id); err != nil {
			fmt.Fprintf(stderr, "intake quarantine %s: the decision is recorded; the partner's receipt is rewritten by the next reconcile run (now: %s)\n", sub, inert.Lines(pgerr.Redact(err)))
		}
		var action string
		if sub == "release" && f.winner != "" {
			// --winner old discards: what it did is the audit row's
			action = recordedAction(ctx, e, scope, request)
		}
		switch {
		case sub == "discard":
			fmt.Fprintf(stdout, "intake %d discarded by %s\n", id, inert.Text(f.actor))
		case action == ops.ActionOldWins:
			fmt.Fprintf(stdout, "intake %d discarded by %s: the earlier bytes of its batch stand (--winner old)\n", id, inert.Text(f.actor))
		case f.winner == "old" && action == "":
			fmt.Fprintf(stdout, "intake %d decided by %s; whether it was released or discarded (--winner old) could not be read: intake audit --request %s tells\n",
				id, inert.Text(f.actor), request)
		default:
			fmt.Fprintf(stdout, "intake %d released by %s; a running daemon's reconciler picks it up within %s\n", id, inert.Text(f.actor), e.cfg.Reconcile.Schedule)
		}
		return 0
	}
	fmt.Fprintf(stderr, "intake quarantine: unknown subcommand %q\n", sub)
	return 2
}

// recordedAction is the action the audit recorded under request ("" when
// it cannot be read): what a decision did, as its audit row says.
func recordedAction(ctx context.Context, e *env, scope []string, request string) string {
	as, err := ops.Audit(ctx, e.pool, scope, request, 1)
	if err != nil || len(as) == 0 {
		return ""
	}
	return as[0].Action
}

// partnerScope is the partners an ops command may see and act on: those of
// its configuration, or the one named by --partner among them.
func partnerScope(e *env, only string, stderr io.Writer) ([]string, bool) {
	var ids []string
	for _, p := range e.cfg.Partners {
		if only == "" || p.ID == only {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		fmt.Fprintf(stderr, "no partner %q in the configuration\n", only)
		return nil, false
	}
	return ids, true
}

// openScoped is openCmd for an ops command that acts on partners: the
// partners it may see and act on (partnerScope) come with it. e is nil
// when the command ends at once with code.
func openScoped(path, partner string, stderr io.Writer) (ctx context.Context, e *env, scope []string, done func(), code int) {
	ctx, e, done, code = openCmd(path, stderr)
	if e == nil {
		return nil, nil, nil, nil, code
	}
	scope, ok := partnerScope(e, partner, stderr)
	if !ok {
		done()
		return nil, nil, nil, nil, 2
	}
	return ctx, e, scope, done, 0
}

// replayCommand is `intake replay`.
func replayCommand() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:     "replay INTAKE_ID --config FILE --reason TEXT",
		Short:   "apply a finished file's spooled bytes again (idempotent, audited)",
		Example: `intake replay 42 --config /etc/intake/intake.yaml --reason "mapping fixed"`,
	}
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.StringVar(&f.reason, "reason", "", "why (audited)")
	fs.StringVar(&f.actor, "actor", defaultActor(), "who (audited)")
	fs.BoolVar(&f.forceOlder, "force-older", false, "replay a snapshot older than one its feed has applied since, undoing the newer one (audited)")
	cmd.MarkFlagRequired("reason")
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int { return cmdReplay(f, args, stdout, stderr) })
}

// replayFlags are intake replay's flags.
type replayFlags struct {
	path, reason, actor string
	forceOlder          bool
}

// cmdReplay re-applies an archived file's spooled bytes, audited.
func cmdReplay(f replayFlags, args []string, stdout, stderr io.Writer) int {
	id, ok := idArg("replay", args, stderr)
	if !ok {
		return 2
	}
	ctx, e, done, code := openCmd(f.path, stderr)
	if e == nil {
		return code
	}
	defer done()
	d, err := intake.New(e.cfg.Intake(), e.cfg.Partners, e.pool, e.spool, prometheus.NewRegistry(), e.log)
	if err != nil {
		fmt.Fprintln(stderr, "intake replay:", err)
		return 2
	}
	defer d.Stop()
	request := newRequestID()
	fmt.Fprintf(stdout, "replay of intake %d by %s, request %s\n", id, inert.Text(f.actor), request)
	actingAs(ctx, e, f.actor, stdout)
	handover := !runsPipeline(ctx, e)
	in, err := d.Replay(ctx, intake.ReplayRequest{ID: id, Actor: f.actor, Reason: f.reason, Request: request, ForceOlder: f.forceOlder,
		Handover: handover, Progress: progressBar(stdout),
		Inserted: func(in *ledger.Intake) { fmt.Fprintf(stdout, "replay of intake %d is intake %d\n", id, in.ID) }})
	if err != nil {
		fmt.Fprintln(stdout)
		return replayFailed(stderr, id, request, e.cfg.Reconcile.Schedule, err)
	}
	if handover {
		fmt.Fprintf(stdout, "replay of intake %d is intake %d: recorded and handed to a daemon (this role does not run the pipeline): the next reconcile run (%s) takes it over and its daemon applies it from the spool; `intake status` shows it\n",
			id, in.ID, e.cfg.Reconcile.Schedule)
		return 0
	}
	return replayEnded(stdout, stderr, id, in)
}

// replayEnded reports where the replay in of intake id, run by this
// command, ended, and returns the command's exit code: a replay that
// applied nothing, a newer snapshot of its feed applied first, needs
// attention as a held one does.
func replayEnded(stdout, stderr io.Writer, id int64, in *ledger.Intake) int {
	why := ""
	if in.Reason != "" {
		why = " (" + string(in.Reason) + ")"
	}
	fmt.Fprintf(stdout, "\nreplay of intake %d is intake %d: %s%s, rows %d applied, %d unchanged, %d rejected, %d conflict\n",
		id, in.ID, in.State, why, in.RowsApplied, in.RowsUnchanged, in.RowsRejected, in.RowsConflict)
	if in.State == ledger.StateArchived && in.Reason == reason.Superseded {
		fmt.Fprintf(stderr, "intake replay: intake %d applied nothing: a newer snapshot of its feed was applied before it (its receipt names it). "+
			"To apply the older snapshot anyway: intake replay %d --force-older --reason \"…\"\n", in.ID, id)
		return 1
	}
	if code := replayExit(in.State); code != 0 {
		fmt.Fprintf(stderr, "intake replay: intake %d is %s: %s.\nDo not replay intake %d again: intake %d is that replay (intake status shows it).\n",
			in.ID, in.State, in.State.Info().Fate, id, in.ID)
		return code
	}
	return 0
}

// progressBar draws rows committed on a terminal, nothing elsewhere.
func progressBar(w io.Writer) func(done, total int64) {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return func(done, total int64) {
		const width = 40
		fill := width
		if total > 0 {
			fill = int(int64(width) * done / total)
		}
		fmt.Fprintf(w, "\r[%s%s] %d/%d rows", strings.Repeat("#", fill), strings.Repeat("-", width-fill), done, total)
	}
}

// auditCommand is `intake audit`.
func auditCommand() *cobra.Command {
	var f auditFlags
	cmd := &cobra.Command{
		Use:     "audit --config FILE [--partner P]",
		Short:   "list audited ops actions",
		Example: "intake audit --config /etc/intake/intake.yaml --partner acme --limit 20",
	}
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.StringVar(&f.partner, "partner", "", "only this partner")
	fs.IntVar(&f.limit, "limit", 100, "at most this many entries")
	fs.StringVar(&f.request, "request", "", "only the action of this request id (an ops command prints its own before it acts)")
	return runs(cmd, func(_ []string, stdout, stderr io.Writer) int { return cmdAudit(f, stdout, stderr) })
}

// auditFlags are intake audit's flags.
type auditFlags struct {
	path, partner, request string
	limit                  int
}

// cmdAudit lists audited ops actions.
func cmdAudit(f auditFlags, stdout, stderr io.Writer) int {
	ctx, e, scope, done, code := openScoped(f.path, f.partner, stderr)
	if e == nil {
		return code
	}
	defer done()
	entries, err := ops.Audit(ctx, e.pool, scope, f.request, f.limit)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tACTOR\tDB USER\tACTION\tPARTNER\tINTAKE\tREQUEST\tREASON\tDETAIL")
	for _, a := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", a.At.UTC().Format("2006-01-02 15:04:05"), inert.Text(a.Actor), dbUser(a.DBUser), a.Action, a.Partner, a.IntakeID,
			inert.Text(a.Request), inert.Text(a.Reason), inert.Text(a.Detail))
	}
	if f.request != "" && len(entries) == 0 {
		fmt.Fprintf(stderr, "no action of request %s is recorded\n", inert.Text(f.request))
		return 1
	}
	tw.Flush()
	return 0
}

// notifyCommand is `intake notify`.
func notifyCommand() *cobra.Command {
	var f notifyFlags
	cmd := &cobra.Command{
		Use:         "notify dead|redeliver --config FILE [--partner P] [--event ID|--all] [--url URL] [--endpoint ID] [--reason TEXT] [--actor NAME]",
		Short:       "list webhook deliveries whose retry budget ran out, send them again (audited)",
		Example:     `intake notify redeliver --config /etc/intake/intake.yaml --all --reason "endpoint fixed"`,
		Annotations: map[string]string{annSubs: "dead redeliver"},
	}
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.StringVar(&f.partner, "partner", "", "only this partner")
	fs.IntVar(&f.limit, "limit", 100, "dead: at most this many entries")
	fs.Int64Var(&f.event, "event", 0, "redeliver: only this event id")
	fs.StringVar(&f.url, "url", "", "redeliver: only deliveries to the configured endpoints with this URL (whole, without its query, or as dead lists it)")
	fs.StringVar(&f.endpoint, "endpoint", "", "redeliver: only deliveries to the endpoint with this id")
	fs.BoolVar(&f.all, "all", false, "redeliver: every dead delivery in scope (instead of --event)")
	fs.StringVar(&f.reason, "reason", "", "redeliver: why (audited)")
	fs.StringVar(&f.actor, "actor", defaultActor(), "redeliver: who (audited)")
	requiredBy(cmd, "reason", "redeliver")
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int {
		return cmdNotify(f, cmd.Example, args, stdout, stderr)
	})
}

// notifyFlags are intake notify's flags.
type notifyFlags struct {
	path, partner, url, endpoint, reason, actor string
	limit                                       int
	event                                       int64
	all                                         bool
}

// cmdNotify: list dead webhook deliveries, send them again.
func cmdNotify(f notifyFlags, example string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: intake notify dead|redeliver --config FILE …")
		return 2
	}
	sub := args[0]
	if sub == "redeliver" && (f.event == 0) == !f.all {
		fmt.Fprintf(stderr, "intake notify redeliver: give --event ID or --all\ne.g. %s\n", example)
		return 2
	}
	ctx, e, scope, done, code := openScoped(f.path, f.partner, stderr)
	if e == nil {
		return code
	}
	defer done()
	switch sub {
	case "dead":
		ds, err := ops.DeadDeliveries(ctx, e.pool, scope, f.limit)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT\tPARTNER\tKIND\tDEAD\tATTEMPTS\tSTATUS\tENDPOINT\tURL\tLAST ERROR")
		for _, d := range ds {
			shown := "(not in the config)"
			if n, ok := configuredEndpoint(e.cfg.Notify, e.cfg.Partners, d.Partner, d.EndpointID); ok {
				shown = notify.ShownURL(n.URL)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.EventID, d.Partner, d.Event,
				d.DeadAt.UTC().Format("2006-01-02 15:04"), d.Attempts, d.LastStatus, inert.Text(d.EndpointID), inert.Text(shown), inert.Text(d.LastError))
		}
		tw.Flush()
		return 0
	case "redeliver":
		eps, err := endpointsFor(e.cfg.Notify, e.cfg.Partners, f.url, f.endpoint)
		if err != nil {
			fmt.Fprintln(stderr, "intake notify redeliver:", err)
			return 1
		}
		request := newRequestID()
		fmt.Fprintf(stdout, "redeliver by %s, request %s\n", inert.Text(f.actor), request)
		var n int64
		err = act(func() (err error) {
			n, err = ops.Redeliver(ctx, e.pool, ledger.Redelivery{Partners: scope, EventID: f.event, Endpoints: eps, Actor: f.actor, Reason: f.reason, Request: request})
			return err
		})
		if err != nil {
			if code := actionFailed(ctx, e.pool, stderr, "notify redeliver", "dead deliveries", request,
				"redelivering again sends only what is dead again", err); code != 0 {
				return code
			}
			fmt.Fprintf(stdout, "dead deliveries sent again by %s with a fresh retry budget (intake audit --request %s shows the request); a running daemon delivers them\n", inert.Text(f.actor), request)
			return 0
		}
		if n == 0 {
			fmt.Fprintln(stderr, "intake notify redeliver: no dead delivery matches: nothing changed")
			return 1
		}
		fmt.Fprintf(stdout, "%d deliveries sent again by %s with a fresh retry budget; a running daemon delivers them\n", n, inert.Text(f.actor))
		return 0
	}
	fmt.Fprintf(stderr, "intake notify: unknown subcommand %q\n", sub)
	return 2
}

// configuredEndpoint is the webhook a delivery of partner's event names by
// id in the config: a global one, else one of the partner's (as the
// delivery service resolves it).
func configuredEndpoint(global []partners.Notify, parts []partners.Config, partner, id string) (partners.Notify, bool) {
	lists := [][]partners.Notify{global}
	for _, p := range parts {
		if p.ID == partner {
			lists = append(lists, p.Notify)
		}
	}
	return partners.LookupNotify(id, lists...)
}

// endpointsFor is the ids of the configured webhooks that redeliver's
// --url (the whole URL, the URL without its query, or as notify dead
// shows it) and --endpoint (an id) select: nil when neither is given,
// an error when one is given and matches no webhook of the config.
func endpointsFor(global []partners.Notify, parts []partners.Config, rawURL, id string) ([]string, error) {
	if rawURL == "" && id == "" {
		return nil, nil
	}
	lists := [][]partners.Notify{global}
	for _, p := range parts {
		lists = append(lists, p.Notify)
	}
	var out []string
	for _, list := range lists {
		for _, n := range list {
			urlOK := rawURL == "" || n.URL == rawURL || strings.SplitN(n.URL, "?", 2)[0] == rawURL || notify.ShownURL(n.URL) == rawURL
			if urlOK && (id == "" || n.EndpointID() == id) && !slices.Contains(out, n.EndpointID()) {
				// and the id its URL derives: deliveries recorded before it had one
				out = append(out, n.EndpointID())
				if d := partners.DerivedNotifyID(n.URL); d != n.EndpointID() {
					out = append(out, d)
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no webhook in the config matches --url/--endpoint (a delivery whose endpoint left the config can be sent again by --event or --all once the config has it back)")
	}
	return out, nil
}

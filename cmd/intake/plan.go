package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/partners"
)

// planCommand is `intake plan`.
func planCommand() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:         "plan show ID --config FILE [--limit N] [--after SEQ --plan-hash H] [--action A] [--key K] [--column C]",
		Short:       "show a file's plan against its target: counts, plan hash and its changes a page at a time (values on this terminal only)",
		Example:     "intake plan show 42 --config /etc/intake/intake.yaml --action update --limit 100",
		Annotations: map[string]string{annSubs: "show"},
	}
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.IntVar(&f.limit, "limit", 20, "changes: at most this many (1-1000)")
	fs.Int64Var(&f.after, "after", 0, "changes: those after this `SEQ` (the next page, as the last page printed says)")
	fs.StringVar(&f.hash, "plan-hash", "", "refused unless the file's plan is still this `H` (the next page names the plan of the pages before)")
	fs.StringVar(&f.filter.Action, "action", "", "changes: only this action (create, update, delete, conflict, rejected)")
	fs.StringVar(&f.filter.Key, "key", "", "changes: only the keys that begin with this text")
	fs.StringVar(&f.filter.Column, "column", "", "changes: only the updates that change this column")
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int { return cmdPlan(f, args, stdout, stderr) })
}

// planFlags are the flags of plan show: the config and the page of
// changes (ledger.ChangeFilter, keyset paged as the console pages them).
type planFlags struct {
	path   string
	limit  int
	after  int64
	hash   string
	filter ledger.ChangeFilter
}

// cmdPlan: `intake plan show ID` prints a file's plan: counts, hash and,
// while it waits, a page of its changes by key and column
// (intake_plan_change, read as the console reads them: ops.PlanPage).
// Values reach this terminal only; nothing of them is logged. The
// partner's text (the file name, keys, values) is printed in its
// printable form (internal/inert): an escape sequence in a key cannot
// rewrite the counts an approver reads.
func cmdPlan(f planFlags, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "show" {
		fmt.Fprintln(stderr, "usage: intake plan show ID --config FILE")
		return 2
	}
	id, ok := idArg("plan show", args[1:], stderr)
	if !ok {
		return 2
	}
	if f.limit < 1 || f.limit > 1000 || f.after < 0 {
		fmt.Fprintln(stderr, "intake plan show: --limit takes 1 to 1000, --after a seq of 0 or more")
		return 2
	}
	ctx, e, scope, done, code := openScoped(f.path, "", stderr)
	if e == nil {
		return code
	}
	defer done()
	// the plan and the page of its changes, read in one snapshot
	v, rows, err := ops.PlanPage(ctx, e.pool, id, scope, f.filter, f.after, 0, f.limit+1)
	if err != nil {
		fmt.Fprintln(stderr, "intake plan show:", err)
		return 1
	}
	if v == nil {
		fmt.Fprintf(stderr, "intake plan show: no intake %d among the configured partners\n", id)
		return 1
	}
	if v.Hash == "" {
		fmt.Fprintf(stderr, "intake plan show: intake %d has no plan against its target (its feed has no approval policy, or it was not planned yet; state %s)\n", id, v.State)
		return 1
	}
	if f.hash != "" && f.hash != v.Hash {
		fmt.Fprintf(stderr, "intake plan show: intake %d was planned again since the page before (plan %s, not %s): read it again from its first page\n",
			id, v.Hash, inert.Text(f.hash))
		return exitRefused
	}
	var c target.PlanCounts
	if err := json.Unmarshal(v.Counts, &c); err != nil {
		fmt.Fprintln(stderr, "intake plan show: stored counts:", err)
		return 1
	}
	printPlanCounts(stdout, v, c)
	if v.State != "awaiting_approval" {
		fmt.Fprintln(stdout, "\n(a plan's changes are kept only while the file awaits approval)")
		return 0
	}
	more := len(rows) > f.limit
	rows = rows[:min(len(rows), f.limit)]
	if err := printPlanChanges(stdout, rows); err != nil {
		fmt.Fprintln(stderr, "intake plan show: stored changes:", err)
		return 1
	}
	if more {
		fmt.Fprintf(stdout, "next page: intake plan show %d --config %s --after %d --plan-hash %s (and the same filter)\n", id, f.path, rows[len(rows)-1].Seq, v.Hash)
	}
	fmt.Fprintf(stdout, "\napprove: intake approve %d --config %s --plan-hash %s --reason \"…\"\nreject:  intake reject %d --config %s --plan-hash %s --reason \"…\"\n",
		v.IntakeID, f.path, v.Hash, v.IntakeID, f.path, v.Hash)
	return 0
}

// printPlanCounts prints the plan's file, hash and stored counts.
func printPlanCounts(stdout io.Writer, v *ledger.PlanView, c target.PlanCounts) {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "intake\t%d\npartner\t%s\nfeed\t%s\nfile\t%s\nstate\t%s", v.IntakeID, v.Partner, v.Feed, inert.Text(v.File), v.State)
	if v.Reason != "" {
		fmt.Fprintf(tw, " (%s)", v.Reason)
	}
	fmt.Fprintf(tw, "\nfile sha256\t%s\nmapping sha256\t%s\nplan hash\t%s\n", v.ContentSHA256, v.FeedSHA, v.Hash)
	if v.PlannedAt != nil {
		fmt.Fprintf(tw, "planned at\t%s\n", v.PlannedAt.UTC().Format("2006-01-02 15:04:05Z"))
	}
	if v.ApprovedHash != "" {
		fmt.Fprintf(tw, "approved hash\t%s\n", v.ApprovedHash)
	}
	fmt.Fprintf(tw, "rows\t%d\ncreates\t%d\nupdates\t%d\nunchanged\t%d\ndeletes\t%d", v.RowsTotal, c.Creates, c.Updates, c.Unchanged, c.Deletes)
	if c.DeletesKept > 0 {
		fmt.Fprintf(tw, " (and %d kept: edited outside intake)", c.DeletesKept)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "conflicts\t%d (newer_write %d, outside_edit %d, exists %d)\n", c.Conflicts(), c.NewerWrite, c.OutsideEdit, c.Exists)
	fmt.Fprintf(tw, "rejects\t%d (invalid %d, target_refused %d, not_found %d, duplicate_key %d)\n", c.Rejects(), c.Invalid, c.TargetRefused, c.NotFound, c.Duplicates)
	tw.Flush()
}

// printPlanChanges prints a page of a plan's changes, one a line: its
// seq, line, action, key and the columns it changes (old -> new), the
// partner's text printable.
func printPlanChanges(stdout io.Writer, rows []ledger.PlanChangeRow) error {
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "\nno changes (of this filter, after this seq)")
		return nil
	}
	fmt.Fprintln(stdout, "\nchanges (values shown to ops only):")
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tLINE\tACTION\tKEY\tCOLUMNS (old -> new)")
	for _, ch := range rows {
		var changed map[string][2]*string
		if len(ch.Changed) > 0 {
			if err := json.Unmarshal(ch.Changed, &changed); err != nil {
				return err
			}
		}
		line := "-"
		if ch.Line > 0 {
			line = strconv.FormatInt(ch.Line, 10)
		}
		action := ch.Action
		if ch.Reason != "" {
			action += " " + inert.Text(ch.Reason)
		}
		var cols []string
		for name, ov := range changed {
			cols = append(cols, fmt.Sprintf("%s: %s -> %s", inert.Text(name), textOrNull(ov[0]), textOrNull(ov[1])))
		}
		sort.Strings(cols)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", ch.Seq, line, action, inert.Text(ch.Key), strings.Join(cols, "; "))
	}
	return tw.Flush()
}

// textOrNull is a cell's value as plan show prints it: NULL, or the text
// in quotes, printable (internal/inert).
func textOrNull(s *string) string {
	if s == nil {
		return "NULL"
	}
	return inert.Quote(*s)
}

// approveCommand is `intake approve`.
func approveCommand() *cobra.Command {
	return decideCommand(&cobra.Command{
		Use:     "approve ID --config FILE --plan-hash H --reason TEXT",
		Short:   "approve the plan of a file awaiting approval (refused unless H is its current plan hash; audited)",
		Example: `intake approve 42 --config /etc/intake/intake.yaml --plan-hash 3f9a… --reason "price list reviewed with the partner"`,
	})
}

// rejectCommand is `intake reject`.
func rejectCommand() *cobra.Command {
	return decideCommand(&cobra.Command{
		Use:     "reject ID --config FILE --reason TEXT",
		Short:   "reject the plan of a file awaiting approval: the file is quarantined (plan_rejected); audited",
		Example: `intake reject 42 --config /etc/intake/intake.yaml --reason "snapshot would delete half the stock"`,
	})
}

// decideCommand is approve or reject: their flags (approve's --plan-hash)
// and what they run.
func decideCommand(cmd *cobra.Command) *cobra.Command {
	var f decideFlags
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.StringVar(&f.reason, "reason", "", "why (audited)")
	fs.StringVar(&f.actor, "actor", defaultActor(), "who decides (audited)")
	cmd.MarkFlagRequired("reason")
	if cmd.Name() == "approve" {
		fs.StringVar(&f.hash, "plan-hash", "", "the plan `HASH` approved, as intake plan show prints it")
		cmd.MarkFlagRequired("plan-hash")
	} else {
		fs.StringVar(&f.hash, "plan-hash", "", "the plan `HASH` rejected, as intake plan show prints it: refused if the file's plan is another by now")
	}
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int {
		return decidePlan(cmd.Name(), f, args, stdout, stderr)
	})
}

// decideFlags are the flags of approve and reject.
type decideFlags struct{ path, reason, actor, hash string }

func decidePlan(cmd string, f decideFlags, args []string, stdout, stderr io.Writer) int {
	id, ok := idArg(cmd, args, stderr)
	if !ok {
		return 2
	}
	ctx, e, scope, done, code := openScoped(f.path, "", stderr)
	if e == nil {
		return code
	}
	defer done()
	request := newRequestID()
	d := ledger.PlanDecision{IntakeID: id, Partners: scope, Actor: f.actor, Reason: f.reason, SnapshotFeeds: snapshotFeeds(e.cfg.Partners), Request: request, FourEyes: e.cfg.Ops.FourEyes}
	fmt.Fprintf(stdout, "intake %d: %s by %s, request %s\n", id, cmd, inert.Text(f.actor), request)
	actingAs(ctx, e, f.actor, stdout)
	d.PlanHash = f.hash
	err := act(func() error {
		if cmd == "approve" {
			return ops.Approve(ctx, e.pool, d)
		}
		return ops.Reject(ctx, e.pool, d)
	})
	if err != nil {
		if code := decisionFailed(ctx, e.pool, stderr, cmd, id, request,
			fmt.Sprintf("running the command again is refused then, for intake %d no longer awaits approval", id), err); code != 0 {
			return code
		}
	}
	if cmd == "approve" {
		fmt.Fprintf(stdout, "intake %d: plan %s approved by %s; the daemon polling its partner plans it again and applies it if the plan still holds (else it awaits approval again)\n", id, inert.Text(f.hash), inert.Text(f.actor))
	} else {
		fmt.Fprintf(stdout, "intake %d: plan rejected by %s; the daemon polling its partner quarantines it (plan_rejected) and tells the partner\n", id, inert.Text(f.actor))
	}
	return 0
}

// configuredIDs are the configured partners' ids, in order.
func configuredIDs(ps []partners.Config) []string {
	ids := make([]string, len(ps))
	for i := range ps {
		ids[i] = ps[i].ID
	}
	return ids
}

// pollSpecs are the configured partners' poll schedules, by partner.
func pollSpecs(ps []partners.Config) map[string]string {
	out := make(map[string]string, len(ps))
	for _, p := range ps {
		out[p.ID] = p.Poll
	}
	return out
}

// snapshotFeeds are the "partner/feed" of the configured snapshot feeds
// (an older snapshot's approval is refused: ledger.PlanDecision).
func snapshotFeeds(ps []partners.Config) []string {
	var out []string
	for _, p := range ps {
		for _, f := range p.Feeds {
			if f.Mode == partners.ModeSnapshot {
				out = append(out, p.ID+"/"+f.Name)
			}
		}
	}
	return out
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/dlview"
)

const dlqUsage = `usage: plugbus dlq <command> -endpoint NAME [flags] [ID ...]

commands:
  list      list the dead letters the filters select (a table, or -o json)
  show      show dead letters in full: attributes, headers, body, failure history
  replay    send the selected dead letters to their endpoint again (or -to), then remove them
  purge     delete the selected dead letters

replay and purge need a selection: IDs, a filter, or -all. -dry-run lists
what they would do (with -o json, as list does); with -o json they print
what they did as one JSON object: the IDs acted on, the counts, the IDs
left and the error. Flags may follow the IDs; after "--" every argument is
an ID. Run 'plugbus dlq <command> -h' for the flags.
`

// stdio is where a command writes; terminal is true when stderr is a
// terminal, where bulk operations show a progress bar.
type stdio struct {
	out, err io.Writer
	terminal bool
}

// dlqFlags are the flags of every dlq command.
type dlqFlags struct {
	broker       broker
	f            bus.DeadLetterFilter
	since, until string
	output       string
	all, dryRun  bool
	to, by       string
}

func (d *dlqFlags) flagSet(cmd string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("plugbus dlq "+cmd, flag.ContinueOnError)
	fs.SetOutput(w)
	d.broker.flags(fs)
	fs.StringVar(&d.f.Endpoint, "endpoint", "", "the endpoint whose dead letters to read (required)")
	fs.StringVar(&d.f.Name, "name", "", "select one message name")
	fs.StringVar(&d.f.Reason, "error", "", "select failures whose error text contains this, regardless of case")
	fs.StringVar(&d.since, "since", "", "select failures at or after this time: RFC 3339, or a duration ago (2h)")
	fs.StringVar(&d.until, "until", "", "select failures before this time: RFC 3339, or a duration ago")
	fs.IntVar(&d.f.Limit, "limit", 0, "select at most this many (0: no limit)")
	outputHelp := "output: table or json"
	if cmd == "replay" || cmd == "purge" {
		outputHelp = "output: table or json (the IDs acted on, the counts and the error; a dry run: the dead letters selected)"
	}
	fs.StringVar(&d.output, "o", "table", outputHelp)
	if cmd == "replay" || cmd == "purge" {
		fs.BoolVar(&d.all, "all", false, "select every dead letter of the endpoint")
		fs.BoolVar(&d.dryRun, "dry-run", false, "list what would be done, do nothing")
	}
	if cmd == "replay" {
		fs.StringVar(&d.to, "to", "", "replay to this endpoint (default: the endpoint that failed each message)")
		fs.StringVar(&d.by, "by", "", "who replays, recorded with the copy (default: the user name)")
	}
	return fs
}

// parseTime reads an RFC 3339 time or a duration before now.
func parseTime(flagName, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("-%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration (2h)", flagName, s)
	}
	return t, nil
}

// runDLQ runs `plugbus dlq ...`.
func runDLQ(ctx context.Context, io stdio, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" {
		fmt.Fprint(io.out, dlqUsage)
		if len(args) == 0 {
			return errors.New("dlq: missing command")
		}
		return nil
	}
	cmd := args[0]
	switch cmd {
	case "list", "show", "replay", "purge":
	default:
		fmt.Fprint(io.out, dlqUsage)
		return fmt.Errorf("dlq: unknown command %q", cmd)
	}
	d, err := parseDLQ(cmd, args[1:], io.err)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	t, err := d.broker.open(ctx, io.err)
	if err != nil {
		return fmt.Errorf("dlq %s: %w", cmd, err)
	}
	defer func() { _ = t.Close(context.WithoutCancel(ctx)) }()
	switch cmd {
	case "list":
		err = list(ctx, io, t, d.f, d.output)
	case "show":
		err = show(ctx, io, t, d.f, d.output)
	default:
		by := d.by
		if by == "" {
			by = userName()
		}
		err = bulk(ctx, io, t, cmd, d.f, bus.Replay{To: d.to, By: by}, d.dryRun, d.output)
	}
	if err != nil {
		return fmt.Errorf("dlq %s: %w", cmd, err)
	}
	return nil
}

// parseDLQ reads the flags and IDs of `plugbus dlq cmd`.
func parseDLQ(cmd string, args []string, w io.Writer) (*dlqFlags, error) {
	var d dlqFlags
	fs := d.flagSet(cmd, w)
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, fmt.Errorf("dlq %s: %w", cmd, err)
	}
	d.f.IDs = ids
	now := time.Now()
	if d.f.Since, err = parseTime("since", d.since, now); err != nil {
		return nil, fmt.Errorf("dlq %s: %w", cmd, err)
	}
	if d.f.Until, err = parseTime("until", d.until, now); err != nil {
		return nil, fmt.Errorf("dlq %s: %w", cmd, err)
	}
	if d.output != "table" && d.output != "json" {
		return nil, fmt.Errorf("dlq %s: -o %q: want table or json", cmd, d.output)
	}
	if d.f.Endpoint == "" {
		return nil, fmt.Errorf("dlq %s: -endpoint is required", cmd)
	}
	if d.f.Limit < 0 {
		return nil, fmt.Errorf("dlq %s: -limit %d: want a number of dead letters above zero (0: no limit)", cmd, d.f.Limit)
	}
	if (cmd == "replay" || cmd == "purge") && !d.all && d.selectsAll() {
		return nil, fmt.Errorf("dlq %s: nothing selected: give IDs, a filter (-name, -error, -since, -until, -limit) or -all", cmd)
	}
	return &d, nil
}

// parseInterspersed parses args with fs, flags before, between and after
// the positional arguments (the dead letters' IDs), which it returns; after
// "--" every argument is positional. flag.FlagSet.Parse alone stops at the
// first ID, and a flag after it (`purge ID -dry-run`) was taken for an ID.
// It tells flags from IDs as Parse does, so that a flag's value ("-error
// --", "-name ID") is the flag's.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimPrefix(a[1:], "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i]) // the flag's value, whatever it looks like
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, err
	}
	return pos, nil
}

// selectsAll reports whether the filter selects every dead letter.
func (d *dlqFlags) selectsAll() bool {
	f := d.f
	return len(f.IDs) == 0 && f.Name == "" && f.Reason == "" && f.Since.IsZero() && f.Until.IsZero() && f.Limit == 0
}

// userName names who replays: the user running plugbus.
func userName() string {
	u, err := user.Current()
	if err != nil || u.Username == "" {
		return "plugbus dlq"
	}
	return u.Username + " (plugbus dlq)"
}

func list(ctx context.Context, io stdio, m bus.DeadLetterManager, f bus.DeadLetterFilter, output string) error {
	dls, err := m.ListDeadLetters(ctx, f)
	if err != nil {
		return err
	}
	if output == "json" {
		return writeJSON(io.out, dls)
	}
	writeTable(io.out, dls)
	fmt.Fprintf(io.out, "%d dead letters of %s\n", len(dls), f.Endpoint)
	return nil
}

func writeJSON(w io.Writer, dls []bus.DeadLetter) error {
	views := make([]dlview.DeadLetter, len(dls))
	for i, dl := range dls {
		views[i] = dlview.Of(dl)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(views)
}

func writeTable(w io.Writer, dls []bus.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tFAILED AT\tATTEMPTS\tERROR")
	for _, dl := range dls {
		at := "-"
		if !dl.Failure.Time.IsZero() {
			at = dl.Failure.Time.UTC().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", dl.ID, dl.Envelope.Name, at, dl.Failure.Attempts, dlview.OneLine(dl.Failure.Reason, 70))
	}
	_ = tw.Flush()
}

func show(ctx context.Context, io stdio, m bus.DeadLetterManager, f bus.DeadLetterFilter, output string) error {
	dls, err := m.ListDeadLetters(ctx, f)
	if err != nil {
		return err
	}
	if len(dls) == 0 && len(f.IDs) == 0 {
		return fmt.Errorf("no dead letter of %s selected", f.Endpoint)
	}
	missing := missingIDs(f, dls)
	if len(dls) == 0 {
		return missing
	}
	if output == "json" {
		if err := writeJSON(io.out, dls); err != nil {
			return err
		}
		return missing
	}
	for i, dl := range dls {
		if i > 0 {
			fmt.Fprintln(io.out)
		}
		v := dlview.Of(dl)
		tw := tabwriter.NewWriter(io.out, 0, 8, 2, ' ', 0)
		fmt.Fprintf(tw, "ID\t%s\nName\t%s\nMessage id\t%s\nCorrelation id\t%s\nSent at\t%s\nContent type\t%s\n",
			v.ID, v.Name, v.MessageID, v.CorrelationID, v.SentAt.UTC().Format(time.RFC3339Nano), v.ContentType)
		for k, val := range v.Attributes {
			fmt.Fprintf(tw, "Attribute %s\t%s\n", k, val)
		}
		for k, val := range v.Sticky {
			fmt.Fprintf(tw, "Sticky attribute %s\t%s\n", k, val)
		}
		for _, k := range v.HeaderNames() {
			fmt.Fprintf(tw, "Header %s\t%s\n", k, v.Headers[k])
		}
		fl := v.Failure
		fmt.Fprintf(tw, "Failed at\t%s\nEndpoint\t%s\nAttempts\t%d\nDelayed rounds\t%d\nError\t%s\n",
			fl.Time.UTC().Format(time.RFC3339Nano), fl.Endpoint, fl.Attempts, fl.Delayed, fl.Reason)
		for _, e := range fl.Errors {
			fmt.Fprintf(tw, "Failed with\t%s\n", e) // the history's distinct errors, the last one included
		}
		if r := v.Replay; r != nil {
			fmt.Fprintf(tw, "Replayed\t%d times, last at %s by %s\n", r.Count, r.At.UTC().Format(time.RFC3339), r.By)
			for _, pf := range r.Failures {
				fmt.Fprintf(tw, "Failure before a replay\t%s at %s\n", pf.Reason, pf.Time.UTC().Format(time.RFC3339))
			}
		}
		_ = tw.Flush()
		if v.BodyEncoding == "base64" {
			fmt.Fprintf(io.out, "Body (not UTF-8: %d bytes, shown as base64):\n%s\n", v.BodySize, v.PrettyBody())
		} else {
			fmt.Fprintf(io.out, "Body:\n%s\n", v.PrettyBody())
		}
	}
	return missing
}

// missingIDs returns an error naming the IDs of f that selected no dead
// letter of dls (the dead letters f selected), or nil.
func missingIDs(f bus.DeadLetterFilter, dls []bus.DeadLetter) error {
	missing := missingIDList(f, dls)
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("no dead letter of %s with ID %s (or the filter excludes it)", f.Endpoint, strings.Join(missing, ", "))
}

// missingIDList returns the IDs of f that selected no dead letter of dls,
// each once.
func missingIDList(f bus.DeadLetterFilter, dls []bus.DeadLetter) []string {
	if len(f.IDs) == 0 || f.Full(len(dls)) {
		return nil
	}
	found := make(map[string]bool, len(dls))
	for _, dl := range dls {
		found[dl.ID] = true
	}
	var missing []string
	for _, id := range f.IDs {
		if !found[id] {
			found[id] = true
			missing = append(missing, id)
		}
	}
	return missing
}

// bulkResult is what replay and purge print with -o json once they have
// acted (a dry run prints the dead letters selected, as list does): the
// dead letters acted on by ID, the counts, and the error that ended the
// command, if one did (it is also printed on stderr, and the exit status
// is 1).
type bulkResult struct {
	// Command is "replay" or "purge".
	Command  string `json:"command"`
	Endpoint string `json:"endpoint"`
	// To is the destination of a replay given -to.
	To string `json:"to,omitempty"`
	// Selected is how many dead letters the selection held.
	Selected int `json:"selected"`
	// Done is how many were replayed (each removed once its copy was
	// confirmed) or deleted; IDs are theirs, in the order done.
	Done int      `json:"done"`
	IDs  []string `json:"ids"`
	// Left are the IDs of the dead letters selected and not acted on:
	// still dead letters, unless gone meanwhile.
	Left []string `json:"left"`
	// Missing are the IDs given that selected no dead letter: then
	// nothing was done.
	Missing []string `json:"missing,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// bulk replays or purges what f selects, with a progress bar on a
// terminal and a summary at the end: a line, or a bulkResult with -o json.
func bulk(ctx context.Context, io stdio, m bus.DeadLetterManager, cmd string, f bus.DeadLetterFilter, r bus.Replay, dryRun bool, output string) error {
	verb, did := "replay", "replayed"
	if cmd == "purge" {
		verb, did = "delete", "deleted"
	}
	selected, err := m.ListDeadLetters(ctx, f)
	if err != nil {
		return err
	}
	// IDs of which some select nothing are a typo or dead letters another
	// operation took: do nothing, and say which.
	missing := missingIDs(f, selected)
	if dryRun {
		if cmd == "replay" && r.To != "" {
			if err := checkDestination(ctx, m, r.To); err != nil {
				return fmt.Errorf("-to %s: %w", r.To, err)
			}
		}
		if output == "json" {
			if err := writeJSON(io.out, selected); err != nil {
				return err
			}
		} else {
			writeTable(io.out, selected)
			fmt.Fprintf(io.out, "dry run: would %s %d dead letters of %s\n", verb, len(selected), f.Endpoint)
		}
		return missing
	}
	res := bulkResult{Command: cmd, Endpoint: f.Endpoint, Selected: len(selected), IDs: []string{}}
	if cmd == "replay" {
		res.To = r.To
	}
	// report ends the command with err, printing res first with -o json.
	report := func(err error) error {
		if output != "json" {
			return err
		}
		res.Done = len(res.IDs)
		res.Left = leftIDs(selected, res.IDs)
		if err != nil {
			res.Error = err.Error()
		}
		enc := json.NewEncoder(io.out)
		enc.SetIndent("", "  ")
		return errors.Join(err, enc.Encode(res))
	}
	if missing != nil {
		res.Missing = missingIDList(f, selected)
		return report(fmt.Errorf("%w: nothing done", missing))
	}
	if len(selected) == 0 {
		if output != "json" {
			fmt.Fprintf(io.out, "no dead letter of %s selected: nothing to %s\n", f.Endpoint, verb)
		}
		return report(nil)
	}
	// Act on what was listed: a dead letter arriving meanwhile is not touched.
	f.IDs = make([]string, len(selected))
	for i, dl := range selected {
		f.IDs[i] = dl.ID
	}
	f.Limit = 0
	var bar *progressbar.ProgressBar
	if io.terminal {
		bar = progressbar.NewOptions(len(selected), progressbar.OptionSetWriter(io.err), progressbar.OptionSetDescription(did),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true), progressbar.OptionFullWidth(), progressbar.OptionSetRenderBlankState(true))
	}
	done := func(dl bus.DeadLetter) {
		res.IDs = append(res.IDs, dl.ID) // done is called one call at a time
		if bar != nil {
			_ = bar.Add(1)
		}
	}
	start := time.Now()
	var n int
	if cmd == "purge" {
		n, err = m.DeleteDeadLetters(ctx, f, done)
	} else {
		n, err = m.ReplayDeadLetters(ctx, f, r, done)
	}
	if bar != nil {
		if err == nil {
			_ = bar.Finish()
		}
		fmt.Fprintln(io.err)
	}
	elapsed := time.Since(start).Round(time.Millisecond)
	to := ""
	if cmd == "replay" && r.To != "" {
		to = " to " + r.To
	}
	var unknown *bus.UnknownEndpointError
	if n == 0 && errors.As(err, &unknown) && (!unknown.Destination || r.To != "") {
		// The endpoint or -to does not exist: the error says which, and
		// that nothing was done. A dead letter's own destination stops the
		// replay at that dead letter, which the summary below counts.
		return report(err)
	}
	if err != nil {
		if output != "json" {
			fmt.Fprintf(io.out, "%s %d of %d dead letters of %s%s in %v, then stopped: %d left\n", did, n, len(selected), f.Endpoint, to, elapsed, len(selected)-n)
		}
		return report(err)
	}
	if output != "json" {
		fmt.Fprintf(io.out, "%s %d of %d dead letters of %s%s in %v\n", did, n, len(selected), f.Endpoint, to, elapsed)
	}
	if n < len(selected) {
		return report(fmt.Errorf("%d of the %d dead letters selected were not %s (gone meanwhile, or one with the same ID was): list them again", len(selected)-n, len(selected), did))
	}
	return report(nil)
}

// leftIDs returns the IDs of the dead letters of selected that are not
// among done.
func leftIDs(selected []bus.DeadLetter, done []string) []string {
	acted := make(map[string]bool, len(done))
	for _, id := range done {
		acted[id] = true
	}
	left := []string{}
	for _, dl := range selected {
		if !acted[dl.ID] {
			left = append(left, dl.ID)
		}
	}
	return left
}

// checkDestination returns the error a replay to to would fail with
// before it takes a dead letter: the replay itself refuses a destination
// without a queue, and a dry run asks the transport nothing else. A
// transport that cannot say (no bus.DestinationChecker) is asked whether
// to is an endpoint at all; a queue URL (an SQS instance address) then
// names no endpoint, and is not asked about.
func checkDestination(ctx context.Context, m bus.DeadLetterManager, to string) error {
	if c, ok := m.(bus.DestinationChecker); ok {
		return c.CheckDestination(ctx, to)
	}
	if strings.Contains(to, "://") {
		return nil
	}
	if _, err := m.QueueDepth(ctx, to); errors.Is(err, bus.ErrUnknownEndpoint) {
		return err
	}
	return nil
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/middleware/audit"
	"github.com/plugbus/plugbus/middleware/internal/servedtest"
	"github.com/plugbus/plugbus/plugin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type refund struct{ OrderID, Card string }

func (refund) MessageName() string { return "billing.refund" }

// records is a slog handler keeping the audit records, as JSON objects,
// and telling when one arrives.
type records struct {
	mu      sync.Mutex
	kept    []map[string]any
	arrived chan struct{}
}

func newRecords() *records { return &records{arrived: make(chan struct{}, 100)} }

func (r *records) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (r *records) Write(p []byte) (int, error) {
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		return 0, err
	}
	if m["msg"] != "audit" {
		return len(p), nil
	}
	delete(m, "time")
	r.mu.Lock()
	r.kept = append(r.kept, m)
	r.mu.Unlock()
	r.arrived <- struct{}{}
	return len(p), nil
}

// wait waits for n records and returns every record kept.
func (r *records) wait(t *testing.T, n int) []map[string]any {
	t.Helper()
	for range n {
		select {
		case <-r.arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("fewer than %d audit records within 10s", n)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.kept)
}

// find returns the record of stage.
func find(t *testing.T, recs []map[string]any, stage string) map[string]any {
	t.Helper()
	for _, r := range recs {
		if r["audit"] == stage {
			return r
		}
	}
	t.Fatalf("no %s record in %v", stage, recs)
	return nil
}

func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// One record per stage outcome, with the default fields and no body.
func TestOneRecordPerStageOutcome(t *testing.T) {
	recs := newRecords()
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithMiddleware(audit.New(audit.WithLogger(recs.logger()))),
		bus.WithHandler(func(context.Context, refund, bus.Attributes) error { return nil }, bus.HandlerName("refund")))
	if err := b.Send(t.Context(), refund{OrderID: "o-1", Card: "4111"}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	got := recs.wait(t, 3)
	out, in, h := find(t, got, "outgoing"), find(t, got, "incoming"), find(t, got, "handler")
	for _, c := range []struct {
		rec     map[string]any
		outcome string
		keys    []string
	}{
		{out, "sent", []string{"audit", "correlation_id", "destination", "duration", "kind", "level", "message_id", "message_name", "msg", "outcome"}},
		{in, "handled", []string{"attempt", "audit", "correlation_id", "duration", "endpoint", "level", "message_id", "message_name", "msg", "outcome"}},
		{h, "succeeded", []string{"attempt", "audit", "correlation_id", "duration", "handler", "level", "message_id", "message_name", "msg", "outcome"}},
	} {
		if c.rec["outcome"] != c.outcome || c.rec["level"] != "INFO" || c.rec["message_name"] != "billing.refund" || !slices.Equal(keys(c.rec), c.keys) {
			t.Fatalf("%s record %v; want outcome %s at INFO with keys %v", c.rec["audit"], c.rec, c.outcome, c.keys)
		}
	}
	if out["message_id"] != in["message_id"] || h["handler"] != "refund" || in["endpoint"] != "billing" || out["kind"] != "send" {
		t.Fatalf("records disagree: %v %v %v", out, in, h)
	}
}

// Failures are logged at the failure level with the error, and a
// permanent one says so; fields, attributes, levels and the body are
// configurable.
func TestFailuresAndOptions(t *testing.T) {
	recs := newRecords()
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithMaxAttempts(1),
		bus.WithMiddleware(audit.New(audit.WithLogger(recs.logger()), audit.WithStages(bus.StageHandler),
			audit.WithFields(audit.MessageName|audit.Error), audit.WithBody(), audit.WithAttributes("tenant"),
			audit.WithLevels(slog.LevelDebug, slog.LevelError))),
		bus.WithHandler(func(_ context.Context, m refund, _ bus.Attributes) error {
			if m.OrderID == "bad" {
				return bus.Permanent(errors.New("no such order"))
			}
			return errors.New("bank down")
		}))
	for _, id := range []string{"o-1", "bad"} {
		if err := b.Send(t.Context(), refund{OrderID: id}, bus.To("billing"), bus.WithStickyAttribute("tenant", "acme")); err != nil {
			t.Fatal(err)
		}
	}
	got := recs.wait(t, 2)
	// Eight workers may handle the two in either order.
	slices.SortFunc(got, func(a, b map[string]any) int { return strings.Compare(a["outcome"].(string), b["outcome"].(string)) })
	for i, want := range []struct{ outcome, err, body string }{
		{"failed", "bank down", `{"OrderID":"o-1","Card":""}`},
		{"permanent", "no such order", `{"OrderID":"bad","Card":""}`},
	} {
		r := got[i]
		if r["outcome"] != want.outcome || r["level"] != "ERROR" || r["attr.tenant"] != "acme" || r["body"] != want.body || !strings.Contains(r["error"].(string), want.err) {
			t.Fatalf("record %d: %v; want %+v at ERROR, tenant acme", i, r, want)
		}
		if k := keys(r); !slices.Equal(k, []string{"attr.tenant", "audit", "body", "error", "level", "message_name", "msg", "outcome"}) {
			t.Fatalf("record %d keys %v", i, k)
		}
	}
}

// "returned" is what the bus did with the message: not when one handler
// asked for bus.RetryAfter and another failed outright (the policy
// decides), nor on a transport that cannot delay (an ordinary failure).
func TestReturnedOnlyWhenTheBusReturnsForLater(t *testing.T) {
	later := func(context.Context, refund, bus.Attributes) error {
		return bus.RetryAfter(errors.New("breaker open"), time.Minute)
	}
	for _, c := range []struct {
		name     string
		noDelay  bool
		handlers []bus.Option
		want     string
	}{
		{"every handler asks", false, []bus.Option{bus.WithHandler(later)}, "returned"},
		{"one of two asks", false, []bus.Option{bus.WithHandler(later, bus.HandlerName("notify")),
			bus.WithHandler(func(context.Context, refund, bus.Attributes) error { return errors.New("card declined") }, bus.HandlerName("charge"))}, "failed"},
		{"the transport cannot delay", true, []bus.Option{bus.WithHandler(later)}, "failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			recs := newRecords()
			rec := bustest.NewTransport()
			var tr bus.Transport = rec
			if c.noDelay {
				tr = struct{ bus.Transport }{rec} // no bus.Delayer
			}
			opts := append([]bus.Option{bus.WithEndpoint("billing"), bus.WithTransport(tr), bus.WithMaxAttempts(1),
				bus.WithMiddleware(audit.New(audit.WithLogger(recs.logger()), audit.WithStages(bus.StageIncoming)))}, c.handlers...)
			b := bustest.Start(t, opts...)
			if err := b.Send(t.Context(), refund{OrderID: "o-1"}, bus.To("billing")); err != nil {
				t.Fatal(err)
			}
			settled, err := rec.WaitSettled(t.Context(), 1)
			if err != nil {
				t.Fatal(err)
			}
			in := find(t, recs.wait(t, 1), "incoming")
			if in["outcome"] != c.want {
				t.Fatalf("incoming outcome %q, want %q (the bus: %s)", in["outcome"], c.want, settled[0].Outcome)
			}
			if wantReturned := c.want == "returned"; (settled[0].Outcome == bustest.Returned) != wantReturned {
				t.Fatalf("the bus settled it %s; the audit says %q", settled[0].Outcome, in["outcome"])
			}
		})
	}
}

// Given to one handler it audits that handler's runs alone.
func TestPerHandler(t *testing.T) {
	mw, err := audit.New().Instantiate(bus.PluginInfo{Handler: "refund"})
	if err != nil {
		t.Fatal(err)
	}
	if mw.Incoming != nil || mw.Outgoing != nil || mw.Handling == nil {
		t.Fatal("per handler, audit must have the handler stage alone")
	}
	if _, err := audit.New(audit.WithStages(bus.StageIncoming)).Instantiate(bus.PluginInfo{Handler: "refund"}); err == nil {
		t.Fatal("an audit with no stage to run per handler was accepted")
	}
	recs := newRecords()
	mw, err = audit.New(audit.WithLogger(recs.logger())).Instantiate(bus.PluginInfo{Handler: "refund"})
	if err != nil {
		t.Fatal(err)
	}
	busy := bus.RetryAfter(errors.New("busy"), time.Second)
	rec := bustest.RecordNext(busy)
	if err := mw.Handling(context.Background(), bustest.Handling("refund", refund{}, bus.Attributes{}), rec.HandlingNext()); !errors.Is(err, busy) || !rec.Called() {
		t.Fatalf("Handling = %v, next called %v; want next's error", err, rec.Called())
	}
	if r := recs.wait(t, 1)[0]; r["outcome"] != "returned" || r["level"] != "WARN" || r["handler"] != "refund" {
		t.Fatalf("record %v, want outcome returned at WARN", r)
	}
}

// Served from another process, the records reach the host's logger.
func TestOutOfProcess(t *testing.T) {
	recs := newRecords()
	p := servedtest.Load(t, `{"middleware": "audit", "body": true}`, plugin.WithLogger(recs.logger()))
	b := bustest.Start(t, bus.WithEndpoint("billing"), bus.WithMiddleware(p),
		bus.WithHandler(func(context.Context, refund, bus.Attributes) error { return nil }, bus.HandlerName("refund")))
	if err := b.Send(t.Context(), refund{OrderID: "o-1"}, bus.To("billing")); err != nil {
		t.Fatal(err)
	}
	got := recs.wait(t, 3)
	h := find(t, got, "handler")
	if h["outcome"] != "succeeded" || h["handler"] != "refund" || h["body"] != `{"OrderID":"o-1","Card":""}` || h["plugin"] != "audit" {
		t.Fatalf("handler record %v", h)
	}
	if in := find(t, got, "incoming"); in["outcome"] != "handled" {
		t.Fatalf("incoming record %v", in)
	}
}

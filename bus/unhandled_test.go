package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
)

// logRecord is one JSON log line of an env.
type logRecord map[string]any

// records returns the env's log records whose message is msg.
func (e *env) records(msg string) []logRecord {
	e.t.Helper()
	var out []logRecord
	for line := range strings.SplitSeq(strings.TrimSpace(e.logs.String()), "\n") {
		var r logRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			e.t.Fatalf("log line %q: %v", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// sendRaw puts an envelope named name straight on the endpoint's queue, as
// a foreign publisher would.
func (e *env) sendRaw(name string) string {
	e.t.Helper()
	id := "raw-" + strconv.Quote(name)
	env := &bus.Envelope{Name: name, ContentType: "application/json", Body: []byte(`{}`),
		Attributes: bus.NewAttributes(id, id, fixedTime(), nil, nil)}
	if err := e.rec.Send(e.t.Context(), env, "ep"); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// A message whose name no handler handles goes to the dead-letter queue on
// its first delivery, with a reason naming the message, the endpoint and
// the missing handler, logged as a warning rather than an error.
func TestUnhandledMessageDeadLetteredAtOnce(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), unhandled{}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	s := e.expect(bustest.DeadLettered)
	if s.Attempt != 1 || s.Failure.Attempts != 1 {
		t.Fatalf("dead-lettered at attempt %d (failure says %d), want 1: no retries", s.Attempt, s.Failure.Attempts)
	}
	for _, want := range []string{`"shop.unhandled"`, `endpoint "ep"`, "no handler", "bus.WithUnhandled"} {
		if !strings.Contains(s.Failure.Reason, want) {
			t.Errorf("reason %q does not say %s", s.Failure.Reason, want)
		}
	}
	dl := e.broker.DeadLetters("ep")
	if len(dl) != 1 || dl[0].Envelope.Name != "shop.unhandled" || dl[0].Failure.Reason != s.Failure.Reason {
		t.Fatalf("dead letters %+v, want the unhandled message with its reason", dl)
	}
	e.stop() // the bus logs once the transport settled the message
	warns := e.records("message dead-lettered: no handler for its name")
	if len(warns) != 1 || warns[0]["level"] != "WARN" || warns[0]["message_name"] != "shop.unhandled" || warns[0]["endpoint"] != "ep" {
		t.Fatalf("want one WARN naming the message and endpoint, got %v\nlogs:\n%s", warns, e.logs)
	}
	if strings.Contains(e.logs.String(), `"level":"ERROR"`) {
		t.Fatalf("an unhandled message logged an ERROR:\n%s", e.logs)
	}
}

// A name that is not valid UTF-8 is quoted in the reason: the reason stays
// valid UTF-8 and shows the name's bytes.
func TestUnhandledInvalidUTF8NameQuotedInReason(t *testing.T) {
	e := newEnv(t, nil, bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	name := "shop.\xff\xfeorder\x00"
	e.sendRaw(name)
	s := e.expect(bustest.DeadLettered)
	if !utf8.ValidString(s.Failure.Reason) {
		t.Fatalf("reason is not valid UTF-8: %q", s.Failure.Reason)
	}
	if want := `"shop.\xff\xfeorder\x00"`; !strings.Contains(s.Failure.Reason, want) {
		t.Fatalf("reason %q does not quote the name as %s", s.Failure.Reason, want)
	}
	if dl := e.broker.DeadLetters("ep"); len(dl) != 1 || dl[0].Envelope.Name != name {
		t.Fatalf("dead letters %+v, want the message under its original name", dl)
	}
}

// Incoming middleware still sees an unhandled message, and one that
// handles it (does not call next) keeps it out of the dead-letter queue:
// only what reaches the end of the chain without a handler is dead-lettered.
func TestUnhandledMessageHandledByIncomingMiddlewareIsDeleted(t *testing.T) {
	resolver := bus.FilterIncoming("replies", func(_ context.Context, in *bus.Incoming) bus.FilterResult {
		if in.Name() == "shop.reply" {
			return bus.FilterStop
		}
		return bus.FilterContinue
	})
	e := newEnv(t, nil, bus.WithMiddleware(resolver), bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	e.sendRaw("shop.reply")
	if s := e.expect(bustest.Deleted); s.Envelope.Name != "shop.reply" {
		t.Fatalf("deleted %s", s.Envelope.Name)
	}
	e.sendRaw("shop.unknown")
	if s := e.expect(bustest.DeadLettered); s.Envelope.Name != "shop.unknown" {
		t.Fatalf("dead-lettered %s", s.Envelope.Name)
	}
}

// A middleware wrapping the bus's error does not turn the unhandled
// message into a retried one.
func TestUnhandledErrorWrappedByMiddlewareStillDeadLettersAtOnce(t *testing.T) {
	wrap := bus.Middleware{Name: "wrap", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		if err := next.Call(ctx); err != nil {
			return fmt.Errorf("wrap: %w", err)
		}
		return nil
	}}
	e := newEnv(t, nil, bus.WithMiddleware(wrap), bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	e.sendRaw("shop.unknown")
	s := e.expect(bustest.DeadLettered)
	if s.Attempt != 1 || !strings.HasPrefix(s.Failure.Reason, "wrap: bus: no handler") {
		t.Fatalf("attempt %d reason %q, want attempt 1 and the wrapped reason", s.Attempt, s.Failure.Reason)
	}
}

// Deliver (pushed messages) reports an unhandled message as permanent, so
// that its caller dead-letters it instead of retrying it.
func TestUnhandledDeliverIsPermanent(t *testing.T) {
	b, err := bus.New(bus.WithEndpoint("ep"), bus.WithLogger(discard()),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	err = b.Deliver(t.Context(), bustest.Delivery(unhandled{}, bus.Attributes{}))
	var nh *bus.NoHandlerError
	if !errors.As(err, &nh) || nh.Message != "shop.unhandled" || nh.Endpoint != "ep" || !errors.Is(err, bus.ErrNoHandler) || !bus.IsPermanent(err) {
		t.Fatalf("Deliver: %v (%T), want a permanent *bus.NoHandlerError for shop.unhandled on ep", err, err)
	}
	// A handler's own NoHandlerError (it delivered to another bus) is the
	// handler's failure, retried like any other.
	inner := &bus.HandlerDispatchRejectedError{Message: "x", Failures: []bus.HandlerFailure{{Handler: "h", Err: nh}}}
	if bus.IsPermanent(inner) {
		t.Fatal("a handler's NoHandlerError counts as permanent")
	}
}

// With bus.UnhandledDiscard an unhandled message is deleted and logged at
// INFO, and incoming middleware learns from Incoming.Unhandled that it was
// discarded rather than handled.
func TestUnhandledDiscardDeletesAndTellsMiddleware(t *testing.T) {
	type outcome struct {
		name      string
		err       error
		unhandled bool
	}
	seen := make(chan outcome, 4)
	watch := bus.Middleware{Name: "watch", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		before := in.Unhandled()
		err := next.Call(ctx)
		if before {
			t.Error("Unhandled true before next ran")
		}
		seen <- outcome{in.Name(), err, in.Unhandled()}
		return err
	}}
	e := newEnv(t, nil, bus.WithUnhandled(bus.UnhandledDiscard), bus.WithMiddleware(watch),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	if err := e.bus.Send(t.Context(), unhandled{}, bus.To("ep")); err != nil {
		t.Fatal(err)
	}
	if o := await(t, seen); o.name != "shop.unhandled" || o.err != nil || !o.unhandled {
		t.Fatalf("middleware saw %+v, want shop.unhandled, nil, unhandled", o)
	}
	e.expect(bustest.Deleted)
	if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if o := await(t, seen); o.name != "shop.order_placed" || o.err != nil || o.unhandled {
		t.Fatalf("middleware saw %+v, want a handled shop.order_placed", o)
	}
	e.expect(bustest.Deleted)
	if dl := e.broker.DeadLetters("ep"); len(dl) != 0 {
		t.Fatalf("discarded message dead-lettered: %+v", dl)
	}
	infos := e.records("no handler for message; discarding it (bus.UnhandledDiscard)")
	if len(infos) != 1 || infos[0]["level"] != "INFO" || infos[0]["message_name"] != "shop.unhandled" || infos[0]["endpoint"] != "ep" {
		t.Fatalf("want one INFO naming the discarded message, got %v\nlogs:\n%s", infos, e.logs)
	}
}

func TestWithUnhandledRefusesUnknownPolicy(t *testing.T) {
	_, err := bus.New(bus.WithUnhandled(bus.UnhandledPolicy(7)))
	if err == nil || !strings.Contains(err.Error(), "bus.UnhandledDiscard") {
		t.Fatalf("New: %v, want an error listing the policies", err)
	}
}

// forgingAttempt is a recording transport whose first delivery arrives
// with a forged attempt.
type forgingAttempt struct {
	*bustest.Transport
	attempt int
	forged  atomic.Bool
}

func (a *forgingAttempt) Receive(ctx context.Context) (*bus.Delivery, error) {
	d, err := a.Transport.Receive(ctx)
	if d != nil && a.forged.CompareAndSwap(false, true) {
		d.Attempt = a.attempt
	}
	return d, err
}

// An attempt below 1 reaching the bus is counted as the first, with a
// warning naming the attribute: middleware sees 1 and a failure is retried.
func TestAttemptBelowOneCountsAsFirst(t *testing.T) {
	for _, forged := range []int{0, -7} {
		t.Run(strconv.Itoa(forged), func(t *testing.T) {
			attempts := make(chan int, 1)
			seen := bus.Middleware{Name: "seen", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				select {
				case attempts <- in.Attempt():
				default:
				}
				return next.Call(ctx)
			}}
			e := newEnvOver(t, nil, func(r *bustest.Transport) bus.Transport { return &forgingAttempt{Transport: r, attempt: forged} },
				bus.WithMiddleware(seen),
				bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return errors.New("not yet") }))
			if err := e.bus.Send(t.Context(), orderPlaced{ID: "1"}); err != nil {
				t.Fatal(err)
			}
			if got := await(t, attempts); got != 1 {
				t.Fatalf("middleware saw attempt %d, want 1", got)
			}
			if s := e.expect(bustest.Returned); s.Attempt != 1 {
				t.Fatalf("returned at attempt %d, want 1", s.Attempt)
			}
			warns := e.records("delivery attempt below 1; counting it as the first")
			if len(warns) == 0 || warns[0]["level"] != "WARN" || warns[0]["attribute"] != "attempt" || warns[0]["attempt"] != float64(forged) {
				t.Fatalf("want a WARN naming the attempt %d, got %v", forged, warns)
			}
		})
	}
}

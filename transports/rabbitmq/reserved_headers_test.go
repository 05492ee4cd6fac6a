package rabbitmq_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// A reserved header from another producer is never trusted to shorten a
// message's life or to make it unreadable: an attempt out of range, a
// sent time in the future or of the wrong type, a foreign spelling of a
// reserved name are ignored with a warning naming the header and the
// message, and the message gets its full retries. A reserved name in any
// case never reaches handlers or middleware as an ordinary header.
func TestForeignReservedHeadersAreIgnored(t *testing.T) {
	e := newEnv(t)
	logs := newRecordedLogs()
	const maxAttempts = 3
	var attempts attemptLog
	var mu sync.Mutex
	seen := map[string]struct {
		headers []string
		sentAt  time.Time
		attrs   int
	}{}
	b, err := bus.New(bus.WithEndpoint(e.endpoint), bus.WithTransport(e.transport(t, rabbitmq.WithLogger(logs.logger()))),
		bus.WithMaxAttempts(maxAttempts), bus.WithMiddleware(attempts.middleware(), bus.Middleware{
			Name: "headers",
			Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				var names []string
				for k := range in.Headers() {
					names = append(names, k)
				}
				v, s := in.Attributes().Len()
				mu.Lock()
				seen[in.Attributes().MessageID] = struct {
					headers []string
					sentAt  time.Time
					attrs   int
				}{names, in.Attributes().SentAt, v + s}
				mu.Unlock()
				return next.Call(ctx)
			},
		}),
		bus.WithHandler(func(context.Context, order, bus.Attributes) error { return errors.New("always fails") }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 60*time.Second)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })

	future := time.Now().Add(time.Hour)
	cases := map[string]struct {
		headers amqp.Table
		ignored []string // the headers a warning must name
	}{
		"attempt-99":      {amqp.Table{rabbitmq.HeaderAttempt: int32(99)}, []string{rabbitmq.HeaderAttempt}},
		"attempt-0":       {amqp.Table{rabbitmq.HeaderAttempt: int32(0)}, []string{rabbitmq.HeaderAttempt}},
		"attempt-text":    {amqp.Table{rabbitmq.HeaderAttempt: "many"}, []string{rabbitmq.HeaderAttempt}},
		"upper-case":      {amqp.Table{"PLUGBUS-ATTEMPT": int32(3), "Plugbus-Attr-tenant": "other", "x-kept": "yes"}, []string{"PLUGBUS-ATTEMPT", "Plugbus-Attr-tenant"}},
		"unknown-name":    {amqp.Table{"plugbus-shorten-life": true}, []string{"plugbus-shorten-life"}},
		"sent-at-future":  {amqp.Table{rabbitmq.HeaderSentAt: future.UnixNano()}, []string{rabbitmq.HeaderSentAt}},
		"sent-at-type":    {amqp.Table{rabbitmq.HeaderSentAt: int32(5)}, []string{rabbitmq.HeaderSentAt}},
		"timestamp-ahead": {nil, []string{"timestamp"}},
		// The broker's redelivery count, on a first delivery: the publisher's.
		"delivery-count": {amqp.Table{"x-delivery-count": int64(50)}, nil},
	}
	for id, c := range cases {
		msg := amqp.Publishing{Type: "test.order", MessageId: id, ContentType: "application/json", Body: []byte(`{"id":1}`), Headers: c.headers}
		if id == "timestamp-ahead" {
			msg.Timestamp = future
		}
		e.adm.publish(t, e.endpoint, msg)
	}
	if got := e.adm.deadLetters(ctx, t, e.endpoint, len(cases)); len(got) != len(cases) {
		t.Fatalf("%d dead letters, want %d", len(got), len(cases))
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	warnings := logs.matching(slog.LevelWarn, "reserved header ignored")
	mu.Lock()
	defer mu.Unlock()
	for id, c := range cases {
		if got := attempts.of(id); !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("%s was received at attempts %v, want its full retries [1 2 3]", id, got)
		}
		s := seen[id]
		for _, h := range s.headers {
			if strings.HasPrefix(strings.ToLower(h), rabbitmq.ReservedPrefix) {
				t.Errorf("%s: middleware saw the reserved header %s as an ordinary one", id, h)
			}
		}
		if id == "upper-case" && !slices.Equal(s.headers, []string{"x-kept"}) {
			t.Errorf("%s: middleware saw headers %v, want [x-kept]", id, s.headers)
		}
		if strings.HasPrefix(id, "sent-at") || id == "timestamp-ahead" {
			if !s.sentAt.IsZero() {
				t.Errorf("%s: SentAt %v, want none (the only sent time given is not trusted)", id, s.sentAt)
			}
		}
		if s.attrs != 0 {
			t.Errorf("%s: %d attributes, want none (a foreign spelling is not an attribute)", id, s.attrs)
		}
		for _, h := range c.ignored {
			found := false
			for _, w := range warnings {
				found = found || w.attrs["header"] == h && w.attrs["message_id"] == id && w.attrs["reason"] != ""
			}
			if !found {
				t.Errorf("%s: no warning naming the ignored header %s and the message; logs:\n%s", id, h, logs)
			}
		}
	}
}

// An attempt header within the endpoint's range is the transport's own
// retry count (a message moved back from a dead-letter queue or a shovel
// keeps it): it is trusted, without a warning.
func TestAttemptHeaderInRangeIsTrusted(t *testing.T) {
	e := newEnv(t)
	logs := newRecordedLogs()
	tr := e.transport(t, rabbitmq.WithLogger(logs.logger()))
	ctx := testContext(t, 30*time.Second)
	if err := tr.Setup(ctx, bus.Topology{Endpoint: e.endpoint, Handles: []string{"test.order"}, MaxAttempts: 3, Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "test.order", MessageId: "a", Body: []byte(`{}`), Headers: amqp.Table{rabbitmq.HeaderAttempt: int32(3)}})
	d := receive(ctx, t, tr, 5*time.Second)
	if d.Attempt != 3 || d.Err != nil {
		t.Errorf("attempt %d (err %v), want 3", d.Attempt, d.Err)
	}
	if err := tr.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if w := logs.matching(slog.LevelWarn, "reserved header ignored"); len(w) != 0 {
		t.Errorf("warnings for a trusted header: %v", w)
	}
}

// A classic queue leaves a publisher's x-delivery-count as it is, even on
// a redelivery: a forged count above the maximum attempts is ignored, with
// a warning, rather than taken for the message's attempts.
func TestForgedDeliveryCountOnARedeliveryIsIgnored(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t, time.Minute)
	first := e.transport(t)
	setUp(ctx, t, first, e.endpoint)
	e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "test.forged", MessageId: "m-forged", Body: []byte("{}"),
		Headers: amqp.Table{"x-delivery-count": int64(1000)}})
	if d := receive(ctx, t, first, 5*time.Second); d.Attempt != 1 {
		t.Fatalf("first delivery: attempt %d, want 1", d.Attempt)
	}
	if err := first.Close(ctx); err != nil { // unsettled: the broker redelivers it
		t.Fatal(err)
	}
	second := e.transport(t)
	setUp(ctx, t, second, e.endpoint)
	d := receive(ctx, t, second, 5*time.Second)
	raw := d.Raw.(*amqp.Delivery)
	if !raw.Redelivered {
		t.Fatal("the second delivery is not a redelivery")
	}
	if d.Attempt > 5 {
		t.Errorf("redelivery: attempt %d from a forged x-delivery-count, want at most the maximum attempts (5)", d.Attempt)
	}
	if err := second.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

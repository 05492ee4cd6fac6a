package rabbitmq_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
	"github.com/plugbus/plugbus/transports/transporttest"
)

func retryHistory(t *testing.T, text string) bus.RetryHistory {
	t.Helper()
	var h bus.RetryHistory
	if err := h.UnmarshalText([]byte(text)); err != nil {
		t.Fatal(err)
	}
	return h
}

// Return carries the retry history the bus gave the delivery, and a
// history the bus cleared leaves the copy without the original's.
func TestReturnCarriesTheRetryHistory(t *testing.T) {
	e := newEnv(t)
	tr := e.transport(t)
	ctx := testContext(t, 30*time.Second)
	setUp(ctx, t, tr, e.endpoint)
	sendTo(ctx, t, tr, e.endpoint, message(transporttest.Name("retries"), "m-1"))
	d := receive(ctx, t, tr, 5*time.Second)
	if !d.Retries.IsZero() {
		t.Fatalf("a message never returned has retry history %+v", d.Retries)
	}
	h := retryHistory(t, `{"r":1,"f":"2026-12-01T10:00:00Z","l":"2026-12-01T10:00:01Z","e":["first failure"]}`)
	d.Retries = h
	if err := tr.Return(ctx, d, errors.New("first failure")); err != nil {
		t.Fatal(err)
	}
	again := receive(ctx, t, tr, 5*time.Second)
	if !again.Retries.LastFailure.Equal(h.LastFailure) || !slices.Equal(again.Retries.Errors, h.Errors) {
		t.Errorf("returned copy has retry history %+v, want %+v", again.Retries, h)
	}
	again.Retries = bus.RetryHistory{}
	if err := tr.Return(ctx, again, errors.New("history not trusted")); err != nil {
		t.Fatal(err)
	}
	cleared := receive(ctx, t, tr, 5*time.Second)
	if !cleared.Retries.IsZero() || cleared.Attempt != 3 {
		t.Errorf("copy of a delivery whose history the bus cleared: attempt %d, history %+v; want attempt 3 and none", cleared.Attempt, cleared.Retries)
	}
	if err := tr.Delete(ctx, cleared); err != nil {
		t.Fatal(err)
	}
}

// A retry history the transport cannot read (another producer's, or
// another version's) is ignored with a warning naming the header: the
// message is received, with no history.
func TestUnreadableRetryHistoryIsIgnoredWithAWarning(t *testing.T) {
	e := newEnv(t)
	logs := newRecordedLogs()
	tr := e.transport(t, rabbitmq.WithLogger(logs.logger()))
	ctx := testContext(t, 30*time.Second)
	setUp(ctx, t, tr, e.endpoint)
	for i, v := range []any{"not json", int32(3), `{"d":-1}`} {
		e.adm.publish(t, e.endpoint, amqp.Publishing{Type: "retries.bad", MessageId: "m", ContentType: "application/json", Body: []byte("{}"),
			Headers: amqp.Table{rabbitmq.HeaderRetries: v}})
		d := receive(ctx, t, tr, 5*time.Second)
		if !d.Retries.IsZero() || d.Err != nil {
			t.Errorf("%v: history %+v, error %v; want none and the message received", v, d.Retries, d.Err)
		}
		if _, ok := d.Headers[rabbitmq.HeaderRetries]; ok {
			t.Errorf("%v: the reserved header is among the message's headers", v)
		}
		if err := tr.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got := logs.await(wctx, slog.LevelWarn, "reserved header ignored", i+1)
		cancel()
		if len(got) != i+1 || got[i].attrs["header"] != rabbitmq.HeaderRetries {
			t.Errorf("%v: warnings %v, want one naming %s", v, got, rabbitmq.HeaderRetries)
		}
	}
}

package rabbitmq_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// admin is a plain amqp091 connection for what tests do behind the
// transport's back: deleting queues, reading dead letters, raw publishes.
// It reconnects when the broker was restarted.
type admin struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
}

func newAdmin(t testing.TB, url string) *admin {
	t.Helper()
	a := &admin{url: url}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.conn != nil {
			_ = a.conn.Close()
		}
	})
	if _, err := a.channel(); err != nil {
		t.Fatalf("admin connection: %v", err)
	}
	return a
}

func (a *admin) channel() (*amqp.Channel, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil || a.conn.IsClosed() {
		conn, err := amqp.Dial(a.url)
		if err != nil {
			return nil, err
		}
		a.conn = conn
	}
	return a.conn.Channel()
}

// do runs f on a fresh channel: a failed AMQP method closes its channel.
func (a *admin) do(t testing.TB, f func(ch *amqp.Channel) error) {
	t.Helper()
	ch, err := a.channel()
	if err != nil {
		t.Errorf("admin channel: %v", err)
		return
	}
	defer ch.Close()
	if err := f(ch); err != nil {
		t.Errorf("admin: %v", err)
	}
}

// deleteEndpoint removes an endpoint's queue and dead-letter queue.
func (a *admin) deleteEndpoint(t testing.TB, endpoint string) {
	for _, q := range []string{endpoint, rabbitmq.DeadLetterQueue(endpoint)} {
		a.do(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
	}
}

func (a *admin) deleteExchange(t testing.TB, name string) {
	a.do(t, func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
}

// publish publishes a raw message to queue and waits for its confirmation.
func (a *admin) publish(t testing.TB, queue string, msg amqp.Publishing) {
	t.Helper()
	a.do(t, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, msg)
		if err != nil {
			return err
		}
		if !dc.Wait() {
			t.Errorf("raw publish to %s nacked", queue)
		}
		return nil
	})
}

// deadLetters reads endpoint's dead-letter queue without removing anything:
// it consumes until it has n messages or ctx ends, then closes its channel
// without acknowledging, which puts them back.
func (a *admin) deadLetters(ctx context.Context, t testing.TB, endpoint string, n int) []bus.DeadLetter {
	t.Helper()
	ch, err := a.channel()
	if err != nil {
		t.Fatalf("admin channel: %v", err)
	}
	defer ch.Close()
	dl, err := ch.Consume(rabbitmq.DeadLetterQueue(endpoint), "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consuming the dead-letter queue of %s: %v", endpoint, err)
	}
	var out []bus.DeadLetter
	for len(out) < n {
		select {
		case m, ok := <-dl:
			if !ok {
				t.Fatalf("dead-letter consumer of %s closed", endpoint)
			}
			d, err := rabbitmq.DecodeDeadLetter(m)
			if err != nil {
				t.Errorf("decoding dead letter: %v", err)
			}
			out = append(out, d)
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// open returns a transport on exchange whose endpoint queues are deleted
// at cleanup.
func open(t testing.TB, url string, adm *admin, opts ...rabbitmq.Option) *rabbitmq.Transport {
	t.Helper()
	tr, err := rabbitmq.New(url, append([]rabbitmq.Option{rabbitmq.WithBackoff(bus.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond})}, opts...)...)
	if err != nil {
		t.Fatalf("rabbitmq.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tr.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if ep := tr.Endpoint(); ep != "" {
			adm.deleteEndpoint(t, ep)
		}
	})
	return tr
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// logRecord is one captured log line: its level, message and attributes
// (groups flattened into dotted keys), and its whole text.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
	text  string
}

// recordedLogs is a slog.Handler that keeps every record, for tests that
// check what was logged.
type recordedLogs struct {
	mu      sync.Mutex
	records []logRecord
	changed chan struct{} // closed and replaced on each record
	attrs   []slog.Attr   // of WithAttrs
}

func newRecordedLogs() *recordedLogs { return &recordedLogs{changed: make(chan struct{})} }

func (l *recordedLogs) logger() *slog.Logger { return slog.New(l) }

func (l *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }

func (l *recordedLogs) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	add := func(a slog.Attr) bool {
		v := a.Value.Resolve()
		rec.attrs[a.Key] = v.String()
		if v.Kind() == slog.KindTime {
			rec.attrs[a.Key] = v.Time().Format(time.RFC3339Nano)
		}
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.attrs {
		add(a)
	}
	r.Attrs(add)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for k, v := range rec.attrs {
		fmt.Fprintf(&b, " %s=%q", k, v)
	}
	rec.text = b.String()
	l.records = append(l.records, rec)
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

func (l *recordedLogs) WithAttrs(attrs []slog.Attr) slog.Handler {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The transport adds one attribute ("transport") once: sharing the
	// records between the parent and the child keeps every line in one place.
	l.attrs = append(l.attrs, attrs...)
	return l
}

func (l *recordedLogs) WithGroup(string) slog.Handler { return l }

// matching returns the records at level whose message contains msg.
func (l *recordedLogs) matching(level slog.Level, msg string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.records {
		if r.level == level && strings.Contains(r.msg, msg) {
			out = append(out, r)
		}
	}
	return out
}

// await waits until n records at level contain msg, or ctx ends.
func (l *recordedLogs) await(ctx context.Context, level slog.Level, msg string, n int) []logRecord {
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if got := l.matching(level, msg); len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return l.matching(level, msg)
		}
	}
}

// String returns every line, for a failure message.
func (l *recordedLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.records {
		b.WriteString(r.text)
		b.WriteByte('\n')
	}
	return b.String()
}

// depth returns how many messages are ready in queue.
func (a *admin) depth(t testing.TB, queue string) int {
	t.Helper()
	n := -1
	a.do(t, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// declareQueue declares a durable queue deleted at cleanup.
func (a *admin) declareQueue(t testing.TB, queue string) {
	t.Helper()
	a.do(t, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	})
	t.Cleanup(func() {
		a.do(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(queue, false, false, false); return err })
	})
}

// get takes the messages ready in queue, up to n, acknowledging them.
func (a *admin) get(t testing.TB, queue string, n int) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	a.do(t, func(ch *amqp.Channel) error {
		for len(out) < n {
			m, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	return out
}

// deadLetter sends n messages named name to endpoint ep of tr, receives
// each and fails it with reason: n dead letters, with the message ids
// ep-0 to ep-(n-1).
func deadLetter(ctx context.Context, tb testing.TB, tr *rabbitmq.Transport, ep, name string, n int, reason string) {
	tb.Helper()
	for i := range n {
		env := &bus.Envelope{Name: name, ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i),
			Attributes: bus.NewAttributes(fmt.Sprintf("%s-%d", ep, i), "", time.Now(), nil, nil)}
		if err := tr.Send(ctx, env, ep); err != nil {
			tb.Fatal(err)
		}
		d, err := tr.Receive(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		if err := tr.Fail(ctx, d, bus.Failure{Reason: reason, Endpoint: ep, Attempts: 1}); err != nil {
			tb.Fatal(err)
		}
	}
}

package requestreply_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/plugins/requestreply"
	"github.com/plugbus/plugbus/transports/transporttest"
)

// Messages of the scenarios.
type add struct{ A, B, Seq int }

func (add) MessageName() string { return "rrtest.add" }

type sum struct {
	Seq, Value int
	Responder  string
}

func (sum) MessageName() string { return "rrtest.sum" }

type never struct{} // handled without a reply

func (never) MessageName() string { return "rrtest.never" }

type slow struct{ Seq int } // replied once the test opens its gate

func (slow) MessageName() string { return "rrtest.slow" }

type lookup struct{ Key string }

func (lookup) MessageName() string { return "rrtest.lookup" }

type flaky struct{ Seq int } // fails on its first delivery

func (flaky) MessageName() string { return "rrtest.flaky" }

// world is three responder instances sharing one endpoint and three
// requester instances without an endpoint, on one transport.
type world struct {
	endpoint   string
	responders []*bus.Bus
	requesters []*bus.Bus
	plugins    map[*bus.Bus]*requestreply.Plugin
	late       chan string // request ids of late replies, from the requesters' logs

	mu      sync.Mutex
	gates   map[int]chan struct{}
	started chan int // seq of slow requests being handled
	fails   map[int]int
	served  map[string]*atomic.Int64
}

// newWorld builds and starts the world; newT makes one transport per bus.
func newWorld(t *testing.T, newT func(testing.TB) bus.Transport, opts ...requestreply.Option) *world {
	t.Helper()
	w := &world{
		endpoint: transporttest.Name("rr-resp"),
		plugins:  map[*bus.Bus]*requestreply.Plugin{},
		late:     make(chan string, 1024),
		gates:    map[int]chan struct{}{},
		started:  make(chan int, 64),
		fails:    map[int]int{},
		served:   map[string]*atomic.Int64{},
	}
	quiet := slog.New(slog.DiscardHandler)
	for i := range 3 {
		name := fmt.Sprintf("responder-%d", i)
		w.served[name] = new(atomic.Int64)
		p := requestreply.New(opts...)
		b := start(t, p, bus.WithName(name), bus.WithEndpoint(w.endpoint), bus.WithTransport(newT(t)), bus.WithLogger(quiet),
			bus.WithConcurrency(16), bus.WithMaxAttempts(3),
			bus.WithHandler(func(ctx context.Context, m add, _ bus.Attributes) error {
				w.served[name].Add(1)
				return requestreply.Reply(ctx, sum{Seq: m.Seq, Value: m.A + m.B, Responder: name})
			}),
			bus.WithHandler(func(context.Context, never, bus.Attributes) error { return nil }),
			bus.WithHandler(func(ctx context.Context, m slow, _ bus.Attributes) error {
				w.started <- m.Seq
				<-w.gate(m.Seq)
				return requestreply.Reply(ctx, sum{Seq: m.Seq, Responder: name})
			}),
			bus.WithHandler(func(ctx context.Context, m lookup, _ bus.Attributes) error {
				switch m.Key {
				case "missing":
					return requestreply.Errorf("not_found", "no key %q", m.Key)
				case "explicit":
					if err := requestreply.ReplyError(ctx, errors.New("disk on fire")); err != nil {
						return err
					}
					return nil
				}
				return requestreply.Reply(ctx, sum{Responder: name})
			}),
			bus.WithHandler(func(ctx context.Context, m flaky, _ bus.Attributes) error {
				w.mu.Lock()
				w.fails[m.Seq]++
				n := w.fails[m.Seq]
				w.mu.Unlock()
				if n == 1 {
					return errors.New("first attempt fails")
				}
				return requestreply.Reply(ctx, sum{Seq: m.Seq, Value: n, Responder: name})
			}),
		)
		w.responders = append(w.responders, b)
		w.plugins[b] = p
	}
	for i := range 3 {
		p := requestreply.New(opts...)
		logger := slog.New(&lateHandler{late: w.late})
		b := start(t, p, bus.WithName(fmt.Sprintf("requester-%d", i)), bus.WithTransport(newT(t)), bus.WithLogger(logger))
		w.requesters = append(w.requesters, b)
		w.plugins[b] = p
	}
	t.Cleanup(w.openAll) // before the buses stop: a handler still waiting would hold up Stop
	return w
}

func start(t *testing.T, p *requestreply.Plugin, opts ...bus.Option) *bus.Bus {
	t.Helper()
	if p != nil {
		opts = append(opts, bus.WithMiddleware(p))
	}
	b, err := bus.New(opts...)
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("bus.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("bus.Stop(%s): %v", b.Name(), err)
		}
	})
	return b
}

// openAllOnCleanup opens every gate when t ends, before the buses t
// started since stop.
func (w *world) openAllOnCleanup(t *testing.T) { t.Cleanup(w.openAll) }

func (w *world) gate(seq int) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.gates[seq]
	if g == nil {
		g = make(chan struct{})
		w.gates[seq] = g
	}
	return g
}

func (w *world) open(seq int) {
	g := w.gate(seq)
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-g:
	default:
		close(g)
	}
}

func (w *world) openAll() {
	w.mu.Lock()
	seqs := make([]int, 0, len(w.gates))
	for s := range w.gates {
		seqs = append(seqs, s)
	}
	w.mu.Unlock()
	for _, s := range seqs {
		w.open(s)
	}
}

// checkNoPending fails t when a requester still holds pending requests.
func (w *world) checkNoPending(t *testing.T) {
	t.Helper()
	for _, b := range w.requesters {
		if n := w.plugins[b].Stats(b).Pending; n != 0 {
			t.Errorf("%s: %d requests still pending", b.Name(), n)
		}
	}
}

// waitStarted waits until the slow request seq is being handled.
func (w *world) waitStarted(t *testing.T, seq int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case s := <-w.started:
			if s == seq {
				return
			}
		case <-timeout:
			t.Fatalf("slow request %d never reached a responder", seq)
		}
	}
}

// waitLate waits until requester b has dropped more than before late
// replies. Each dropped late reply is logged, which wakes the wait: a log
// record left from an earlier reply (one the broker delivered twice, say)
// cannot end it early.
func (w *world) waitLate(t *testing.T, b *bus.Bus, before uint64) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for w.plugins[b].Stats(b).Late <= before {
		select {
		case <-w.late:
		case <-timeout:
			t.Fatalf("%s dropped no late reply", b.Name())
		}
	}
}

// lateHandler reports "late reply dropped" debug records on a channel.
type lateHandler struct{ late chan string }

func (h *lateHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelDebug }
func (h *lateHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "late reply dropped") {
		id := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "request_id" {
				id = a.Value.String()
			}
			return true
		})
		select {
		case h.late <- id:
		default:
		}
	}
	return nil
}
func (h *lateHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lateHandler) WithGroup(string) slog.Handler      { return h }

// runScenarios runs every request/reply scenario on one world.
func runScenarios(t *testing.T, newT func(testing.TB) bus.Transport) *world {
	w := newWorld(t, newT)
	t.Run("ConcurrentRequestsReachTheirInstance", func(t *testing.T) { concurrent(t, w, 300) })
	t.Run("Timeout", func(t *testing.T) { timeout(t, w) })
	t.Run("Cancellation", func(t *testing.T) { cancellation(t, w) })
	t.Run("ResponderError", func(t *testing.T) { responderError(t, w) })
	t.Run("HandlerFailureIsRetried", func(t *testing.T) { handlerFailure(t, w) })
	t.Run("ReplyAfterTimeoutDropped", func(t *testing.T) { lateReply(t, w) })
	return w
}

func concurrent(t *testing.T, w *world, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	var seen sync.Map
	for i := range n {
		wg.Go(func() {
			rb := w.requesters[i%len(w.requesters)]
			got, err := requestreply.Request[sum](ctx, rb, add{A: i, B: 2 * i, Seq: i}, requestreply.To(w.endpoint))
			switch {
			case err != nil:
				errs <- fmt.Errorf("request %d from %s: %w", i, rb.Name(), err)
			case got.Seq != i || got.Value != 3*i:
				errs <- fmt.Errorf("request %d from %s got the reply %+v of another request", i, rb.Name(), got)
			default:
				if _, dup := seen.LoadOrStore(i, true); dup {
					errs <- fmt.Errorf("request %d answered twice", i)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	w.checkNoPending(t)
	for name, c := range w.served {
		t.Logf("%s served %d requests", name, c.Load())
	}
}

func timeout(t *testing.T, w *world) {
	rb := w.requesters[0]
	began := time.Now()
	_, err := requestreply.Request[sum](t.Context(), rb, never{}, requestreply.To(w.endpoint), requestreply.WithTimeout(300*time.Millisecond))
	var te *requestreply.TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, requestreply.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Request of a message nobody answers: %v, want a *TimeoutError", err)
	}
	if te.Destination != w.endpoint || te.Request != "rrtest.never" || te.RequestID == "" {
		t.Errorf("TimeoutError = %+v", te)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("timed out after %v, want about 300ms", d)
	}
	// A context deadline works the same way.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := requestreply.Request[sum](ctx, rb, never{}, requestreply.To(w.endpoint)); !errors.Is(err, requestreply.ErrTimeout) {
		t.Fatalf("Request with a context deadline: %v", err)
	}
	w.checkNoPending(t)
}

func cancellation(t *testing.T, w *world) {
	rb := w.requesters[1]
	const seq = 1001
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](ctx, rb, slow{Seq: seq}, requestreply.To(w.endpoint), requestreply.WithTimeout(time.Minute))
		done <- err
	}()
	w.waitStarted(t, seq)
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || errors.Is(err, requestreply.ErrTimeout) {
		t.Fatalf("cancelled Request: %v, want context.Canceled", err)
	}
	w.checkNoPending(t)
	before := w.plugins[rb].Stats(rb).Late
	w.open(seq) // the reply now comes late
	w.waitLate(t, rb, before)
	w.checkNoPending(t)
}

func responderError(t *testing.T, w *world) {
	rb := w.requesters[2]
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := requestreply.Request[sum](ctx, rb, lookup{Key: "missing"}, requestreply.To(w.endpoint))
	var re *requestreply.Error
	if !errors.As(err, &re) || re.Code != "not_found" || re.Message != `no key "missing"` || !errors.Is(err, requestreply.ErrResponder) {
		t.Fatalf("returned *Error: %v", err)
	}
	_, err = requestreply.Request[sum](ctx, rb, lookup{Key: "explicit"}, requestreply.To(w.endpoint))
	if !errors.As(err, &re) || re.Code != "" || re.Message != "disk on fire" {
		t.Fatalf("ReplyError: %v", err)
	}
	if _, err := requestreply.Request[sum](ctx, rb, lookup{Key: "present"}, requestreply.To(w.endpoint)); err != nil {
		t.Fatalf("plain reply after errors: %v", err)
	}
	w.checkNoPending(t)
}

func handlerFailure(t *testing.T, w *world) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	got, err := requestreply.Request[sum](ctx, w.requesters[0], flaky{Seq: 7}, requestreply.To(w.endpoint))
	if err != nil {
		t.Fatalf("Request whose handler fails once: %v", err)
	}
	if got.Seq != 7 || got.Value != 2 {
		t.Fatalf("reply %+v, want the second attempt's", got)
	}
	w.checkNoPending(t)
}

func lateReply(t *testing.T, w *world) {
	rb := w.requesters[0]
	const seq = 2002
	done := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](t.Context(), rb, slow{Seq: seq}, requestreply.To(w.endpoint), requestreply.WithTimeout(time.Minute))
		done <- err
	}()
	// Time out only once the responder holds the request: with a short
	// timeout on a slow broker the request might not even be delivered yet.
	w.waitStarted(t, seq)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	errTimeout := make(chan error, 1)
	go func() {
		_, err := requestreply.Request[sum](ctx, rb, slow{Seq: seq + 1}, requestreply.To(w.endpoint))
		errTimeout <- err
	}()
	w.waitStarted(t, seq+1)
	if err := <-errTimeout; !errors.Is(err, requestreply.ErrTimeout) {
		t.Fatalf("Request: %v, want a timeout", err)
	}
	before := w.plugins[rb].Stats(rb).Late
	w.open(seq + 1) // replied after its request timed out
	w.waitLate(t, rb, before)
	if late := w.plugins[rb].Stats(rb).Late; late != before+1 {
		t.Errorf("Stats.Late = %d, want %d", late, before+1)
	}
	w.open(seq) // the other request still gets its reply
	if err := <-done; err != nil {
		t.Fatalf("request waiting beside a late reply: %v", err)
	}
	w.checkNoPending(t)
}

package bus_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/bus/bustest"
	"github.com/plugbus/plugbus/internal/testenv"
	"github.com/plugbus/plugbus/transports/memory"
)

// releaseEvent is one settlement or release the bus made.
type releaseEvent struct {
	op      string // delete, return, fail, release
	id      string // the message id
	attempt int
}

// releasingTransport is a recording transport that also takes deliveries
// back (bus.DeliveryReleaser), logging the settlements and the releases
// in the order the bus made them.
type releasingTransport struct {
	*bustest.Transport
	events chan releaseEvent
}

func (r *releasingTransport) log(op string, d *bus.Delivery) {
	r.events <- releaseEvent{op: op, id: d.Attributes.MessageID, attempt: d.Attempt}
}

func (r *releasingTransport) Delete(ctx context.Context, d *bus.Delivery) error {
	err := r.Transport.Delete(ctx, d)
	r.log("delete", d)
	return err
}

func (r *releasingTransport) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	err := r.Transport.Return(ctx, d, cause)
	r.log("return", d)
	return err
}

func (r *releasingTransport) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	err := r.Transport.Fail(ctx, d, f)
	r.log("fail", d)
	return err
}

func (r *releasingTransport) ReleaseDelivery(d *bus.Delivery) { r.log("release", d) }

// newReleasingEnv is newEnv over a releasing transport.
func newReleasingEnv(t *testing.T, opts ...bus.Option) (*env, *releasingTransport) {
	t.Helper()
	var r *releasingTransport
	e := newEnvOver(t, nil, func(rec *bustest.Transport) bus.Transport {
		r = &releasingTransport{Transport: rec, events: make(chan releaseEvent, 1000)}
		return r
	}, opts...)
	return e, r
}

// sendID sends an orderPlaced with message id id to the env's bus.
func (e *env) sendID(id string) {
	e.t.Helper()
	if err := e.bus.Send(e.t.Context(), orderPlaced{}, bus.WithMessageID(id)); err != nil {
		e.t.Fatal(err)
	}
}

// expectSeq reads the next events and checks their operations and
// message ids, given as pairs.
func (r *releasingTransport) expectSeq(t *testing.T, opsAndIDs ...string) {
	t.Helper()
	for i := 0; i < len(opsAndIDs); i += 2 {
		ev := await(t, r.events)
		if ev.op != opsAndIDs[i] || ev.id != opsAndIDs[i+1] {
			t.Fatalf("event %d: %s of %s, want %s of %s", i/2+1, ev.op, ev.id, opsAndIDs[i], opsAndIDs[i+1])
		}
	}
}

// A transport that reuses deliveries gets each back once it is settled.
func TestDeliveryReleasedAfterSettling(t *testing.T) {
	e, r := newReleasingEnv(t, bus.WithHandler(func(_ context.Context, m orderPlaced, _ bus.Attributes) error {
		if m.ID == "bad" {
			return errors.New("always fails")
		}
		return nil
	}))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{ID: "ok"}, bus.WithMessageID("a")); err != nil {
		t.Fatal(err)
	}
	r.expectSeq(t, "delete", "a", "release", "a")
	if err := e.bus.Send(ctx, orderPlaced{ID: "bad"}, bus.WithMessageID("b")); err != nil {
		t.Fatal(err)
	}
	// Three attempts: returned twice, then dead-lettered; each delivery is
	// released once settled.
	r.expectSeq(t, "return", "b", "release", "b", "return", "b", "release", "b", "fail", "b", "release", "b")
}

// A delivery whose handler middleware may still run on another goroutine
// is never released: that middleware can still read it.
func TestDeliveryNotReleasedWhileAMiddlewareMayReadIt(t *testing.T) {
	entered, release, late := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	detach := bus.Middleware{Name: "timeout", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		if h.Attributes().MessageID != "slow" || h.Attempt() != 1 {
			return next.Call(ctx)
		}
		go func() { late <- next.Call(ctx) }()
		<-entered
		return errors.New("timed out")
	}}
	probe := bus.Middleware{Name: "probe", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
		if h.Attributes().MessageID == "slow" && h.Attempt() == 1 {
			close(entered)
			<-release
		}
		return next.Call(ctx)
	}}
	e, r := newReleasingEnv(t, bus.WithMiddleware(detach, probe),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	e.sendID("slow")
	// With one worker, a release of "slow" would come right after its
	// return, before anything of the next message.
	r.expectSeq(t, "return", "slow")
	e.sendID("fast")
	settled := map[string]bool{}
	for range 4 { // fast, and the retry of slow, in either order
		ev := await(t, r.events)
		settled[ev.op+" "+ev.id] = true
		if ev.op == "release" && ev.id == "slow" && ev.attempt == 1 {
			t.Fatal("the first delivery of slow was released while its middleware still held it")
		}
	}
	if !settled["delete fast"] || !settled["release fast"] || !settled["delete slow"] || !settled["release slow"] {
		t.Fatalf("settlements %v", settled)
	}
	close(release)
	// The invocation ended (timed out) before probe called its next: the
	// handler does not run late on the first delivery.
	var nt *bus.NextMisuseError
	if err := await(t, late); !errors.As(err, &nt) || !nt.AfterReturn || nt.Middleware != "probe" {
		t.Fatalf("detached next: %v, want a *NextMisuseError after return from probe", err)
	}
}

// Bus.Deliver leaves the delivery to its caller: it is never released.
func TestDeliverDoesNotRelease(t *testing.T) {
	e, r := newReleasingEnv(t, bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	d := &bus.Delivery{Envelope: bus.Envelope{Name: orderPlaced{}.MessageName(), Body: []byte(`{}`),
		Attributes: bus.NewAttributes("pushed", "pushed", time.Now(), nil, nil)}}
	if err := e.bus.Deliver(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	select { // ReleaseDelivery would have run before Deliver returned
	case ev := <-r.events:
		t.Fatalf("%s of %s", ev.op, ev.id)
	default:
	}
}

// keepingTransport records the envelopes it is given, as a test fake
// does: it is not a bus.EnvelopeCopier, so every envelope it gets must
// stay its own.
type keepingTransport struct {
	bus.Transport
	mu   sync.Mutex
	envs []*bus.Envelope
	ids  []string // message ids as they were during Send
}

func (k *keepingTransport) Send(_ context.Context, env *bus.Envelope, _ string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.envs = append(k.envs, env)
	k.ids = append(k.ids, env.Attributes.MessageID)
	return nil
}

// copyingTransport is the same fake claiming to copy envelopes: the bus
// then hands it envelopes it reuses.
type copyingTransport struct{ *keepingTransport }

func (copyingTransport) CopiesEnvelopes() bool { return true }

// The bus lends its pooled envelopes only to a transport that copies
// what it keeps (bus.EnvelopeCopier): one that keeps them gets its own.
func TestEnvelopesAreReusedOnlyForTransportsThatCopyThem(t *testing.T) {
	for _, c := range []struct {
		name string
		wrap func(*keepingTransport) bus.Transport
		kept bool
	}{
		{"keeps envelopes", func(k *keepingTransport) bus.Transport { return k }, true},
		{"copies envelopes", func(k *keepingTransport) bus.Transport { return copyingTransport{k} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := &keepingTransport{Transport: memory.New()}
			b, err := bus.New(bus.WithTransport(c.wrap(k)), bus.WithRoute("elsewhere", orderPlaced{}), bus.WithLogger(discard()))
			if err != nil {
				t.Fatal(err)
			}
			ids := []string{"first", "second", "third"}
			for _, id := range ids {
				if err := b.Send(t.Context(), orderPlaced{ID: id}, bus.WithMessageID(id)); err != nil {
					t.Fatal(err)
				}
			}
			if len(k.envs) != len(ids) {
				t.Fatalf("transport got %d envelopes", len(k.envs))
			}
			for i, id := range ids {
				if k.ids[i] != id {
					t.Errorf("send %d: the transport saw message %s, want %s", i+1, k.ids[i], id)
				}
				if c.kept && k.envs[i].Attributes.MessageID != id {
					t.Errorf("envelope %d kept by the transport now holds message %s, want %s: the bus reused it", i+1, k.envs[i].Attributes.MessageID, id)
				}
			}
			// Sends one after another take the same pooled run; a collection
			// may empty the pool once, so two of the three suffice.
			if reused := k.envs[0] == k.envs[1] || k.envs[1] == k.envs[2]; !c.kept && !testenv.RaceEnabled && !reused {
				t.Error("a transport that copies envelopes got a new envelope for every send: the bus does not reuse them")
			}
		})
	}
}

// detachInnermost is a timeout middleware that is the innermost (only)
// layer of its stage: for message "slow" (in the handler stage: its
// handler "first") it runs next on another goroutine and returns once next
// has started, leaving the terminal step running there. late receives what
// that next returns.
func detachInnermost(stage bus.Stage, entered <-chan struct{}, late chan<- error) bus.Middleware {
	detach := func(ctx context.Context, id string, next bus.Next) error {
		if id != "slow" {
			return next.Call(ctx)
		}
		go func() { late <- next.Call(ctx) }()
		<-entered
		return errors.New("timed out")
	}
	if stage == bus.StageHandler {
		return bus.Middleware{Name: "timeout", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			if h.HandlerName() != "first" {
				return next.Call(ctx)
			}
			return detach(ctx, h.Attributes().MessageID, next)
		}}
	}
	return bus.Middleware{Name: "timeout", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		return detach(ctx, in.Attributes().MessageID, next)
	}}
}

// The terminal step of a stage still running on another goroutine keeps
// the delivery from being released, and the run from being reused: the
// handlers of "slow" run after the middleware returned and the message was
// dead-lettered, and the second still reads its own delivery.
func TestDeliveryNotReleasedWhileADetachedTerminalRuns(t *testing.T) {
	for _, stage := range []bus.Stage{bus.StageIncoming, bus.StageHandler} {
		t.Run(stage.String(), func(t *testing.T) {
			entered, proceed, late := make(chan struct{}), make(chan struct{}), make(chan error, 2)
			secondSaw := make(chan string, 1)
			var once sync.Once
			e, r := newReleasingEnv(t, bus.WithMiddleware(detachInnermost(stage, entered, late)), bus.WithMaxAttempts(1),
				bus.WithHandler(func(_ context.Context, _ orderPlaced, a bus.Attributes) error {
					if a.MessageID == "slow" {
						once.Do(func() { close(entered) })
						<-proceed
					}
					return nil
				}, bus.HandlerName("first")),
				bus.WithHandler(func(_ context.Context, _ orderPlaced, a bus.Attributes) error {
					if a.MessageID == "slow" && stage == bus.StageIncoming {
						secondSaw <- a.MessageID
					}
					return nil
				}, bus.HandlerName("second")))
			e.sendID("slow")
			// With one worker, a release of "slow" would come right after
			// its dead-lettering, before anything of the next message.
			r.expectSeq(t, "fail", "slow")
			e.sendID("fast")
			r.expectSeq(t, "delete", "fast", "release", "fast")
			close(proceed)
			if err := await(t, late); err != nil {
				t.Fatalf("detached next: %v", err)
			}
			if stage == bus.StageIncoming {
				if got := await(t, secondSaw); got != "slow" {
					t.Fatalf("second handler of slow saw %s", got)
				}
			}
		})
	}
}

// slowCopier copies envelopes (bus.EnvelopeCopier) but takes its time with
// "slow": it reads the envelope again once told to proceed.
type slowCopier struct {
	bus.Transport
	entered, proceed chan struct{}
	seen             chan string
}

func (*slowCopier) CopiesEnvelopes() bool { return true }

func (s *slowCopier) Send(_ context.Context, env *bus.Envelope, _ string) error {
	if env.Attributes.MessageID == "slow" {
		close(s.entered)
		<-s.proceed
		s.seen <- env.Attributes.MessageID
	}
	return nil
}

// An outgoing timeout middleware that returns while the transport still
// sends keeps the run, and the envelope in it, from being reused.
func TestEnvelopeNotReusedWhileADetachedSendRuns(t *testing.T) {
	tr := &slowCopier{Transport: memory.New(), entered: make(chan struct{}), proceed: make(chan struct{}), seen: make(chan string, 1)}
	late := make(chan error, 1)
	timeout := bus.Middleware{Name: "timeout", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
		if out.MessageID() != "slow" {
			return next.Call(ctx)
		}
		go func() { late <- next.Call(ctx) }()
		<-tr.entered
		return errors.New("send timed out")
	}}
	b, err := bus.New(bus.WithTransport(tr), bus.WithRoute("elsewhere", orderPlaced{}), bus.WithLogger(discard()), bus.WithMiddleware(timeout))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Send(t.Context(), orderPlaced{}, bus.WithMessageID("slow")); err == nil {
		t.Fatal("send of slow: want the timeout's error")
	}
	for range 3 { // would take the pooled run of slow, were it back in the pool
		if err := b.Send(t.Context(), orderPlaced{}, bus.WithMessageID("fast")); err != nil {
			t.Fatal(err)
		}
	}
	close(tr.proceed)
	if got := await(t, tr.seen); got != "slow" {
		t.Fatalf("the transport, still sending slow, reads message %q in its envelope", got)
	}
	if err := await(t, late); err != nil {
		t.Fatalf("detached send: %v", err)
	}
}

// Many messages handled at once through pooled runs each see their own
// context and attributes, never another message's.
func TestPooledRunsNeverMixTwoMessages(t *testing.T) {
	const n = 3000
	mismatch := make(chan string, 1)
	check := bus.Middleware{
		Name: "check",
		Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			return next.Call(context.WithValue(ctx, messageIDKey{}, in.Attributes().MessageID))
		},
		Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
			if ctx.Value(messageIDKey{}) != h.Attributes().MessageID {
				select {
				case mismatch <- h.Attributes().MessageID:
				default:
				}
			}
			return next.Call(ctx)
		},
		Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
			out.SetValue("sent-as", out.MessageID())
			return next.Call(ctx)
		},
	}
	var seen sync.Map
	var count atomic.Int64
	done := make(chan struct{})
	b := bustest.Start(t, bus.WithEndpoint("ep"), bus.WithLogger(discard()), bus.WithConcurrency(8), bus.WithMiddleware(check, passThrough("check2")),
		bus.WithHandler(func(ctx context.Context, m orderPlaced, a bus.Attributes) error {
			if v, _ := a.Value("sent-as"); v != a.MessageID || ctx.Value(messageIDKey{}) != a.MessageID {
				select {
				case mismatch <- a.MessageID:
				default:
				}
			}
			if _, dup := seen.LoadOrStore(a.MessageID, true); !dup && count.Add(1) == n {
				close(done)
			}
			return nil
		}))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if err := b.Send(t.Context(), orderPlaced{ID: strconv.Itoa(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-done:
	case id := <-mismatch:
		t.Fatalf("message %s saw another message's context", id)
	case <-time.After(30 * time.Second):
		t.Fatalf("handled %d of %d", count.Load(), n)
	}
	select {
	case id := <-mismatch:
		t.Fatalf("message %s saw another message's context", id)
	default:
	}
}

type messageIDKey struct{}

// passThrough is a middleware that only calls next, in the incoming and
// handler stages: a layer that gives pooled runs depth.
func passThrough(name string) bus.Middleware {
	return bus.Middleware{Name: name,
		Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) },
		Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) },
	}
}

// swallowTimeoutProbe is three layers of one stage for message "slow":
// "besteffort" catches what its next returns and returns nil (handled, as
// the docs allow), "timeout" runs its next on another goroutine and
// returns an error once the terminal step returned there, and "probe",
// on that goroutine, reads its stage context after its next returned,
// once told to proceed, and sends what it read to saw.
func swallowTimeoutProbe(stage bus.Stage, proceed <-chan struct{}, saw chan<- string) []bus.Plugin {
	terminalDone := make(chan struct{})
	besteffort := func(ctx context.Context, next bus.Next) error {
		_ = next.Call(ctx)
		return nil
	}
	timeout := func(ctx context.Context, id string, next bus.Next) error {
		if id != "slow" {
			return next.Call(ctx)
		}
		go func() { _ = next.Call(ctx) }()
		<-terminalDone // then it times out, while probe still runs
		return errors.New("timed out")
	}
	probed := func(id string, read func() string) {
		if id == "slow" {
			close(terminalDone)
			<-proceed
			saw <- read()
		}
	}
	switch stage {
	case bus.StageHandler:
		return []bus.Plugin{
			bus.Middleware{Name: "besteffort", Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return besteffort(ctx, next) }},
			bus.Middleware{Name: "timeout", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
				return timeout(ctx, h.Attributes().MessageID, next)
			}},
			bus.Middleware{Name: "probe", Handling: func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
				id := h.Attributes().MessageID
				err := next.Call(ctx)
				probed(id, func() string { return h.Attributes().MessageID })
				return err
			}},
		}
	case bus.StageOutgoing:
		return []bus.Plugin{
			bus.Middleware{Name: "besteffort", Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error { return besteffort(ctx, next) }},
			bus.Middleware{Name: "timeout", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				return timeout(ctx, out.MessageID(), next)
			}},
			bus.Middleware{Name: "probe", Outgoing: func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				id := out.MessageID()
				err := next.Call(ctx)
				probed(id, out.MessageID)
				return err
			}},
		}
	}
	return []bus.Plugin{
		bus.Middleware{Name: "besteffort", Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return besteffort(ctx, next) }},
		bus.Middleware{Name: "timeout", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			return timeout(ctx, in.Attributes().MessageID, next)
		}},
		bus.Middleware{Name: "probe", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
			id := in.Attributes().MessageID
			err := next.Call(ctx)
			probed(id, func() string { return in.Attributes().MessageID })
			return err
		}},
	}
}

// A timeout middleware may return an error while its next still runs
// elsewhere, and an outer middleware may catch that error and return nil:
// the terminal step returned nil, the chain too, but a layer still runs
// on another goroutine. The delivery must not be released, nor the run
// reused, while it may still read them.
func TestInnerLayerStillRunningAfterACaughtTimeout(t *testing.T) {
	for _, stage := range []bus.Stage{bus.StageIncoming, bus.StageHandler} {
		t.Run(stage.String(), func(t *testing.T) {
			proceed, saw := make(chan struct{}), make(chan string, 1)
			e, r := newReleasingEnv(t, bus.WithMiddleware(swallowTimeoutProbe(stage, proceed, saw)...),
				bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
			e.sendID("slow")
			// With one worker, a release of "slow" would come right after
			// its deletion, before anything of the next message.
			r.expectSeq(t, "delete", "slow")
			e.sendID("fast")
			if ev := await(t, r.events); ev.op != "delete" || ev.id != "fast" {
				// probe would read a released delivery: leave it waiting
				t.Fatalf("%s of %s while probe may still read the delivery of slow; want delete of fast", ev.op, ev.id)
			}
			r.expectSeq(t, "release", "fast")
			close(proceed)
			if got := await(t, saw); got != "slow" {
				t.Fatalf("probe of slow read message %q", got)
			}
		})
	}
	t.Run("outgoing", func(t *testing.T) {
		proceed, saw := make(chan struct{}), make(chan string, 1)
		b, err := bus.New(bus.WithTransport(memory.New()), bus.WithRoute("elsewhere", orderPlaced{}), bus.WithLogger(discard()),
			bus.WithMiddleware(swallowTimeoutProbe(bus.StageOutgoing, proceed, saw)...))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Send(t.Context(), orderPlaced{}, bus.WithMessageID("slow")); err != nil {
			t.Fatal(err)
		}
		for range 3 { // would take the pooled run of slow, were it back in the pool
			if err := b.Send(t.Context(), orderPlaced{}, bus.WithMessageID("fast")); err != nil {
				t.Fatal(err)
			}
		}
		close(proceed)
		if got := await(t, saw); got != "slow" {
			t.Fatalf("probe of slow read message %q", got)
		}
	})
}

// A middleware that panics while its next runs on another goroutine ends
// the invocation (the bus recovers the panic and retries the message):
// the delivery is not released and the run not reused while a layer
// still runs there, even once the terminal step returned.
func TestPanicWhileANextRunsElsewhere(t *testing.T) {
	terminalDone, proceed, saw := make(chan struct{}), make(chan struct{}), make(chan string, 1)
	panics := bus.Middleware{Name: "panics", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		if in.Attributes().MessageID != "slow" || in.Attempt() != 1 {
			return next.Call(ctx)
		}
		go func() { _ = next.Call(ctx) }()
		<-terminalDone
		panic("boom")
	}}
	probe := bus.Middleware{Name: "probe", Incoming: func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
		id, attempt := in.Attributes().MessageID, in.Attempt()
		err := next.Call(ctx)
		if id == "slow" && attempt == 1 {
			close(terminalDone)
			<-proceed
			saw <- in.Attributes().MessageID
		}
		return err
	}}
	e, r := newReleasingEnv(t, bus.WithMiddleware(panics, probe),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	e.sendID("slow")
	// With one worker, a release of "slow" would come right after its
	// return, before anything of the next message.
	r.expectSeq(t, "return", "slow")
	e.sendID("fast")
	for range 4 { // fast, and the retry of slow, in either order
		if ev := await(t, r.events); ev.op == "release" && ev.id == "slow" && ev.attempt == 1 {
			// probe would read a released delivery: leave it waiting
			t.Fatal("the first delivery of slow was released while probe may still read it")
		}
	}
	close(proceed)
	if got := await(t, saw); got != "slow" {
		t.Fatalf("probe of slow read message %q", got)
	}
}

// A timeout middleware returns an error while its next still runs on
// another goroutine, and the middleware around it logs the error it
// caught with its stage context's Logger, while the layer inside logs on
// that goroutine: both are legitimate (each layer's stage context is
// valid while its middleware runs), so the two loggers must be made
// without a data race (go test -race).
func TestLayersLogWhileATimedOutNextRuns(t *testing.T) {
	type layer struct {
		logger func() // the layer's Logger(), called for its effect
		next   func(context.Context) error
	}
	// chain returns the three layers' bodies, outermost first; done is
	// closed once the innermost returned on the timed-out goroutine.
	chain := func(done chan<- struct{}) [3]func(context.Context, layer) error {
		terminalDone := make(chan struct{})
		return [3]func(context.Context, layer) error{
			func(ctx context.Context, l layer) error { // logs what it caught
				if err := l.next(ctx); err != nil {
					l.logger()
				}
				return nil
			},
			func(ctx context.Context, l layer) error { // times out
				go func() { _ = l.next(ctx) }()
				<-terminalDone
				return errors.New("timed out")
			},
			func(ctx context.Context, l layer) error { // logs on the timed-out goroutine
				err := l.next(ctx)
				close(terminalDone)
				l.logger()
				close(done)
				return err
			},
		}
	}
	// stageLayer is body as a middleware of stage.
	stageLayer := func(stage bus.Stage, name string, body func(context.Context, layer) error) bus.Middleware {
		m := bus.Middleware{Name: name}
		switch stage {
		case bus.StageIncoming:
			m.Incoming = func(ctx context.Context, in *bus.Incoming, next *bus.IncomingNext) error {
				return body(ctx, layer{func() { _ = in.Logger() }, next.Call})
			}
		case bus.StageHandler:
			m.Handling = func(ctx context.Context, h *bus.Handling, next *bus.HandlingNext) error {
				return body(ctx, layer{func() { _ = h.Logger() }, next.Call})
			}
		case bus.StageOutgoing:
			m.Outgoing = func(ctx context.Context, out *bus.Outgoing, next *bus.OutgoingNext) error {
				return body(ctx, layer{func() { _ = out.Logger() }, next.Call})
			}
		}
		return m
	}
	for _, stage := range []bus.Stage{bus.StageIncoming, bus.StageHandler, bus.StageOutgoing} {
		t.Run(stage.String(), func(t *testing.T) {
			done := make(chan struct{})
			opts := []bus.Option{bus.WithTransport(memory.New()), bus.WithLogger(discard())}
			for i, body := range chain(done) {
				opts = append(opts, bus.WithMiddleware(stageLayer(stage, "l"+strconv.Itoa(i), body)))
			}
			if stage == bus.StageOutgoing {
				opts = append(opts, bus.WithRoute("elsewhere", orderPlaced{}))
			} else {
				opts = append(opts, bus.WithEndpoint("ep"), bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
			}
			b, err := bus.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			if stage == bus.StageOutgoing {
				err = b.Send(t.Context(), orderPlaced{})
			} else {
				err = b.Deliver(t.Context(), bustest.Delivery(orderPlaced{}, bus.Attributes{}))
			}
			if err != nil {
				t.Fatal(err)
			}
			await(t, done)
		})
	}
}

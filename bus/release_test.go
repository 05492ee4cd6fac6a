package bus_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// releaser is a recorder that also takes deliveries back
// (bus.DeliveryReleaser), recording the release among the settlements.
type releaser struct{ *recorder }

func (r releaser) ReleaseDelivery(d *bus.Delivery) {
	r.settled <- settle{op: "release", d: d}
}

func newReleasingEnv(t *testing.T, opts ...bus.Option) *env {
	t.Helper()
	return newEnvOver(t, nil, func(r *recorder) bus.Transport { return releaser{r} }, opts...)
}

// expectSeq reads the next settlements and checks their operations and
// message ids.
func (e *env) expectSeq(ops ...string) {
	e.t.Helper()
	for i := 0; i < len(ops); i += 2 {
		s := e.next()
		if s.op != ops[i] || s.d.Attributes.MessageID != ops[i+1] {
			e.t.Fatalf("settlement %d: %s of %s, want %s of %s", i/2+1, s.op, s.d.Attributes.MessageID, ops[i], ops[i+1])
		}
	}
}

func TestDeliveryReleasedAfterSettling(t *testing.T) {
	e := newReleasingEnv(t, bus.WithHandler(func(_ context.Context, m orderPlaced, _ bus.Attributes) error {
		if m.ID == "bad" {
			return errors.New("always fails")
		}
		return nil
	}))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{ID: "ok"}, bus.WithMessageID("a")); err != nil {
		t.Fatal(err)
	}
	e.expectSeq("delete", "a", "release", "a")
	if err := e.bus.Send(ctx, orderPlaced{ID: "bad"}, bus.WithMessageID("b")); err != nil {
		t.Fatal(err)
	}
	// Three attempts: returned twice, then dead-lettered; each delivery is
	// released once settled.
	e.expectSeq("return", "b", "release", "b", "return", "b", "release", "b", "fail", "b", "release", "b")
}

// A delivery whose handler middleware may still run on another goroutine
// is never released: that middleware can still read it.
func TestDeliveryNotReleasedWhileAMiddlewareMayReadIt(t *testing.T) {
	entered, release, late := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	detach := bus.Middleware{Name: "timeout", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
		if h.Attributes().MessageID != "slow" || h.Attempt() != 1 {
			return next(ctx)
		}
		go func() { late <- next(ctx) }()
		<-entered
		return errors.New("timed out")
	}}
	probe := bus.Middleware{Name: "probe", Handling: func(ctx context.Context, h *bus.Handling, next bus.Next) error {
		if h.Attributes().MessageID == "slow" && h.Attempt() == 1 {
			close(entered)
			<-release
		}
		return next(ctx)
	}}
	e := newReleasingEnv(t, bus.WithMiddleware(detach, probe),
		bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	ctx := t.Context()
	if err := e.bus.Send(ctx, orderPlaced{}, bus.WithMessageID("slow")); err != nil {
		t.Fatal(err)
	}
	// With one worker, a release of "slow" would come right after its
	// return, before anything of the next message.
	e.expectSeq("return", "slow")
	if err := e.bus.Send(ctx, orderPlaced{}, bus.WithMessageID("fast")); err != nil {
		t.Fatal(err)
	}
	settled := map[string]bool{}
	for range 4 { // fast, and the retry of slow, in either order
		s := e.next()
		settled[s.op+" "+s.d.Attributes.MessageID] = true
		if s.op == "release" && s.d.Attributes.MessageID == "slow" && s.d.Attempt == 1 {
			t.Fatal("the first delivery of slow was released while its middleware still held it")
		}
	}
	if !settled["delete fast"] || !settled["release fast"] || !settled["delete slow"] || !settled["release slow"] {
		t.Fatalf("settlements %v", settled)
	}
	close(release)
	if err := recv(t, late); err != nil {
		t.Fatalf("detached next: %v", err)
	}
}

// Bus.Deliver leaves the delivery to its caller: it is never released.
func TestDeliverDoesNotRelease(t *testing.T) {
	e := newReleasingEnv(t, bus.WithHandler(func(context.Context, orderPlaced, bus.Attributes) error { return nil }))
	d := &bus.Delivery{Envelope: bus.Envelope{Name: orderPlaced{}.MessageName(), Body: []byte(`{}`),
		Attributes: bus.NewAttributes("pushed", "pushed", time.Now(), nil, nil)}}
	if err := e.bus.Deliver(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	select { // ReleaseDelivery would have run before Deliver returned
	case s := <-e.rec.settled:
		t.Fatalf("%s of %s", s.op, s.d.Attributes.MessageID)
	default:
	}
}

// keeper records the envelopes it is given, as a test fake does: it is not
// a bus.EnvelopeCopier, so every envelope it gets must stay its own.
type keeper struct {
	bus.Transport
	mu   sync.Mutex
	envs []*bus.Envelope
	ids  []string // message ids as they were during Send
}

func (k *keeper) Send(_ context.Context, env *bus.Envelope, _ bus.SendOptions) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.envs = append(k.envs, env)
	k.ids = append(k.ids, env.Attributes.MessageID)
	return nil
}

// copier is the same fake claiming to copy envelopes: the bus may then
// hand it envelopes it reuses (whether it does depends on sync.Pool).
type copier struct{ *keeper }

func (copier) CopiesEnvelopes() bool { return true }

func TestEnvelopesAreReusedOnlyForTransportsThatCopyThem(t *testing.T) {
	for _, c := range []struct {
		name string
		wrap func(*keeper) bus.Transport
		kept bool
	}{
		{"keeper", func(k *keeper) bus.Transport { return k }, true},
		{"copier", func(k *keeper) bus.Transport { return copier{k} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := &keeper{Transport: memory.New()}
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
		})
	}
}

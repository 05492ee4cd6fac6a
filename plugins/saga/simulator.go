package saga

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
)

// EffectKind tells what a saga handler did.
type EffectKind uint8

// The effects.
const (
	EffectSend    EffectKind = iota + 1 // Context.Send
	EffectPublish                       // Context.Publish
	EffectTimeout                       // Context.RequestTimeout
)

// String implements fmt.Stringer.
func (k EffectKind) String() string {
	switch k {
	case EffectSend:
		return "send"
	case EffectPublish:
		return "publish"
	case EffectTimeout:
		return "timeout"
	}
	return fmt.Sprintf("EffectKind(%d)", uint8(k))
}

// Effect is a message a saga handler sent, published or asked to receive
// later, as the [Simulator] records it.
type Effect struct {
	Kind    EffectKind
	Message bus.Message
	Options []bus.SendOption // as given to Send or Publish
	// Delay and Attributes are a timeout's: deliver Message with
	// Attributes to [Simulator.Deliver] once Delay has passed.
	Delay      time.Duration
	Attributes bus.Attributes
}

// Simulator runs a saga in memory, with no bus and no store, on a clock
// of the caller's: package sagatest builds its harness on it. Instances
// are kept encoded as the store keeps them, so what a state loses in
// encoding is lost here too, and a send that every bus refuses
// ([bus.ValidateSend]) is refused with the bus's error. It is safe for
// concurrent use, one message at a time.
type Simulator[S any] struct {
	s         *Saga[S]
	now       func() time.Time
	logger    *slog.Logger
	mu        sync.Mutex
	instances map[string]sqlstore.SagaRow
}

// Simulator returns a simulator of s whose handlers read the time from
// now. Declarations that failed, or that bus.New refuses (no message, or
// none declared with StartedBy), are reported by [Simulator.Deliver].
func (s *Saga[S]) Simulator(now func() time.Time, logger *slog.Logger) *Simulator[S] {
	if logger == nil {
		logger = slog.Default()
	}
	return &Simulator[S]{s: s, now: now, logger: logger, instances: map[string]sqlstore.SagaRow{}}
}

// Deliver handles m, with attributes a, as the saga's handler on a bus
// would, and returns what the handler sent; nothing when it failed (the
// instance is then unchanged). A message type the saga does not declare
// returns an error.
func (sim *Simulator[S]) Deliver(ctx context.Context, m bus.Message, a bus.Attributes) ([]Effect, error) {
	if err := bus.ValidateSend(bus.KindSend, m); err != nil {
		return nil, err // no bus delivers what its Send refuses
	}
	s := sim.s
	s.mu.Lock()
	var err error
	if len(s.errs) > 0 {
		err = s.errs[0]
	} else {
		err = s.incomplete() // as bus.New would refuse
	}
	r := s.byName[m.MessageName()]
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, fmt.Errorf("saga %s: message %s is not declared", s.name, m.MessageName())
	}
	if r.timeout {
		if name, _ := a.Value(AttrSaga); name != s.name {
			return nil, nil
		}
	}
	key, err := r.key(m, a)
	if err != nil {
		return nil, bus.Permanent(err)
	}
	sim.mu.Lock()
	defer sim.mu.Unlock()
	var prev *sqlstore.SagaRow
	if cur, ok := sim.instances[key]; ok {
		prev = &cur
	}
	fx := &simEffects{clock: sim.now}
	out, err := s.step(ctx, r, m, a, key, prev, fx, nil, sim.logger.With(slog.String("saga", s.name), slog.String("key", key)))
	if err != nil {
		return nil, err
	}
	switch {
	case out.skip:
	case out.remove:
		delete(sim.instances, key)
	default:
		sim.instances[key] = out.next
	}
	return fx.done, nil
}

// State returns the state of the instance key, whether it exists (running
// or kept after completion) and whether it completed.
func (sim *Simulator[S]) State(key string) (state S, exists, completed bool, err error) {
	sim.mu.Lock()
	row, ok := sim.instances[key]
	sim.mu.Unlock()
	if !ok {
		return state, false, false, nil
	}
	if err := json.Unmarshal(row.State, &state); err != nil {
		return state, true, row.Completed, &StateError{Saga: sim.s.name, Key: key, Err: err}
	}
	return state, true, row.Completed, nil
}

// Keys returns the correlation values of the instances kept.
func (sim *Simulator[S]) Keys() []string {
	sim.mu.Lock()
	defer sim.mu.Unlock()
	keys := make([]string, 0, len(sim.instances))
	for k := range sim.instances {
		keys = append(keys, k)
	}
	return keys
}

// simEffects records what a handler does.
type simEffects struct {
	clock func() time.Time
	done  []Effect
}

func (e *simEffects) now() time.Time { return e.clock() }

// emit and timeout refuse, with the bus's errors, what every bus refuses.
func (e *simEffects) emit(_ context.Context, kind bus.Kind, msg bus.Message, opts []bus.SendOption) error {
	if err := bus.ValidateSend(kind, msg, opts...); err != nil {
		return err
	}
	k := EffectSend
	if kind == bus.KindPublish {
		k = EffectPublish
	}
	e.done = append(e.done, Effect{Kind: k, Message: msg, Options: opts})
	return nil
}

func (e *simEffects) timeout(_ context.Context, d time.Duration, msg bus.Message, attrs map[string]string) error {
	if err := bus.ValidateSend(bus.KindSend, msg); err != nil {
		return err
	}
	e.done = append(e.done, Effect{Kind: EffectTimeout, Message: msg, Delay: d,
		Attributes: bus.NewAttributes("", "", e.clock(), attrs, nil)})
	return nil
}

package bus

import (
	"context"
	"fmt"
	"slices"
	"strconv"
)

// This file is the in-process transport's [DeadLetterManager].

// deadLetterID numbers the broker's dead letters; called with br.mu held.
func (br *memBroker) deadLetterID() string {
	br.deadSeq++
	return strconv.FormatUint(br.deadSeq, 10)
}

// known reports whether the broker has endpoint's queue or its dead
// letters (a key of dead, even emptied): a queue is made by Setup, by a
// send to it and by a publish it subscribes to; dead letters by Fail.
func (br *memBroker) known(endpoint string) bool {
	br.mu.Lock()
	defer br.mu.Unlock()
	_, queue := br.queues[endpoint]
	_, dead := br.dead[endpoint]
	return queue || dead
}

// checkKnown returns a [*UnknownEndpointError] for an endpoint the broker
// does not know, naming those it does.
func (t *memTransport) checkKnown(ctx context.Context, endpoint string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.broker.known(endpoint) {
		return nil
	}
	return t.unknownEndpoint(ctx, endpoint, false)
}

// unknownEndpoint is the [*UnknownEndpointError] of endpoint (a replay's
// destination without a queue when destination is true), naming the
// endpoints the broker knows.
func (t *memTransport) unknownEndpoint(ctx context.Context, endpoint string, destination bool) error {
	known, err := t.Endpoints(ctx)
	if err != nil {
		return err
	}
	return &UnknownEndpointError{Endpoint: endpoint, Known: known, Destination: destination}
}

// CheckDestination implements [DestinationChecker]: a
// [*UnknownEndpointError] for a replay to an endpoint without a queue,
// whose send would make one that no bus reads.
func (t *memTransport) CheckDestination(ctx context.Context, to string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.broker.existingQueue(to) != nil {
		return nil
	}
	return t.unknownEndpoint(ctx, to, true)
}

// ListDeadLetters returns the dead letters f selects, oldest first.
func (t *memTransport) ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	if err := t.checkKnown(ctx, f.Endpoint); err != nil {
		return nil, err
	}
	return t.selectDead(f), nil
}

func (t *memTransport) selectDead(f DeadLetterFilter) []DeadLetter {
	t.broker.mu.Lock()
	defer t.broker.mu.Unlock()
	var out []DeadLetter
	match := f.Matcher()
	for _, dl := range t.broker.dead[f.Endpoint] {
		if f.Full(len(out)) {
			break
		}
		if match(dl) {
			out = append(out, *dl)
		}
	}
	return out
}

// CountDeadLetters returns how many dead letters endpoint has.
func (t *memTransport) CountDeadLetters(ctx context.Context, endpoint string) (int, error) {
	if err := t.checkKnown(ctx, endpoint); err != nil {
		return 0, err
	}
	t.broker.mu.Lock()
	defer t.broker.mu.Unlock()
	return len(t.broker.dead[endpoint]), nil
}

// QueueDepth returns how many messages wait in endpoint's queue.
func (t *memTransport) QueueDepth(ctx context.Context, endpoint string) (int, error) {
	if err := t.checkKnown(ctx, endpoint); err != nil {
		return 0, err
	}
	return t.broker.Depth(endpoint), nil
}

// Delivered returns how many messages were delivered from endpoint's queue.
func (t *memTransport) Delivered(ctx context.Context, endpoint string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q := t.broker.existingQueue(endpoint)
	if q == nil {
		return 0, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.popped, nil
}

// Endpoints names the endpoints with a queue or dead letters, sorted;
// instance queues are left out.
func (t *memTransport) Endpoints(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.broker.mu.Lock()
	defer t.broker.mu.Unlock()
	seen := make(map[string]struct{}, len(t.broker.queues)+len(t.broker.dead))
	for ep := range t.broker.queues {
		if !t.broker.instance[ep] {
			seen[ep] = struct{}{}
		}
	}
	for ep := range t.broker.dead {
		seen[ep] = struct{}{}
	}
	out := make([]string, 0, len(seen))
	for ep := range seen {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out, nil
}

// ReplayDeadLetters sends a copy of each dead letter f selects, then
// removes it. A destination without a queue is refused before the dead
// letter is taken.
func (t *memTransport) ReplayDeadLetters(ctx context.Context, f DeadLetterFilter, r Replay, done func(DeadLetter)) (int, error) {
	if err := f.Check(); err != nil {
		return 0, err
	}
	if err := t.checkKnown(ctx, f.Endpoint); err != nil {
		return 0, err
	}
	if r.To != "" {
		if err := t.CheckDestination(ctx, r.To); err != nil {
			return 0, fmt.Errorf("memory: replay to %s: %w; nothing was replayed", r.To, err)
		}
	}
	return t.eachDead(ctx, f, done, func(dl DeadLetter) error {
		env, to, err := ReplayEnvelope(dl, f.Endpoint, r)
		if err != nil {
			return err
		}
		if err := t.check(ctx); err != nil {
			return err
		}
		// The queue looked up once and the copy put into it, not a check
		// and then Send: Send drops a message to an instance queue that
		// closed in between, and the dead letter would be removed for a
		// copy that went nowhere.
		q := t.broker.existingQueue(to)
		if q == nil {
			err := t.unknownEndpoint(ctx, to, true)
			return fmt.Errorf("memory: replaying dead letter %s to %s: %w; it stays a dead letter of %s", dl.ID, to, err, f.Endpoint)
		}
		t.broker.enqueue(&memItem{env: copyEnvelope(env), attempt: 1, q: q}, env.Due)
		return nil
	})
}

// DeleteDeadLetters removes each dead letter f selects.
func (t *memTransport) DeleteDeadLetters(ctx context.Context, f DeadLetterFilter, done func(DeadLetter)) (int, error) {
	return t.eachDead(ctx, f, done, func(DeadLetter) error { return nil })
}

// eachDead runs act on each dead letter f selects and removes it once act
// succeeded, stopping between two when ctx ends.
func (t *memTransport) eachDead(ctx context.Context, f DeadLetterFilter, done func(DeadLetter), act func(DeadLetter) error) (int, error) {
	if err := f.Check(); err != nil {
		return 0, err
	}
	if err := t.checkKnown(ctx, f.Endpoint); err != nil {
		return 0, err
	}
	n := 0
	for _, dl := range t.selectDead(f) {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		t.broker.mu.Lock()
		dead := t.broker.dead[f.Endpoint]
		i := slices.IndexFunc(dead, func(d *DeadLetter) bool { return d.ID == dl.ID })
		if i < 0 {
			t.broker.mu.Unlock()
			continue // replayed or deleted by another operation meanwhile
		}
		claimed := dead[i]
		t.broker.dead[f.Endpoint] = slices.Delete(dead, i, i+1)
		t.broker.mu.Unlock()
		if err := act(dl); err != nil {
			t.broker.mu.Lock() // not done: back in its place
			d := t.broker.dead[f.Endpoint]
			t.broker.dead[f.Endpoint] = slices.Insert(d, min(i, len(d)), claimed)
			t.broker.mu.Unlock()
			return n, err
		}
		n++
		if done != nil {
			done(dl)
		}
	}
	return n, nil
}

var (
	_ DeadLetterManager  = (*memTransport)(nil)
	_ EndpointLister     = (*memTransport)(nil)
	_ DeliveryCounter    = (*memTransport)(nil)
	_ DestinationChecker = (*memTransport)(nil)
)

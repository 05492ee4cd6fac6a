package rabbitmq

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// This file is the transport's bus.DeadLetterManager. AMQP reads a queue
// only from its head, so each call goes through the dead-letter queue on a
// channel of its own: it gets each message without acknowledging it,
// acknowledges those it replayed or deleted and, at the end, gives the
// others back to the queue (basic.nack with requeue), where RabbitMQ puts
// them back in their place. While a call runs, the messages it holds are
// invisible to another one.

// replayTimeout bounds the publish and acknowledgement of the dead letter in
// hand, which a cancelled context does not interrupt (so that it is never
// both replayed and left).
const replayTimeout = 30 * time.Second

// ListDeadLetters implements bus.DeadLetterManager: the dead letters of
// f.Endpoint's queue [DeadLetterQueue] that f selects, in queue order.
// Their ID is the message id (a hash of the message when it has none).
func (t *Transport) ListDeadLetters(ctx context.Context, f bus.DeadLetterFilter) ([]bus.DeadLetter, error) {
	var out []bus.DeadLetter
	_, err := t.eachDead(ctx, f, 1, func(dl bus.DeadLetter) (bool, error) {
		out = append(out, dl)
		return false, nil
	}, nil)
	return out, err
}

// CountDeadLetters implements bus.DeadLetterManager: the messages ready in
// the dead-letter queue (0 when only the endpoint's queue exists).
func (t *Transport) CountDeadLetters(ctx context.Context, endpoint string) (int, error) {
	return t.queueMessages(ctx, endpoint, DeadLetterQueue(endpoint), endpoint)
}

// QueueDepth implements bus.DeadLetterManager: the messages ready in the
// endpoint's queue (0 when only its dead-letter queue exists).
func (t *Transport) QueueDepth(ctx context.Context, endpoint string) (int, error) {
	return t.queueMessages(ctx, endpoint, endpoint, DeadLetterQueue(endpoint))
}

// queueMessages returns the messages ready in queue, one of endpoint's two
// queues: 0 when it does not exist but the other one does, a
// [*bus.UnknownEndpointError] when neither does.
func (t *Transport) queueMessages(ctx context.Context, endpoint, queue, other string) (int, error) {
	q, found, err := t.lookupQueue(ctx, queue)
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: reading the depth of queue %s: %w", queue, err)
	}
	if found {
		return q.Messages, nil
	}
	return 0, t.otherQueue(ctx, endpoint, other)
}

// lookupQueue reads queue with a passive queue.declare on a channel of its
// own (a queue that does not exist closes the channel); found is false
// when it does not exist. An exclusive queue of another connection (an
// instance queue) exists, but its figures cannot be read: they are zero.
// A name longer than AMQP allows names no queue, and is not sent: the
// client would fail to encode it and close the whole connection.
func (t *Transport) lookupQueue(ctx context.Context, queue string) (q amqp.Queue, found bool, err error) {
	if len(queue) > maxShortString {
		return q, false, nil
	}
	ch, err := t.manageChannel(ctx, queue)
	if err != nil {
		return q, false, err
	}
	defer func() { _ = ch.Close() }()
	q, err = ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		return q, true, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
		return q, false, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.ResourceLocked:
		return amqp.Queue{Name: queue}, true, nil
	}
	return q, false, err
}

// unknownEndpoint is the error for an endpoint without either queue.
func unknownEndpoint(endpoint string) error {
	return fmt.Errorf("rabbitmq: neither queue %s nor %s exists: %w", endpoint, DeadLetterQueue(endpoint), &bus.UnknownEndpointError{Endpoint: endpoint})
}

// CheckDestination implements bus.DestinationChecker: a
// [*bus.UnknownEndpointError] for a replay to an endpoint whose queue does
// not exist (looked up with a passive queue.declare), which
// [Transport.ReplayDeadLetters] refuses; nil when the queue exists.
// Without that check the copy would be unroutable (or, for an instance
// queue's name, dropped).
func (t *Transport) CheckDestination(ctx context.Context, to string) error {
	if len(to) > maxShortString {
		return fmt.Errorf("rabbitmq: replay destination %.40q is longer than %d bytes", to, maxShortString)
	}
	_, found, err := t.lookupQueue(ctx, to)
	switch {
	case err != nil:
		return fmt.Errorf("rabbitmq: looking up queue %s, the replay's destination: %w", to, err)
	case !found:
		return fmt.Errorf("rabbitmq: queue %s does not exist: %w", to, &bus.UnknownEndpointError{Endpoint: to, Destination: true})
	}
	return nil
}

// ReplayDeadLetters implements bus.DeadLetterManager: each dead letter f
// selects is sent (bus.ReplayEnvelope's copy, through the default
// exchange, confirmed by the broker) to r.To or the endpoint that failed
// it, then acknowledged in the dead-letter queue. Up to 16 copies wait for
// their confirmation at once; when ctx ends, those are finished. A
// destination whose queue does not exist is a [*bus.UnknownEndpointError],
// before any dead letter is taken for r.To, before the dead letter is
// copied for its own endpoint: it stays in the dead-letter queue.
func (t *Transport) ReplayDeadLetters(ctx context.Context, f bus.DeadLetterFilter, r bus.Replay, done func(bus.DeadLetter)) (int, error) {
	if err := f.Check(); err != nil {
		return 0, err
	}
	dlq := DeadLetterQueue(f.Endpoint)
	var (
		mu      sync.Mutex
		checked = map[string]error{} // destination → CheckDestination's answer
	)
	if r.To != "" {
		if err := t.CheckDestination(ctx, r.To); err != nil {
			return 0, fmt.Errorf("rabbitmq: replay to %s: %w; nothing was replayed", r.To, err)
		}
		checked[r.To] = nil
	}
	destination := func(ctx context.Context, to string) error {
		mu.Lock()
		err, ok := checked[to]
		mu.Unlock()
		if !ok {
			err = t.CheckDestination(ctx, to)
			mu.Lock()
			checked[to] = err
			mu.Unlock()
		}
		return err
	}
	return t.eachDead(ctx, f, replayWindow, func(dl bus.DeadLetter) (bool, error) {
		env, to, err := bus.ReplayEnvelope(dl, f.Endpoint, r)
		if err != nil {
			return false, err
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayTimeout)
		defer cancel()
		if err := destination(sctx, to); err != nil {
			return false, fmt.Errorf("rabbitmq: replaying dead letter %s to %s: %w (it stays in %s)", dl.ID, to, err, dlq)
		}
		for k := range env.Headers {
			if brokerDeathHeader(k) {
				delete(env.Headers, k) // RabbitMQ's own dead-lettering record: it adds a new one
			}
		}
		// Not Send, which drops a message to a missing instance queue: a
		// copy that reaches no queue leaves the dead letter in place.
		if err := t.emit(sctx, env, "", to, true); err != nil {
			return false, fmt.Errorf("rabbitmq: replaying dead letter %s to %s: %w (it stays in %s)", dl.ID, to, err, dlq)
		}
		return true, nil
	}, done)
}

// DeleteDeadLetters implements bus.DeadLetterManager: each dead letter f
// selects is acknowledged in the dead-letter queue.
func (t *Transport) DeleteDeadLetters(ctx context.Context, f bus.DeadLetterFilter, done func(bus.DeadLetter)) (int, error) {
	return t.eachDead(ctx, f, 1, func(bus.DeadLetter) (bool, error) { return true, nil }, done)
}

func brokerDeathHeader(k string) bool {
	return k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// manageChannel opens a channel of its own for a dead-letter operation.
func (t *Transport) manageChannel(ctx context.Context, queue string) (*amqp.Channel, error) {
	s, err := t.session(ctx, func() string { return "reading queue " + queue })
	if err != nil {
		return nil, err
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: opening a channel to read queue %s: %w", queue, err)
	}
	return ch, nil
}

// replayWindow is how many replays of one bulk operation wait for their
// broker confirmation at once.
const replayWindow = 16

// eachDead gets the messages of f.Endpoint's dead-letter queue one by one
// and calls act for each one f selects (up to f.Limit), up to window of
// them at once: when act reports true, the message is acknowledged
// (removed) and done called, one call at a time. The others go back to
// the queue at the end, once every act has returned. When ctx ends it gets
// no further message and returns ctx's error once the acts in hand have
// finished; after an act's error it does the same with that error. A
// dead letter is acted on once per operation: one that comes back under
// an ID already acted on (a replayed copy that failed again) is left.
func (t *Transport) eachDead(ctx context.Context, f bus.DeadLetterFilter, window int, act func(bus.DeadLetter) (bool, error), done func(bus.DeadLetter)) (int, error) {
	if err := f.Check(); err != nil {
		return 0, err
	}
	queue := DeadLetterQueue(f.Endpoint)
	if len(queue) > maxShortString {
		// No queue has that name, and a basic.get of it would close the
		// connection (the client cannot encode it).
		return 0, t.otherQueue(ctx, f.Endpoint, f.Endpoint)
	}
	ch, err := t.manageChannel(ctx, queue)
	if err != nil {
		return 0, err
	}
	var (
		// acted holds the IDs acted on: a replayed copy that fails again
		// while the operation runs comes back under the same ID (its
		// message id), and is left alone rather than replayed twice.
		acted    = map[string]struct{}{}
		wg       sync.WaitGroup
		mu       sync.Mutex // guards n, actErr and the calls of done
		n        int
		actErr   error
		slots    = make(chan struct{}, max(1, window))
		held     uint64 // the last delivery tag got
		scanErr  error
		selected int
		match    = f.Matcher()
	)
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return actErr
	}
	one := func(m amqp.Delivery, dl bus.DeadLetter) {
		remove, err := act(dl)
		if err == nil && remove {
			if aerr := ch.Ack(m.DeliveryTag, false); aerr != nil {
				err = fmt.Errorf("rabbitmq: removing dead letter %s from %s: %w", dl.ID, queue, aerr)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			actErr = cmp.Or(actErr, err)
		case remove:
			n++
			if done != nil {
				done(dl)
			}
		}
	}
scan:
	for !f.Full(selected) {
		if scanErr = cmp.Or(failed(), ctx.Err()); scanErr != nil {
			break
		}
		m, ok, err := ch.Get(queue, false)
		var amqpErr *amqp.Error
		switch {
		case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound && held == 0:
			scanErr = t.otherQueue(ctx, f.Endpoint, f.Endpoint)
			break scan
		case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
			break scan // deleted meanwhile: what was held went with it
		case err != nil:
			scanErr = fmt.Errorf("rabbitmq: reading dead-letter queue %s: %w", queue, err)
			break scan
		case !ok:
			break scan
		}
		held = m.DeliveryTag
		dl, _ := DecodeDeadLetter(m) // what cannot be read is shown as it came
		dl.ID = deadLetterID(&m)
		if !match(&dl) {
			continue
		}
		if _, again := acted[dl.ID]; again {
			continue // held, and given back at the end
		}
		acted[dl.ID] = struct{}{}
		selected++
		if window <= 1 {
			one(m, dl)
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			one(m, dl)
		})
	}
	wg.Wait() // before the nack below, which would give back a message being replayed
	err = cmp.Or(failed(), scanErr)
	if held > 0 {
		if nerr := ch.Nack(held, true, true); nerr != nil && err == nil {
			err = fmt.Errorf("rabbitmq: giving the dead letters back to %s: %w (closing the channel gives them back)", queue, nerr)
		}
	}
	_ = ch.Close() // gives back, too, what the nack could not
	return n, err
}

// otherQueue is the answer for an endpoint one of whose two queues does
// not exist: nil (nothing in it) if other, the other one, exists, else a
// [*bus.UnknownEndpointError].
func (t *Transport) otherQueue(ctx context.Context, endpoint, other string) error {
	_, found, err := t.lookupQueue(ctx, other)
	switch {
	case err != nil:
		return fmt.Errorf("rabbitmq: looking up queue %s: %w", other, err)
	case !found:
		return unknownEndpoint(endpoint)
	}
	return nil
}

// deadLetterID is the message id, or a hash of a message without one.
func deadLetterID(m *amqp.Delivery) string {
	if m.MessageId != "" {
		return m.MessageId
	}
	h := sha256.New()
	h.Write([]byte(m.Type))
	h.Write([]byte{0})
	h.Write(m.Body)
	if s, ok := m.Headers[HeaderFailureTime].(string); ok {
		h.Write([]byte(s))
	}
	return "sha256-" + hex.EncodeToString(h.Sum(nil)[:12])
}

var (
	_ bus.DeadLetterManager  = (*Transport)(nil)
	_ bus.DestinationChecker = (*Transport)(nil)
)

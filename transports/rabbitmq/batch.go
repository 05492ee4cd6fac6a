package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// SendBatch implements bus.Batcher: it publishes every message of batch on
// one confirm channel without waiting, then awaits all the broker's
// confirmations, so that a batch costs about one round trip to the broker;
// the batch's frames reach the broker in one write (or one per 64 KiB), so
// that it stores and confirms them together. Each message goes where
// [Transport.Send] or [Transport.Publish] would send it and fails as they
// would (an [*UnroutableError], a [*bus.MessageTooLargeError], ...), alone:
// the *bus.BatchError names it by index. A message with a due time ahead
// goes through the delay queues, one by one, as Send does; so does a
// message whose channel the broker closed before confirming it (it is
// published again, as Send publishes again after a lost connection, so it
// may arrive twice). The connection is awaited as for Send; an
// [*UnreachableError] or bus.ErrClosed is then the error of the whole
// batch.
func (t *Transport) SendBatch(ctx context.Context, batch []bus.Outbound) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s, err := t.session(ctx, func() string { return "batch of " + strconv.Itoa(len(batch)) + " messages" })
	if err != nil {
		return err
	}
	errs := make([]error, len(batch))
	var oneByOne []int // delayed, or not confirmed on the pipelined path for want of a channel
	p := s.publisher()
	c, err := p.channel()
	if err != nil {
		c = nil // every message one by one, each on a new session
	}
	flight := make([]inflight, 0, len(batch))
	// The publishes below wait for nothing from the broker: their writes
	// gather on the connection and go out together when they end. A write
	// that failed closed the connection: the confirmations awaited after
	// fail, and those messages go Send's way.
	func() {
		s.wire.hold()
		defer func() { _ = s.wire.release() }()
		for i, m := range batch {
			if c == nil || dueIn(m.Envelope) > 0 {
				oneByOne = append(oneByOne, i)
				continue
			}
			f := inflight{index: i, c: c}
			if f.exchange, f.key, f.mandatory, err = t.route(m); err != nil {
				errs[i] = err
				continue
			}
			if f.msg, err = t.publishing(m.Envelope); err != nil {
				errs[i] = err
				continue
			}
			if f.dc, err = p.start(ctx, c, f.exchange, f.key, f.mandatory, &f.msg); err != nil {
				if publishAgain(err) {
					c = nil // the channel or the session is gone: the rest one by one
					oneByOne = append(oneByOne, i)
					continue
				}
				errs[i] = t.batchError(ctx, m, f.exchange, f.key, err)
				continue
			}
			flight = append(flight, f)
		}
	}()
	for _, f := range flight {
		err := p.await(ctx, f.c, f.dc, f.exchange, f.key, f.mandatory, &f.msg)
		switch {
		case err == nil:
		case publishAgain(err) && ctx.Err() == nil:
			oneByOne = append(oneByOne, f.index)
		default:
			errs[f.index] = t.batchError(ctx, batch[f.index], f.exchange, f.key, err)
		}
	}
	slices.Sort(oneByOne)
	for _, i := range oneByOne {
		if m := batch[i]; m.Kind == bus.KindPublish {
			errs[i] = t.Publish(ctx, m.Envelope)
		} else {
			errs[i] = t.Send(ctx, m.Envelope, m.Destination)
		}
	}
	return bus.BatchResult(errs)
}

// inflight is a message of a batch published and not yet confirmed.
type inflight struct {
	index         int
	c             *pubChannel
	dc            *amqp.DeferredConfirmation
	exchange, key string
	mandatory     bool
	msg           amqp.Publishing
}

// publishAgain reports an error of publish after which Send publishes
// the message again: its session died, its channel was closed by another
// message, or the broker closed its channel while it was in flight.
func publishAgain(err error) bool {
	var re *RefusedError
	return errors.Is(err, errRetry) || errors.Is(err, errChannelClosed) || errors.As(err, &re)
}

// route returns where m goes, checked as Send and Publish check it.
func (t *Transport) route(m bus.Outbound) (exchange, key string, mandatory bool, err error) {
	env := m.Envelope
	if m.Kind == bus.KindPublish {
		if env.Name == "" || len(env.Name) > maxShortString {
			return "", "", false, fmt.Errorf("rabbitmq: publish: message name %.40q must be 1 to %d bytes", env.Name, maxShortString)
		}
		return t.o.exchange, env.Name, !t.o.unroutablePublish, nil
	}
	if m.Destination == "" {
		return "", "", false, fmt.Errorf("rabbitmq: send %s: %w: no destination endpoint", env.Name, bus.ErrNoRoute)
	}
	if len(m.Destination) > maxShortString {
		return "", "", false, fmt.Errorf("rabbitmq: send %s: destination %.40q is longer than %d bytes", env.Name, m.Destination, maxShortString)
	}
	return "", m.Destination, true, nil
}

// batchError is the error of message m of a batch, as Send or Publish
// would return it.
func (t *Transport) batchError(ctx context.Context, m bus.Outbound, exchange, key string, err error) error {
	if !errors.Is(err, ErrUnroutable) && !errors.Is(err, ErrNacked) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, bus.ErrClosed) {
		err = fmt.Errorf("rabbitmq: %s: %w", describe(exchange, key, m.Envelope.Name), err)
	}
	if m.Kind == bus.KindSend {
		return t.sent(ctx, m.Envelope, m.Destination, err)
	}
	return err
}

var _ bus.Batcher = (*Transport)(nil)

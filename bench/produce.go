package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// The producer suite measures sending alone: n persistent, mandatory,
// JSON-encoded OrderPlaced messages into a durable queue, each side
// returning once the broker confirmed every one. No consumer competes
// for the two cores: each side's queue is purged before each of its
// rounds, untimed ([Resetter]).

// producerQueue declares a side's queue.
func producerQueue(conn *amqp.Connection, prefix string) (string, error) {
	ch, err := conn.Channel()
	if err != nil {
		return "", err
	}
	defer ch.Close()
	q := prefix + watermill.NewShortUUID()
	_, err = ch.QueueDeclare(q, true, false, false, false, nil)
	return q, err
}

// purge empties queue.
func purge(url, queue string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueuePurge(queue, false)
	return err
}

// rawProducer is amqp091-go by hand: one goroutine on one confirm
// channel, keeping up to window publishes unconfirmed (deferred
// confirmations, waiting for the oldest when window are outstanding);
// or, with burst > 0, publishing burst messages per op and then waiting
// for their confirms.
type rawProducer struct {
	url    string
	window int
	burst  int
	queue  string
	conn   *amqp.Connection
	ch     *amqp.Channel
}

// NewRawProducer returns the raw client's producer side with window
// confirms outstanding.
func NewRawProducer(_ context.Context, url string, window int) (Side, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("bench: connecting to RabbitMQ: %w", err)
	}
	s := &rawProducer{url: url, window: window, conn: conn}
	if s.queue, err = producerQueue(conn, "bench-produce-raw-"); err != nil {
		return nil, errors.Join(err, conn.Close())
	}
	if s.ch, err = conn.Channel(); err == nil {
		err = s.ch.Confirm(false)
	}
	if err != nil {
		return nil, errors.Join(err, s.Close(context.Background()))
	}
	return s, nil
}

// NewRawBurst returns the raw client publishing burst messages per op,
// then waiting for their burst confirms: what a flush of burst sends
// costs the raw client.
func NewRawBurst(ctx context.Context, url string, burst int) (Side, error) {
	s, err := NewRawProducer(ctx, url, burst)
	if err != nil {
		return nil, err
	}
	s.(*rawProducer).burst = burst
	return s, nil
}

func (s *rawProducer) Name() string {
	if s.burst > 0 {
		return fmt.Sprintf("amqp091-go, %d published then awaited", s.burst)
	}
	return fmt.Sprintf("amqp091-go, 1 goroutine, %d outstanding", s.window)
}

func (s *rawProducer) Round(ctx context.Context, n int) error {
	ring := make([]*amqp.DeferredConfirmation, s.window)
	wait := func(dc *amqp.DeferredConfirmation) error {
		if dc == nil {
			return nil
		}
		ok, err := dc.WaitContext(ctx)
		if err == nil && !ok {
			err = errors.New("bench: amqp091-go: publish nacked by the broker")
		}
		return err
	}
	if s.burst > 0 {
		n *= s.burst
	}
	for i := 1; i <= n; i++ {
		slot := i % s.window
		if s.burst > 0 && slot == 0 {
			for _, dc := range ring {
				if err := wait(dc); err != nil {
					return err
				}
			}
			clear(ring)
		}
		if err := wait(ring[slot]); err != nil {
			return err
		}
		body, err := json.Marshal(order(i))
		if err != nil {
			return err
		}
		// The message plugbus puts on the wire: a message id (a UUIDv7,
		// from which plugbus's receiver reads the sent-at) besides the
		// name, content type and body.
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		ring[slot], err = s.ch.PublishWithDeferredConfirmWithContext(ctx, "", s.queue, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Type: OrderPlaced{}.MessageName(), MessageId: id.String(), Body: body,
		})
		if err != nil {
			return err
		}
	}
	for _, dc := range ring {
		if err := wait(dc); err != nil {
			return err
		}
	}
	return nil
}

// Reset implements Resetter: it purges the side's queue.
func (s *rawProducer) Reset(context.Context) error { return purge(s.url, s.queue) }

func (s *rawProducer) Close(context.Context) error {
	return errors.Join(s.conn.Close(), broker{s.url}.cleanup([]string{s.queue}, nil))
}

// plugbusProducer is a send-only plugbus bus over transports/rabbitmq
// sending to the side's queue: with Bus.SendBatch in batches of batch
// messages from one goroutine, or with Bus.Send from callers goroutines.
type plugbusProducer struct {
	name    string
	url     string
	queue   string
	b       *bus.Bus
	batch   int
	callers int
}

// NewPlugbusBatchProducer returns plugbus's producer side sending with
// Bus.SendBatch, batch messages a call, from one goroutine.
func NewPlugbusBatchProducer(ctx context.Context, url string, batch int) (Side, error) {
	return newPlugbusProducer(ctx, url, fmt.Sprintf("plugbus SendBatch of %d, 1 goroutine", batch), batch, 1)
}

// NewPlugbusSendProducer returns plugbus's producer side sending with
// Bus.Send from callers goroutines, each waiting for its confirmation.
func NewPlugbusSendProducer(ctx context.Context, url string, callers int) (Side, error) {
	return newPlugbusProducer(ctx, url, fmt.Sprintf("plugbus Send, %d goroutines", callers), 0, callers)
}

func newPlugbusProducer(ctx context.Context, url, name string, batch, callers int) (Side, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("bench: connecting to RabbitMQ: %w", err)
	}
	queue, err := producerQueue(conn, "bench-produce-plugbus-")
	if err = errors.Join(err, conn.Close()); err != nil {
		return nil, err
	}
	t, err := rabbitmq.New(url, rabbitmq.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	b, err := bus.New(bus.WithTransport(t), bus.WithLogger(quiet))
	if err == nil {
		err = b.Start(ctx)
	}
	s := &plugbusProducer{name: name, url: url, queue: queue, b: b, batch: batch, callers: callers}
	if err != nil {
		return nil, errors.Join(err, t.Close(ctx), broker{url}.cleanup([]string{queue}, nil))
	}
	return s, nil
}

func (s *plugbusProducer) Name() string { return s.name }

func (s *plugbusProducer) Round(ctx context.Context, n int) error {
	if s.batch == 0 {
		return sendAll(ctx, n, s.callers, func(ctx context.Context, i int) error { return s.b.Send(ctx, order(i), bus.To(s.queue)) })
	}
	msgs := make([]bus.Message, 0, s.batch)
	for i := 1; i <= n; i += s.batch {
		msgs = msgs[:0]
		for j := i; j < i+s.batch && j <= n; j++ {
			msgs = append(msgs, order(j))
		}
		if err := s.b.SendBatch(ctx, msgs, bus.To(s.queue)); err != nil {
			return err
		}
	}
	return nil
}

// Reset implements Resetter: it purges the side's queue.
func (s *plugbusProducer) Reset(context.Context) error { return purge(s.url, s.queue) }

func (s *plugbusProducer) Close(ctx context.Context) error {
	return errors.Join(s.b.Stop(ctx), broker{s.url}.cleanup([]string{s.queue}, nil))
}

// plugbusFlush is a plugbus bus over transports/rabbitmq whose handler
// sends 10 messages to the side's queue; a round runs the handler n times
// through Bus.Deliver, each run returning once the bus flushed its 10
// sends and the broker confirmed them. One op is one handler run.
type plugbusFlush struct {
	url   string
	queue string
	t     *rabbitmq.Transport
	b     *bus.Bus
}

// FlushEvents is how many messages the flush side's handler sends.
const FlushEvents = 10

// NewPlugbusFlush returns the flush side.
func NewPlugbusFlush(ctx context.Context, url string) (Side, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("bench: connecting to RabbitMQ: %w", err)
	}
	queue, err := producerQueue(conn, "bench-flush-plugbus-")
	if err = errors.Join(err, conn.Close()); err != nil {
		return nil, err
	}
	t, err := rabbitmq.New(url, rabbitmq.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	s := &plugbusFlush{url: url, queue: queue, t: t}
	s.b, err = bus.New(bus.WithTransport(t), bus.WithLogger(quiet), bus.WithEndpoint(queue), // never started: Deliver runs the handler
		bus.WithHandler(func(ctx context.Context, m OrderPlaced, _ bus.Attributes) error {
			for i := range FlushEvents {
				if err := s.b.Send(ctx, order(m.ID*FlushEvents+i), bus.To(s.queue)); err != nil {
					return err
				}
			}
			return nil
		}))
	if err == nil {
		err = t.Connect(ctx)
	}
	if err != nil {
		return nil, errors.Join(err, t.Close(ctx), broker{url}.cleanup([]string{queue}, nil))
	}
	return s, nil
}

func (s *plugbusFlush) Name() string {
	return fmt.Sprintf("plugbus handler sending %d, flushed", FlushEvents)
}

func (s *plugbusFlush) Round(ctx context.Context, n int) error {
	for i := 1; i <= n; i++ {
		body, err := json.Marshal(order(i))
		if err != nil {
			return err
		}
		d := &bus.Delivery{Envelope: bus.Envelope{Name: OrderPlaced{}.MessageName(), ContentType: "application/json", Body: body,
			Attributes: bus.NewAttributes(watermill.NewUUID(), "c", time.Now().UTC(), nil, nil)}}
		if err := s.b.Deliver(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// Reset implements Resetter: it purges the side's queue.
func (s *plugbusFlush) Reset(context.Context) error { return purge(s.url, s.queue) }

func (s *plugbusFlush) Close(ctx context.Context) error {
	return errors.Join(s.t.Close(ctx), broker{s.url}.cleanup([]string{s.queue}, nil))
}

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/transports/rabbitmq"
)

// AMQPConfig is the RabbitMQ workload, the same on every side: Senders
// goroutines each send one persistent, mandatory message at a time and
// wait for its publisher confirmation; Concurrency handlers consume with
// Prefetch unacknowledged messages in all.
type AMQPConfig struct {
	URL         string
	Senders     int
	Concurrency int
	Prefetch    int
	// PublisherChannels is how many confirm channels plugbus and the raw
	// client share among the senders (publishes are pipelined on each).
	// Watermill's publisher holds a pooled channel for the whole round
	// trip of one publish, so [NewWatermillAMQP] takes its pool size apart.
	PublisherChannels int
}

// DefaultAMQPConfig is the configuration of the published table.
func DefaultAMQPConfig(url string) AMQPConfig {
	return AMQPConfig{URL: url, Senders: 16, Concurrency: 8, Prefetch: 16, PublisherChannels: 2}
}

// broker deletes what a side declared.
type broker struct{ url string }

func (b broker) cleanup(queues, exchanges []string) error {
	conn, err := amqp.Dial(b.url)
	if err != nil {
		return fmt.Errorf("bench: cleaning up RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("bench: cleaning up RabbitMQ: %w", err)
	}
	defer ch.Close()
	var errs []error
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, fmt.Errorf("bench: deleting queue %s: %w", q, err))
		}
	}
	for _, e := range exchanges {
		if err := ch.ExchangeDelete(e, false, false); err != nil {
			errs = append(errs, fmt.Errorf("bench: deleting exchange %s: %w", e, err))
		}
	}
	return errors.Join(errs...)
}

// plugbusAMQPSide is a plugbus bus over transports/rabbitmq.
type plugbusAMQPSide struct {
	*plugbusSide
	cfg      AMQPConfig
	exchange string
}

// NewPlugbusRabbitMQ starts a plugbus bus over transports/rabbitmq with
// cfg's concurrency, prefetch and confirm channels, handling the messages
// it sends to its own endpoint.
func NewPlugbusRabbitMQ(ctx context.Context, cfg AMQPConfig) (Side, error) {
	exchange := "bench.events." + watermill.NewShortUUID()
	t, err := rabbitmq.New(cfg.URL, rabbitmq.WithExchange(exchange), rabbitmq.WithPrefetch(cfg.Prefetch),
		rabbitmq.WithPublisherChannels(cfg.PublisherChannels), rabbitmq.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	s, err := newPlugbus(ctx, "plugbus", t, 0, cfg.Concurrency)
	if err != nil {
		return nil, errors.Join(err, t.Close(ctx), broker{cfg.URL}.cleanup(nil, []string{exchange}))
	}
	return &plugbusAMQPSide{plugbusSide: s, cfg: cfg, exchange: exchange}, nil
}

func (s *plugbusAMQPSide) Round(ctx context.Context, n int) error {
	s.c.expect(n)
	if err := sendAll(ctx, n, s.cfg.Senders, func(ctx context.Context, i int) error { return s.b.Send(ctx, order(i)) }); err != nil {
		return err
	}
	return s.c.wait(ctx, s.name)
}

func (s *plugbusAMQPSide) Close(ctx context.Context) error {
	e := s.b.Endpoint()
	return errors.Join(s.b.Stop(ctx), broker{s.cfg.URL}.cleanup([]string{e, rabbitmq.DeadLetterQueue(e)}, []string{s.exchange}))
}

// NewWatermillAMQP starts a Watermill router over watermill-amqp with a
// durable queue: persistent, mandatory messages, confirmed publishes on a
// pool of pool channels (each held by one publish until its confirmation
// arrives; 0, watermill-amqp's default, opens and closes a channel for
// every publish), cfg.Concurrency handlers, each its own subscription with
// an equal share of cfg.Prefetch.
func NewWatermillAMQP(ctx context.Context, cfg AMQPConfig, api WatermillAPI, pool int) (Side, error) {
	queue := "bench-watermill-" + watermill.NewShortUUID()
	c := wamqp.NewDurableQueueConfig(cfg.URL)
	c.Publish.ConfirmDelivery = true
	c.Publish.Mandatory = true
	c.Publish.ChannelPoolSize = pool
	c.Consume.Qos.PrefetchCount = max(cfg.Prefetch/cfg.Concurrency, 1)
	conn, err := wamqp.NewConnection(c.Connection, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("watermill-amqp %s pool=%d", api, pool)
	if pool == 0 {
		name += " (default)"
	}
	s := &watermillSide{name: name, senders: cfg.Senders}
	s.closers = append(s.closers, func() error { return broker{cfg.URL}.cleanup([]string{queue}, nil) }, conn.Close)
	pub, err := wamqp.NewPublisherWithConnection(c, watermill.NopLogger{}, conn)
	if err != nil {
		return nil, errors.Join(err, s.Close(ctx))
	}
	sub, err := wamqp.NewSubscriberWithConnection(c, watermill.NopLogger{}, conn)
	if err != nil {
		return nil, errors.Join(err, pub.Close(), s.Close(ctx))
	}
	// Closed in reverse: subscriber and publisher first, then the queue.
	s.closers = append([]func() error{sub.Close, pub.Close}, s.closers...)
	if err := sub.SubscribeInitialize(queue); err != nil {
		return nil, errors.Join(err, s.Close(ctx))
	}
	if err := s.build(ctx, api, 0, queue, pub, sub, cfg.Concurrency); err != nil {
		return nil, errors.Join(err, s.Close(ctx))
	}
	return s, nil
}

// rawSide is the amqp091-go client doing the workload by hand.
type rawSide struct {
	cfg   AMQPConfig
	queue string
	conn  *amqp.Connection
	pubs  []*amqp.Channel
	rr    atomic.Uint32
	c     *counter
	fail  chan error
}

// NewRawAMQP declares a durable queue and consumes it with the amqp091-go
// client alone: one channel with cfg.Prefetch and cfg.Concurrency
// goroutines that decode and acknowledge, and cfg.PublisherChannels confirm
// channels shared by the senders.
func NewRawAMQP(ctx context.Context, cfg AMQPConfig) (Side, error) {
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("bench: connecting to RabbitMQ: %w", err)
	}
	s := &rawSide{cfg: cfg, queue: "bench-raw-" + watermill.NewShortUUID(), conn: conn, c: newCounter(), fail: make(chan error, 1)}
	if err := s.open(); err != nil {
		return nil, errors.Join(err, s.Close(ctx))
	}
	return s, nil
}

func (s *rawSide) open() error {
	ch, err := s.conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(s.queue, true, false, false, false, nil); err != nil {
		return err
	}
	for range s.cfg.PublisherChannels {
		p, err := s.conn.Channel()
		if err != nil {
			return err
		}
		if err := p.Confirm(false); err != nil {
			return err
		}
		s.pubs = append(s.pubs, p)
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(s.queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for range s.cfg.Concurrency {
		go func() {
			for d := range deliveries {
				var m OrderPlaced
				err := json.Unmarshal(d.Body, &m)
				if err == nil {
					err = s.c.handle(&m)
				}
				if err == nil {
					err = d.Ack(false)
				}
				if err != nil {
					select {
					case s.fail <- err:
					default:
					}
				}
			}
		}()
	}
	return nil
}

func (s *rawSide) Name() string { return "amqp091-go" }

func (s *rawSide) send(ctx context.Context, i int) error {
	body, err := json.Marshal(order(i))
	if err != nil {
		return err
	}
	p := s.pubs[int(s.rr.Add(1))%len(s.pubs)]
	dc, err := p.PublishWithDeferredConfirmWithContext(ctx, "", s.queue, true, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Type: OrderPlaced{}.MessageName(), Body: body,
	})
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("bench: amqp091-go: publish nacked by the broker")
	}
	return nil
}

func (s *rawSide) Round(ctx context.Context, n int) error {
	s.c.expect(n)
	if err := sendAll(ctx, n, s.cfg.Senders, s.send); err != nil {
		return err
	}
	select {
	case err := <-s.fail:
		return fmt.Errorf("bench: amqp091-go consumer: %w", err)
	default:
	}
	return s.c.wait(ctx, s.Name())
}

func (s *rawSide) Close(context.Context) error {
	return errors.Join(s.conn.Close(), broker{s.cfg.URL}.cleanup([]string{s.queue}, nil))
}

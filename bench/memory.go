package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/transports/memory"
)

// NoopMiddleware returns a plugbus middleware that passes through on all
// three stages.
func NoopMiddleware(i int) bus.Middleware {
	return bus.Middleware{
		Name:     "noop-" + strconv.Itoa(i),
		Incoming: func(ctx context.Context, _ *bus.Incoming, next *bus.IncomingNext) error { return next.Call(ctx) },
		Handling: func(ctx context.Context, _ *bus.Handling, next *bus.HandlingNext) error { return next.Call(ctx) },
		Outgoing: func(ctx context.Context, _ *bus.Outgoing, next *bus.OutgoingNext) error { return next.Call(ctx) },
	}
}

func noops(n int) []bus.Plugin {
	ps := make([]bus.Plugin, n)
	for i := range ps {
		ps[i] = NoopMiddleware(i)
	}
	return ps
}

// NoopHandlerMiddleware is a Watermill handler middleware that passes through.
func NoopHandlerMiddleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return h(msg) }
}

// plugbusSide is a bus with one typed handler, sending to itself.
type plugbusSide struct {
	name string
	b    *bus.Bus
	c    *counter
}

// NewPlugbusMemory starts a plugbus bus on the in-memory transport with
// layers no-op middleware (each on all three stages) and concurrency
// workers, handling the messages it sends to its own endpoint.
func NewPlugbusMemory(ctx context.Context, layers, concurrency int) (Side, error) {
	return newPlugbus(ctx, fmt.Sprintf("plugbus c=%d", concurrency), memory.New(), layers, concurrency)
}

func newPlugbus(ctx context.Context, name string, t bus.Transport, layers, concurrency int, opts ...bus.Option) (*plugbusSide, error) {
	s := &plugbusSide{name: name, c: newCounter()}
	opts = append([]bus.Option{
		bus.WithEndpoint("bench-" + watermill.NewShortUUID()), bus.WithTransport(t), bus.WithLogger(quiet),
		bus.WithConcurrency(concurrency), bus.WithMiddleware(noops(layers)...),
		bus.WithHandler(func(_ context.Context, m OrderPlaced, _ bus.Attributes) error { return s.c.handle(&m) }),
	}, opts...)
	b, err := bus.New(opts...)
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		_ = b.Stop(ctx)
		return nil, err
	}
	s.b = b
	return s, nil
}

func (s *plugbusSide) Name() string { return s.name }

func (s *plugbusSide) Round(ctx context.Context, n int) error {
	s.c.expect(n)
	if err := sendAll(ctx, n, 1, func(ctx context.Context, i int) error { return s.b.Send(ctx, order(i)) }); err != nil {
		return err
	}
	return s.c.wait(ctx, s.name)
}

func (s *plugbusSide) Close(ctx context.Context) error { return s.b.Stop(ctx) }

// watermillSide is a Watermill router with one handler over a Pub/Sub.
type watermillSide struct {
	name    string
	c       *counter
	send    func(ctx context.Context, i int) error
	senders int
	router  *message.Router
	closers []func() error
	stopped chan error
}

// WatermillAPI selects how the Watermill side sends and handles.
type WatermillAPI int

const (
	// CQRS sends with a cqrs.CommandBus and handles with a
	// cqrs.CommandProcessor handler (cqrs.NewCommandHandler) and its JSON
	// marshaler: Watermill's typed handler API.
	CQRS WatermillAPI = iota
	// Router publishes a message.Message with a JSON payload and handles it
	// with a router handler that decodes it: the leanest Watermill path.
	Router
)

// String implements fmt.Stringer.
func (a WatermillAPI) String() string {
	if a == CQRS {
		return "cqrs"
	}
	return "router"
}

// marshaler names commands by their plugbus wire name, as plugbus does.
var marshaler = cqrs.JSONMarshaler{GenerateName: func(v any) string {
	switch v := v.(type) {
	case OrderPlaced:
		return v.MessageName()
	case *OrderPlaced:
		return v.MessageName()
	}
	return cqrs.FullyQualifiedStructName(v)
}}

// NewWatermillGoChannel starts a Watermill router over a GoChannel Pub/Sub
// with layers no-op handler middleware and one handler of OrderPlaced.
func NewWatermillGoChannel(ctx context.Context, api WatermillAPI, layers int) (Side, error) {
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	s := &watermillSide{name: "watermill " + api.String(), senders: 1, closers: []func() error{pubsub.Close}}
	if err := s.build(ctx, api, layers, "bench.orders", pubsub, pubsub, 1); err != nil {
		return nil, errors.Join(err, s.Close(ctx))
	}
	return s, nil
}

// build adds handlers (each its own subscription) to a new router and runs it.
func (s *watermillSide) build(ctx context.Context, api WatermillAPI, layers int, topic string, pub message.Publisher, sub message.Subscriber, handlers int) error {
	s.c = newCounter()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	for range layers {
		router.AddMiddleware(NoopHandlerMiddleware)
	}
	switch api {
	case CQRS:
		cb, err := cqrs.NewCommandBusWithConfig(pub, cqrs.CommandBusConfig{
			GeneratePublishTopic: func(cqrs.CommandBusGeneratePublishTopicParams) (string, error) { return topic, nil },
			Marshaler:            marshaler,
		})
		if err != nil {
			return err
		}
		cp, err := cqrs.NewCommandProcessorWithConfig(router, cqrs.CommandProcessorConfig{
			GenerateSubscribeTopic: func(cqrs.CommandProcessorGenerateSubscribeTopicParams) (string, error) { return topic, nil },
			SubscriberConstructor: func(cqrs.CommandProcessorSubscriberConstructorParams) (message.Subscriber, error) {
				return sub, nil
			},
			Marshaler: marshaler,
		})
		if err != nil {
			return err
		}
		for i := range handlers {
			if _, err := cp.AddHandler(cqrs.NewCommandHandler("order-placed-"+strconv.Itoa(i), func(_ context.Context, m *OrderPlaced) error {
				return s.c.handle(m)
			})); err != nil {
				return err
			}
		}
		s.send = func(ctx context.Context, i int) error { return cb.Send(ctx, order(i)) }
	case Router:
		for i := range handlers {
			router.AddConsumerHandler("order-placed-"+strconv.Itoa(i), topic, sub, func(msg *message.Message) error {
				var m OrderPlaced
				if err := json.Unmarshal(msg.Payload, &m); err != nil {
					return err
				}
				return s.c.handle(&m)
			})
		}
		s.send = func(ctx context.Context, i int) error {
			body, err := json.Marshal(order(i))
			if err != nil {
				return err
			}
			msg := message.NewMessage(watermill.NewUUID(), body)
			msg.Metadata.Set("name", OrderPlaced{}.MessageName())
			msg.SetContext(ctx)
			return pub.Publish(topic, msg)
		}
	}
	s.router = router
	s.stopped = make(chan error, 1)
	go func() { s.stopped <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
		return nil
	case err := <-s.stopped:
		s.router = nil
		return fmt.Errorf("bench: the Watermill router stopped at start: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *watermillSide) Name() string { return s.name }

func (s *watermillSide) Round(ctx context.Context, n int) error {
	s.c.expect(n)
	if err := sendAll(ctx, n, s.senders, s.send); err != nil {
		return err
	}
	return s.c.wait(ctx, s.name)
}

func (s *watermillSide) Close(context.Context) error {
	var errs []error
	if s.router != nil {
		errs = append(errs, s.router.Close(), <-s.stopped)
	}
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// session is one connection with its confirm channels and, once Setup ran,
// its consumer channel. When any of them closes the whole session is dead
// and the supervisor replaces it.
type session struct {
	t    *Transport
	conn *amqp.Connection
	pubs []*publisher
	rr   atomic.Uint32

	deadOnce sync.Once
	dead     chan struct{}
	err      error // why the session died; written before dead is closed

	mu             sync.Mutex // serialises setup
	declared       map[string]bool
	cons           *amqp.Channel
	deliveries     <-chan amqp.Delivery // of the endpoint's queue; nil without an endpoint
	instDeliveries <-chan amqp.Delivery // of the instance queue; nil without one
	consuming      chan struct{}        // closed once the consumers run
}

// publisher is one channel in confirm mode. Returned (unroutable) messages
// are matched to their publish by message id, exchange and routing key:
// RabbitMQ sends basic.return before the basic.ack of the same message,
// and amqp091 hands the return to the returns channel before it completes
// the deferred confirmation.
type publisher struct {
	s       *session
	ch      *amqp.Channel
	returns chan amqp.Return

	mu       sync.Mutex
	returned map[returnKey]int
}

type returnKey struct{ id, exchange, key string }

func newSession(t *Transport, conn *amqp.Connection) (*session, error) {
	s := &session{t: t, conn: conn, dead: make(chan struct{}), declared: map[string]bool{}, consuming: make(chan struct{})}
	s.watch(conn.NotifyClose(make(chan *amqp.Error, 1)))
	ch, err := conn.Channel()
	if err != nil {
		return s, fmt.Errorf("rabbitmq: opening a channel: %w", err)
	}
	err = ch.ExchangeDeclare(t.o.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	_ = ch.Close()
	if err != nil {
		return s, fmt.Errorf("rabbitmq: declaring the topic exchange %q: %w (an exchange of that name with another type or durability exists: delete it or choose another name with rabbitmq.WithExchange)", t.o.exchange, err)
	}
	for range t.o.publishers {
		ch, err := conn.Channel()
		if err != nil {
			return s, fmt.Errorf("rabbitmq: opening a publisher channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			return s, fmt.Errorf("rabbitmq: putting a channel in confirm mode: %w", err)
		}
		p := &publisher{s: s, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1024)), returned: map[returnKey]int{}}
		s.watch(ch.NotifyClose(make(chan *amqp.Error, 1)))
		s.pubs = append(s.pubs, p)
	}
	return s, nil
}

// watch marks the session dead when c reports a close. amqp091 closes c
// when the channel or connection shuts down, so the goroutine always ends.
func (s *session) watch(c chan *amqp.Error) {
	go func() {
		e, ok := <-c
		if ok && e != nil {
			s.fail(e)
		} else {
			s.fail(amqp.ErrClosed)
		}
	}()
}

func (s *session) fail(err error) {
	s.deadOnce.Do(func() {
		s.err = err
		close(s.dead)
	})
}

func (s *session) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

func (s *session) cause() error {
	if s.isDead() {
		return s.err
	}
	return nil
}

// close closes the connection (which closes its channels: the broker
// requeues unacknowledged deliveries) and marks the session dead.
func (s *session) close() {
	s.fail(amqp.ErrClosed)
	if !s.conn.IsClosed() {
		_ = s.conn.CloseDeadline(time.Now().Add(5 * time.Second))
	}
}

// setup declares topo's queues and bindings on a channel of its own (a
// failed declaration closes its channel) and starts the consumers once: of
// the endpoint's queue and, with topo.Instance, of the instance queue.
func (s *session) setup(topo *bus.Topology) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	defer ch.Close()
	args := s.t.o.queueArgs
	var queues []string
	if topo.Endpoint != "" {
		queues = []string{topo.Endpoint, DeadLetterQueue(topo.Endpoint)}
	}
	for _, q := range queues {
		if s.declared["q:"+q] {
			continue
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return fmt.Errorf("declaring queue %q: %w (a queue of that name exists with other arguments: delete it or pass the same ones with rabbitmq.WithQueueArguments)", q, err)
		}
		s.declared["q:"+q] = true
	}
	for _, name := range topo.Handles {
		if s.declared["b:"+name] {
			continue
		}
		if err := ch.QueueBind(topo.Endpoint, name, s.t.o.exchange, false, nil); err != nil {
			return fmt.Errorf("binding queue %q to %q on exchange %q: %w", topo.Endpoint, name, s.t.o.exchange, err)
		}
		s.declared["b:"+name] = true
	}
	inst := ""
	if topo.Instance {
		inst = s.t.instanceQueue()
	}
	if inst != "" && !s.declared["q:"+inst] {
		// Exclusive: it lives and dies with this connection, and no other
		// connection may consume from it. Classic and non-durable, whatever
		// the endpoint's queue arguments: exclusive queues cannot be quorum.
		if _, err := ch.QueueDeclare(inst, false, true, true, false, nil); err != nil {
			return fmt.Errorf("declaring the instance queue %q: %w (RESOURCE_LOCKED means the broker has not yet noticed that the previous connection is gone; the transport retries)", inst, err)
		}
		s.declared["q:"+inst] = true
	}
	if s.cons == nil {
		cons, err := s.conn.Channel()
		if err != nil {
			return fmt.Errorf("opening the consumer channel: %w", err)
		}
		prefetch := s.t.o.prefetch
		if prefetch == 0 {
			prefetch = 2 * max(topo.Concurrency, 1)
		}
		if err := cons.Qos(prefetch, 0, false); err != nil {
			return fmt.Errorf("setting prefetch %d: %w", prefetch, err)
		}
		s.watch(cons.NotifyClose(make(chan *amqp.Error, 1)))
		s.cons = cons
	}
	if topo.Endpoint != "" && s.deliveries == nil {
		dl, err := s.cons.Consume(topo.Endpoint, "", false, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("consuming from queue %q: %w", topo.Endpoint, err)
		}
		s.deliveries = dl
	}
	if inst != "" && s.instDeliveries == nil {
		dl, err := s.cons.Consume(inst, instanceConsumer, false, true, false, false, nil)
		if err != nil {
			return fmt.Errorf("consuming from the instance queue %q: %w", inst, err)
		}
		s.instDeliveries = dl
	}
	select {
	case <-s.consuming:
	default:
		close(s.consuming)
	}
	return nil
}

// instanceConsumer is the consumer tag of the instance queue's consumer,
// which tells its deliveries from the endpoint queue's.
const instanceConsumer = "plugbus-instance"

// errRetry reports a publish that failed because its session died: the
// caller publishes it again on the next session.
var errRetry = errors.New("rabbitmq: connection lost while publishing")

func (s *session) publisher() *publisher {
	if len(s.pubs) == 1 {
		return s.pubs[0]
	}
	return s.pubs[int(s.rr.Add(1))%len(s.pubs)]
}

// publish publishes msg and waits for its confirmation. It returns errRetry
// when the session died before the broker confirmed.
func (p *publisher) publish(ctx context.Context, exchange, key string, mandatory bool, msg *amqp.Publishing) error {
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, *msg)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A write that failed because the connection broke (reset, broken
		// pipe, EOF) can be seen before amqp091 marks the channel closed:
		// both mean the session is gone and the message was not stored.
		if p.ch.IsClosed() || connectionBroken(err) {
			p.s.fail(err)
			return errRetry
		}
		return err
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		return fmt.Errorf("waiting for the broker's confirmation: %w (the message may have been stored)", ctx.Err())
	case <-p.s.t.done:
		return fmt.Errorf("waiting for the broker's confirmation: %w (the message may have been stored)", bus.ErrClosed)
	}
	if !dc.Acked() {
		if p.ch.IsClosed() {
			// amqp091 nacks every pending confirmation when the channel closes.
			p.s.fail(amqp.ErrClosed)
			return errRetry
		}
		return ErrNacked
	}
	if mandatory && p.wasReturned(returnKey{msg.MessageId, exchange, key}) {
		return &UnroutableError{Message: msg.Type, Exchange: exchange, RoutingKey: key}
	}
	return nil
}

// wasReturned moves pending returns into the returned set and takes k out
// of it. Every return of a message is in p.returns before its confirmation
// completes.
func (p *publisher) wasReturned(k returnKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for drained := false; !drained; {
		select {
		case r, ok := <-p.returns:
			if !ok {
				drained = true
				break
			}
			p.returned[returnKey{r.MessageId, r.Exchange, r.RoutingKey}]++
		default:
			drained = true
		}
	}
	n := p.returned[k]
	switch {
	case n == 0:
		return false
	case n == 1:
		delete(p.returned, k)
	default:
		p.returned[k] = n - 1
	}
	return true
}

// connectionBroken reports whether err comes from a connection that broke
// under a write, rather than from the message.
func connectionBroken(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, amqp.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

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
// its consumer channel. When the connection or the consumer channel closes
// the whole session is dead and the supervisor replaces it; a publisher
// channel the broker closes is replaced alone (see [publisher]).
type session struct {
	t    *Transport
	conn *amqp.Connection
	wire *coalescingConn // under conn: batches gather their writes in it
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
// the deferred confirmation (see [pubChannel.pump]).
//
// A channel the broker closes with a channel-level (soft) error, for a
// message it refuses, is replaced by a new one: only the publishes in
// flight on it fail, the session lives on.
type publisher struct {
	s *session

	mu sync.Mutex
	ch *pubChannel
}

// pubChannel is one channel of a publisher, its returned messages and how
// it closed.
type pubChannel struct {
	ch     *amqp.Channel
	closes chan *amqp.Error

	mu  sync.Mutex
	err *amqp.Error

	rmu      sync.Mutex
	returned map[returnKey]int // returns the pump read, not yet matched
	asked    uint64            // syncs asked of the pump
	synced   uint64            // the last ask the pump answered
	pumped   bool              // the pump ended: every return is in returned
	answered sync.Cond         // on rmu: synced or pumped changed
	kick     chan struct{}     // an ask waits for the pump
}

// causeWait bounds how long cause waits for the error of a channel that
// amqp091 already marked closed.
const causeWait = 5 * time.Second

// cause returns the error the channel closed with, nil while it is open or
// if it closed without one. amqp091 sends it to closes before it nacks the
// pending confirmations, so a publish that saw its confirmation fail finds
// it here. It marks the channel closed before it sends the error, though:
// a publish refused in between waits for the error (amqp091 sends it, or
// closes closes, once it holds the channel's lock), or it would take a
// refusal that closed only this channel for a lost connection.
func (c *pubChannel) cause() *amqp.Error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || !c.ch.IsClosed() {
		return c.err // amqp091 sends the error only once it marked the channel closed
	}
	t := time.NewTimer(causeWait)
	defer t.Stop()
	select {
	case e, ok := <-c.closes:
		if ok {
			c.err = e
		}
	case <-t.C:
	}
	return c.err
}

type returnKey struct{ id, exchange, key string }

func newSession(t *Transport, conn *amqp.Connection, wire *coalescingConn) (*session, error) {
	s := &session{t: t, conn: conn, wire: wire, dead: make(chan struct{}), declared: map[string]bool{}, consuming: make(chan struct{})}
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
		c, err := openPubChannel(conn)
		if err != nil {
			return s, err
		}
		s.pubs = append(s.pubs, &publisher{s: s, ch: c})
	}
	return s, nil
}

func openPubChannel(conn *amqp.Connection) (*pubChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: opening a publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("rabbitmq: putting a channel in confirm mode: %w", err)
	}
	c := &pubChannel{
		ch:       ch,
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		returned: map[returnKey]int{},
		kick:     make(chan struct{}, 1),
	}
	c.answered.L = &c.rmu
	go c.pump(ch.NotifyReturn(make(chan amqp.Return, 1024)))
	return c, nil
}

// channel returns the publisher's open channel, replacing one the broker
// closed while the connection lives on. It returns errRetry when the
// session is gone.
func (p *publisher) channel() (*pubChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ch.ch.IsClosed() {
		return p.ch, nil
	}
	if p.s.isDead() || p.s.conn.IsClosed() {
		p.s.fail(amqp.ErrClosed)
		return nil, errRetry
	}
	c, err := openPubChannel(p.s.conn)
	if err != nil {
		p.s.fail(err)
		return nil, errRetry
	}
	p.ch = c
	return c, nil
}

// softError reports whether e closed only its channel: the broker refused
// what was sent on it (AMQP soft errors: 311 content too large, 312 no
// route, 313 no consumers, 403 access refused, 404 not found, 405
// resource locked, 406 precondition failed). Any other code closes the
// connection.
func softError(e *amqp.Error) bool {
	if e == nil || !e.Server {
		return false
	}
	switch e.Code {
	case amqp.ContentTooLarge, amqp.NoRoute, amqp.NoConsumers, amqp.AccessRefused, amqp.NotFound, amqp.ResourceLocked, amqp.PreconditionFailed:
		return true
	}
	return false
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

// awaitCause waits, up to causeWait, for the watchers to record why the
// session's connection or consumer channel closed, then marks it dead.
func (s *session) awaitCause() {
	t := time.NewTimer(causeWait)
	defer t.Stop()
	select {
	case <-s.dead:
	case <-t.C:
		s.fail(amqp.ErrClosed)
	}
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
	return s.declaring(func(ch *amqp.Channel) error { return s.declare(ch, topo) })
}

// declaring runs f on a channel of its own (a failed declaration closes
// its channel), one declaration at a time.
func (s *session) declaring(f func(ch *amqp.Channel) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	defer ch.Close()
	return f(ch)
}

// bind binds topo's endpoint queue to the topic exchange for each name it
// handles, skipping those already bound on this session unless again.
func (s *session) bind(ch *amqp.Channel, topo *bus.Topology, again bool) error {
	for _, name := range topo.Handles {
		if s.declared["b:"+name] && !again {
			continue
		}
		if err := ch.QueueBind(topo.Endpoint, name, s.t.o.exchange, false, nil); err != nil {
			return fmt.Errorf("binding queue %q to %q on exchange %q: %w", topo.Endpoint, name, s.t.o.exchange, err)
		}
		s.declared["b:"+name] = true
	}
	return nil
}

// declare is setup's work, on ch with s.mu held.
func (s *session) declare(ch *amqp.Channel, topo *bus.Topology) error {
	type queue struct {
		name, option string
		args         amqp.Table
	}
	var queues []queue
	if topo.Endpoint != "" {
		queues = []queue{
			{topo.Endpoint, "WithQueueArguments", s.t.o.queueArgs},
			{DeadLetterQueue(topo.Endpoint), "WithDeadLetterQueueArguments", s.t.o.deadLetterArgs()},
		}
	}
	for _, q := range queues {
		if s.declared["q:"+q.name] {
			continue
		}
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			return fmt.Errorf("declaring queue %q: %w (a queue of that name exists with other arguments: delete it or pass the same ones with rabbitmq.%s)", q.name, err, q.option)
		}
		s.declared["q:"+q.name] = true
	}
	if err := s.bind(ch, topo, false); err != nil {
		return err
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
	if err := s.bindDelays(ch, topo, inst); err != nil {
		return err
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

// redeclare declares the topic exchange again, and the bindings of topo's
// endpoint to it, which the broker deleted with it: for an exchange
// deleted behind the transport's back (by an operator, say).
func (s *session) redeclare(topo *bus.Topology) error {
	return s.declaring(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(s.t.o.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring the topic exchange %q: %w", s.t.o.exchange, err)
		}
		if topo == nil || topo.Endpoint == "" {
			return nil
		}
		return s.bind(ch, topo, true)
	})
}

// redeclareQueue declares a durable queue again: one deleted behind the
// transport's back (by an operator, say).
func (s *session) redeclareQueue(name string, args amqp.Table) error {
	return s.declaring(func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("declaring queue %q: %w", name, err)
		}
		return nil
	})
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

// errChannelClosed reports a publish that was not sent because its
// channel was closed meanwhile (by a message of another publish): the
// caller publishes it again on the channel's replacement.
var errChannelClosed = errors.New("rabbitmq: publisher channel closed before the publish")

// publish publishes msg and waits for its confirmation. It returns errRetry
// when the session died before the broker confirmed, errChannelClosed when
// the channel was closed before msg was sent, a [*RefusedError] when
// the broker closed the channel while msg was in flight, and a
// [*HeadersTooLargeError], without sending, for a msg whose properties
// and headers do not fit a frame.
func (p *publisher) publish(ctx context.Context, exchange, key string, mandatory bool, msg *amqp.Publishing) error {
	c, err := p.channel()
	if err != nil {
		return err
	}
	dc, err := p.startJoined(ctx, c, exchange, key, mandatory, msg)
	if err != nil {
		return err
	}
	return p.await(ctx, c, dc, exchange, key, mandatory, msg)
}

// startJoined is start with the publish joined to those other goroutines
// make meanwhile: they leave in one write. A write that failed closed the
// connection, which await sees.
func (p *publisher) startJoined(ctx context.Context, c *pubChannel, exchange, key string, mandatory bool, msg *amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	p.s.wire.join()
	defer func() { _ = p.s.wire.leave() }()
	return p.start(ctx, c, exchange, key, mandatory, msg)
}

// start publishes msg on c without waiting for its confirmation, with
// publish's errors for a publish that was not sent.
func (p *publisher) start(ctx context.Context, c *pubChannel, exchange, key string, mandatory bool, msg *amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	// A content header frame over the frame size makes the broker close
	// the connection (FRAME_ERROR), which would be taken for a lost one
	// and the message published again, and again.
	if err := checkFrame(msg, p.s.conn.Config.FrameSize); err != nil {
		return nil, err
	}
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, *msg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// A write that failed because the connection broke (reset, broken
		// pipe, EOF) can be seen before amqp091 marks the channel closed:
		// both mean the session is gone and the message was not stored.
		if c.ch.IsClosed() || connectionBroken(err) {
			if !p.s.conn.IsClosed() && softError(c.cause()) {
				return nil, errChannelClosed
			}
			p.s.fail(err)
			return nil, errRetry
		}
		return nil, err
	}
	return dc, nil
}

// await waits for the confirmation of msg, published on c by start, with
// publish's errors.
func (p *publisher) await(ctx context.Context, c *pubChannel, dc *amqp.DeferredConfirmation, exchange, key string, mandatory bool, msg *amqp.Publishing) error {
	k := returnKey{msg.MessageId, exchange, key}
	select {
	case <-dc.Done():
	case <-ctx.Done():
	case <-p.s.t.done:
	}
	select {
	case <-dc.Done(): // its outcome is known, whatever else ended meanwhile
	default:
		if ctx.Err() != nil {
			c.abandon(dc, mandatory, k)
			return fmt.Errorf("waiting for the broker's confirmation: %w (the message may have been stored)", ctx.Err())
		}
		return fmt.Errorf("waiting for the broker's confirmation: %w (the message may have been stored)", bus.ErrClosed)
	}
	if !dc.Acked() {
		if c.ch.IsClosed() {
			// amqp091 nacks every pending confirmation when the channel
			// closes. A soft error closed this channel alone: the broker
			// refused a message in flight on it, maybe this one.
			if e := c.cause(); softError(e) && !p.s.conn.IsClosed() {
				return &RefusedError{Code: e.Code, Reason: e.Reason}
			}
			p.s.fail(amqp.ErrClosed)
			return errRetry
		}
		return ErrNacked
	}
	if mandatory && c.wasReturned(k) {
		return &UnroutableError{Message: msg.Type, Exchange: exchange, RoutingKey: key}
	}
	return nil
}

// abandon takes the return of a publish whose caller stopped waiting out
// of the returned set once its confirmation completes: left there, it
// would stay forever and mark a later publish of the same message
// unroutable. The confirmation completes when the broker confirms or the
// channel closes.
func (c *pubChannel) abandon(dc *amqp.DeferredConfirmation, mandatory bool, k returnKey) {
	if !mandatory {
		return
	}
	go func() {
		<-dc.Done()
		c.wasReturned(k)
	}()
}

// pump moves the returns amqp091 hands over into c's returned set as they
// come, until amqp091 closes returns with the channel, and answers each
// ask of [pubChannel.wasReturned] once it moved every return handed over
// before the ask. amqp091 reads nothing more from the connection while
// returns is full, and drops the return after 5 s: read only by publishes
// whose confirmation completed, returns filled up behind a batch awaiting
// a slow first confirmation.
func (c *pubChannel) pump(returns <-chan amqp.Return) {
	defer func() {
		c.rmu.Lock()
		c.pumped = true
		c.answered.Broadcast()
		c.rmu.Unlock()
	}()
	record := func(r amqp.Return) {
		c.rmu.Lock()
		c.returned[returnKey{r.MessageId, r.Exchange, r.RoutingKey}]++
		c.rmu.Unlock()
	}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			record(r)
		case <-c.kick:
			c.rmu.Lock()
			asked := c.asked
			c.rmu.Unlock()
			for drained := false; !drained; {
				select {
				case r, ok := <-returns:
					if !ok {
						return
					}
					record(r)
				default:
					drained = true
				}
			}
			c.rmu.Lock()
			c.synced = asked
			c.answered.Broadcast()
			c.rmu.Unlock()
		}
	}
}

// wasReturned takes k out of c's returned set, once the pump moved into it
// every return amqp091 handed over so far. Every return of a message is
// handed over before its confirmation completes.
func (c *pubChannel) wasReturned(k returnKey) bool {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.asked++
	ask := c.asked
	select {
	case c.kick <- struct{}{}:
	default: // a kick is pending: the pump reads asked after taking it
	}
	for !c.pumped && c.synced < ask {
		c.answered.Wait()
	}
	n := c.returned[k]
	switch {
	case n == 0:
		return false
	case n == 1:
		delete(c.returned, k)
	default:
		c.returned[k] = n - 1
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

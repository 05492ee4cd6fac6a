package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// Delays are carried by the broker, without plugins: a cascade of
// delayLevels durable quorum queues, level i holding a message for
// 2^i × delayUnit (x-message-ttl) and dead-lettering it, when that time is
// up, to the exchange of level i-1. A delay of n units is written in
// binary into the routing key, one word per level, most significant first
// ("0.….1.0.1.q.orders" is 5 units for the queue orders): the topic
// exchange of level i sends a message whose bit i is set into its queue
// and one whose bit is clear straight on to the exchange of level i-1
// (exchange-to-exchange binding). Every message therefore waits in at most
// one queue per set bit, each queue holds messages of one TTL only, and
// their order in it is their order of expiry: a long delay never holds
// back a short one (per-message TTL in a single queue would: only its head
// expires). Below level 0 the delivery exchange routes on the rest of the
// key: "q.<queue>" to the queue of that name (a delayed send or return),
// "p.<events exchange>.<message name>" to every endpoint that handles the
// name at that moment (a delayed publish), through bindings each
// endpoint's Setup makes beside those of its queue to the events exchange.
// A message the delivery exchange routes nowhere goes to its alternate
// exchange, into [DelayUndeliverableQueue].
const (
	// delayUnit is the resolution of a delay: delays are rounded up to it.
	delayUnit = 10 * time.Millisecond
	// delayLevels is the number of delay queues: the longest delay is
	// (2^delayLevels - 1) × delayUnit, about 62 days. The longest TTL,
	// 2^(delayLevels-1) × delayUnit, stays under RabbitMQ's limit of
	// 2^32 - 1 ms.
	delayLevels = 29
	// delayClockMargin is added to every delay before rounding: RabbitMQ
	// stamps a message's arrival in a queue in whole milliseconds, so its
	// expiry can come up to one millisecond before the time counted from
	// the real arrival.
	delayClockMargin = time.Millisecond
)

// DelayPrefix starts the name of every exchange and queue of the delay
// infrastructure, shared by every transport on a virtual host: the level
// exchanges and queues DelayPrefix + "00" to DelayPrefix + "28" (an
// exchange and a queue of the same name per level), the delivery exchange
// DelayPrefix + "deliver", and [DelayUndeliverableQueue].
const DelayPrefix = "plugbus.delay."

// DelayUndeliverableQueue is the durable queue (and the fanout exchange of
// the same name, the alternate exchange of the delivery exchange) that
// keeps a delayed message which, when its delay ended, no queue took: a
// delayed send to an endpoint whose queue does not exist, a delayed
// publish no endpoint handles. Its routing key tells where it was going.
const DelayUndeliverableQueue = DelayPrefix + "undeliverable"

const delayDeliverExchange = DelayPrefix + "deliver"

// Words of the routing key after the delay bits.
const (
	delayToQueue   = "q" // then the queue's name
	delayToPublish = "p" // then the events exchange (one word) and the message name
)

// MaxDelay returns the longest delay the transport carries: (2^29 - 1) ×
// 10 ms less 1 ms, about 62 days.
func (t *Transport) MaxDelay() time.Duration { return maxDelay }

// maxDelay is the longest delay whose units, rounded up after adding
// delayClockMargin, fit the bits of the levels.
const maxDelay = (1<<delayLevels-1)*delayUnit - delayClockMargin

// ReturnAfter gives d back for redelivery with its attempt count raised,
// like [Transport.Return], delivered no earlier than delay from now: it
// publishes the copy Return makes into the delay queues, waits for the
// broker's confirmation and then acknowledges d. The copy also leaves out
// the broker's dead-lettering headers (x-death, x-first-death-*,
// x-last-death-*), with which the broker would take its passage through a
// delay queue it already went through for a dead-letter cycle and keep it
// there for good, and the expiration property, which would expire it in a
// delay queue before its time.
//
// The delay is rounded up to the next 10 ms (after adding 1 ms); each delay
// queue the message waits in adds a few milliseconds on a healthy broker.
// The copy carries d.Retries, the retry history the bus updated, in
// [HeaderRetries]. A delay of zero or less is Return; one over
// [Transport.MaxDelay] is cut to it. A queue whose name is too long to fit
// the delay's routing key cannot be delayed: d is returned at once
// ([Transport.Return]), with a warning, so that its attempts still count
// and it ends in the dead-letter queue rather than loop.
func (t *Transport) ReturnAfter(ctx context.Context, d *bus.Delivery, cause error, delay time.Duration) error {
	if delay <= 0 {
		return t.Return(ctx, d, cause)
	}
	delay = min(delay, maxDelay)
	s, m, err := t.settling(d)
	if err != nil {
		return err
	}
	queue := t.topology().Endpoint
	if m.ConsumerTag == instanceConsumer {
		queue = t.instanceQueue()
	}
	r, err := delayedRoute(delay, delayToQueue, escapeWord(queue, false))
	r.queue = queue
	if err != nil {
		t.log.Warn("cannot delay a message; returning it at once", slog.String("queue", queue), slog.String("message_id", d.Attributes.MessageID), slog.Any("error", err))
		return t.Return(ctx, d, cause)
	}
	msg, h := t.republishing(m, 2)
	h[HeaderAttempt] = int32(d.Attempt + 1)
	writeRetries(h, d.Retries)
	forgetDeaths(h)
	msg.Expiration = ""
	if err := checkFrame(&msg, delayedFrameSize(s.conn.Config.FrameSize, r)); err != nil {
		// The copy, or the x-death headers each delay queue adds to it,
		// would not fit a frame: retry it at once, or dead-letter it.
		t.log.Warn("cannot delay a message; returning it at once", slog.String("queue", queue), slog.String("message_id", d.Attributes.MessageID), slog.Any("error", err))
		return t.Return(ctx, d, cause)
	}
	if err := t.resend(ctx, s, d, m, r, &msg, s.redeclareDelays); err != nil {
		return err
	}
	return t.ack(s, d, m)
}

// emitAfter publishes env through the delay queues so that it is
// delivered no earlier than delay from now: to the queue of the endpoint
// destination or, when destination is empty, to every endpoint that
// handles env.Name when the delay ends (the bindings of that moment
// decide, not those of now). It returns once the broker confirmed the
// message into the first delay queue. A delay of zero or less is an
// immediate Send or Publish. A destination that has no queue when the
// delay ends, or a publish no endpoint handles then, lands in
// [DelayUndeliverableQueue].
func (t *Transport) emitAfter(ctx context.Context, env *bus.Envelope, destination string, delay time.Duration) error {
	if delay <= 0 {
		if destination == "" {
			return t.Publish(ctx, env)
		}
		return t.Send(ctx, env, destination)
	}
	op := "delayed publish of " + env.Name
	var r route
	var err error
	if destination == "" {
		if env.Name == "" || len(env.Name) > maxShortString {
			return fmt.Errorf("rabbitmq: %s: message name %.40q must be 1 to %d bytes", op, env.Name, maxShortString)
		}
		r, err = delayedRoute(delay, delayToPublish, escapeWord(t.o.exchange, true), env.Name)
	} else {
		op = "delayed send of " + env.Name + " to " + destination
		r, err = delayedRoute(delay, delayToQueue, escapeWord(destination, false))
	}
	if err != nil {
		return fmt.Errorf("rabbitmq: %s: %w", op, err)
	}
	s, err := t.session(ctx, func() string { return op })
	if err != nil {
		if errors.Is(err, ErrUnreachable) {
			return err
		}
		return fmt.Errorf("rabbitmq: %s: %w", op, err)
	}
	if err := s.ensureDelays(); err != nil {
		return fmt.Errorf("rabbitmq: %s: %w", op, err)
	}
	// Delivered with the x-death headers the delay queues add to it, a
	// message that fits a frame now may not: the consumer's connection
	// would close on it at every delivery.
	if msg, perr := t.publishing(env); perr == nil {
		if err := checkFrame(&msg, delayedFrameSize(s.conn.Config.FrameSize, r)); err != nil {
			return fmt.Errorf("rabbitmq: %s: %w (with room for the x-death headers of the delay queues, %d bytes)", op, err, deathsSize(r))
		}
	}
	err = t.emit(ctx, env, r.exchange, r.key, true)
	if delaysMissing(err) {
		// Deleted behind the transport's back: declare them again.
		if derr := s.redeclareDelays(); derr != nil {
			return fmt.Errorf("rabbitmq: %s: %w (declaring the delay exchanges and queues again failed: %w)", op, err, derr)
		}
		t.log.WarnContext(ctx, "delay exchanges or queues were gone; declared them again", slog.String("message_name", env.Name))
		err = t.emit(ctx, env, r.exchange, r.key, true)
	}
	if errors.Is(err, ErrUnroutable) {
		return fmt.Errorf("rabbitmq: %s: the delay queues %s* did not take it (deleted meanwhile?): %w", op, DelayPrefix, err)
	}
	return err
}

// delaysMissing reports whether err says that a delay exchange or queue is
// gone: a publish into a missing exchange closes its channel with
// NOT_FOUND, one into an exchange whose queue is missing is unroutable.
func delaysMissing(err error) bool {
	var re *RefusedError
	return errors.Is(err, ErrUnroutable) || errors.As(err, &re) && re.Code == amqp.NotFound
}

// delayedRoute returns where a message delayed by delay enters the delay
// queues: the exchange of the level of its highest set bit, and a routing
// key of the delay's bits followed by the words that route it at the end.
func delayedRoute(delay time.Duration, tail ...string) (route, error) {
	r := route{delay: delay}
	if delay > maxDelay {
		return r, fmt.Errorf("a delay of %v is over the %v the delay queues carry (Transport.MaxDelay): schedule it in steps or keep it elsewhere", delay, maxDelay)
	}
	units := uint64((delay + delayClockMargin + delayUnit - 1) / delayUnit)
	var b strings.Builder
	n := 2*delayLevels - 1
	for _, w := range tail {
		n += 1 + len(w)
	}
	if n > maxShortString {
		return r, fmt.Errorf("its delay routing key would be %d bytes, over AMQP's %d, of which the delay bits take %d: use a shorter queue name, or a shorter message and events exchange name",
			n, maxShortString, 2*delayLevels)
	}
	b.Grow(n)
	top := 0
	for level := delayLevels - 1; level >= 0; level-- {
		if units&(1<<level) != 0 {
			b.WriteByte('1')
			top = max(top, level)
		} else {
			b.WriteByte('0')
		}
		if level > 0 {
			b.WriteByte('.')
		}
	}
	for _, w := range tail {
		b.WriteByte('.')
		b.WriteString(w)
	}
	r.exchange, r.key = delayLevel(top), b.String()
	return r, nil
}

// delayLevel returns the name of the exchange and the queue of a level.
func delayLevel(level int) string { return delayLevelNames[level] }

// delayLevelNames are the names of the levels, DelayPrefix and two
// digits, made once: a delay costs no allocation for them.
var delayLevelNames = func() (names [delayLevels]string) {
	for level := range names {
		names[level] = fmt.Sprintf("%s%02d", DelayPrefix, level)
	}
	return names
}()

// escapeWord makes s one literal part of a routing key or binding pattern:
// '%', '*' and '#' (and '.', with dots, so that s is one word) become %XX.
// A word "*" or "#" in a binding pattern would be a wildcard; escaped, a
// queue name routes to that queue alone.
func escapeWord(s string, dots bool) string {
	escaped := func(c byte) bool { return c == '%' || c == '*' || c == '#' || c == '.' && dots }
	if !strings.ContainsFunc(s, func(r rune) bool { return r < utf8.RuneSelf && escaped(byte(r)) }) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := range len(s) {
		if c := s[i]; escaped(c) {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// forgetDeaths removes the headers in which the broker records a message's
// dead-letterings (x-death, x-first-death-*, x-last-death-*) from h, the
// headers of a copy about to enter the delay queues again. The broker
// reads x-death to detect dead-letter cycles: a message that went through
// a level queue and is dead-lettered into it again, with no rejection in
// between, is dropped by at-most-once dead-lettering and, by the
// at-least-once dead-lettering of the delay queues, kept in the queue it
// leaves for good (logged once by the broker: "Dead-letter queues cycle
// detected").
func forgetDeaths(h amqp.Table) {
	for k := range h {
		if k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") {
			delete(h, k)
		}
	}
}

// deliverPattern is the binding pattern of the delivery exchange for the
// words that follow the delay bits.
func deliverPattern(tail ...string) string {
	return strings.Repeat("*.", delayLevels) + strings.Join(tail, ".")
}

// ensureDelays declares the delay infrastructure once per session.
func (s *session) ensureDelays() error {
	s.mu.Lock()
	declared := s.declared[delaysDeclared]
	s.mu.Unlock()
	if declared {
		return nil
	}
	return s.declaring(s.declareDelays)
}

// redeclareDelays declares the delay infrastructure again: parts of it
// were deleted behind the transport's back.
func (s *session) redeclareDelays() error {
	return s.declaring(func(ch *amqp.Channel) error {
		delete(s.declared, delaysDeclared)
		return s.declareDelays(ch)
	})
}

const delaysDeclared = "delays"

// declareDelays declares the delay infrastructure on ch, with s.mu held,
// unless this session did already. Every declaration is idempotent; they
// are pipelined (no-wait) and checked by a last, synchronous one: a
// failed declaration closes the channel, and that one then fails with
// its error.
func (s *session) declareDelays(ch *amqp.Channel) error {
	if s.declared[delaysDeclared] {
		return nil
	}
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	queue := func(name string, args amqp.Table) error {
		args["x-queue-type"] = "quorum"
		_, err := ch.QueueDeclare(name, true, false, false, true, args)
		return err
	}
	err := errors.Join(
		ch.ExchangeDeclare(DelayUndeliverableQueue, amqp.ExchangeFanout, true, false, false, true, nil),
		queue(DelayUndeliverableQueue, amqp.Table{}),
		ch.QueueBind(DelayUndeliverableQueue, "", DelayUndeliverableQueue, true, nil),
		ch.ExchangeDeclare(delayDeliverExchange, amqp.ExchangeTopic, true, false, false, true, amqp.Table{"alternate-exchange": DelayUndeliverableQueue}),
	)
	for level := 0; level < delayLevels && err == nil; level++ {
		name, next := delayLevel(level), delayDeliverExchange
		if level > 0 {
			next = delayLevel(level - 1)
		}
		bits := strings.Repeat("*.", delayLevels-1-level)
		args := amqp.Table{
			"x-message-ttl":          int64((1 << level) * delayUnit / time.Millisecond),
			"x-dead-letter-exchange": next,
			// The message leaves the queue only once the next one
			// confirmed it; this needs overflow reject-publish.
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		err = errors.Join(
			ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, true, nil),
			queue(name, args),
			ch.QueueBind(name, bits+"1.#", name, true, nil),
			ch.ExchangeBind(next, bits+"0.#", name, true, nil),
		)
	}
	if err == nil {
		// The barrier: answered once every declaration before it was.
		_, err = ch.QueueDeclarePassive(DelayUndeliverableQueue, true, false, false, false, nil)
	}
	if err != nil {
		select {
		case e, ok := <-closes:
			if ok && e != nil {
				err = e
			}
		case <-time.After(causeWait):
		}
		return fmt.Errorf("declaring the delay exchanges and queues (%s*, quorum queues, RabbitMQ 3.10 or later): %w (an exchange or queue of that name exists with other arguments: delete it; or the user lacks the configure permission on these names)", DelayPrefix, err)
	}
	s.declared[delaysDeclared] = true
	return nil
}

// bindDelays declares the delay infrastructure (once per session) and
// binds topo's queues to the delivery exchange, on ch with s.mu held: the
// endpoint queue and the instance queue inst (when not empty) for the
// delayed messages sent to them, and the endpoint queue for the delayed
// publishes of each message name it handles. A name too long to fit a
// delay's routing key gets no binding: a delay to it is refused when
// asked for.
func (s *session) bindDelays(ch *amqp.Channel, topo *bus.Topology, inst string) error {
	if err := s.declareDelays(ch); err != nil {
		return err
	}
	bind := func(queue string, tail ...string) error {
		key := deliverPattern(tail...)
		if len(key) > maxShortString || s.declared["d:"+queue+"\x00"+key] {
			return nil
		}
		if err := ch.QueueBind(queue, key, delayDeliverExchange, false, nil); err != nil {
			return fmt.Errorf("binding queue %q to %q on exchange %q: %w", queue, key, delayDeliverExchange, err)
		}
		s.declared["d:"+queue+"\x00"+key] = true
		return nil
	}
	if inst != "" {
		if err := bind(inst, delayToQueue, escapeWord(inst, false)); err != nil {
			return err
		}
	}
	if topo.Endpoint == "" {
		return nil
	}
	if err := bind(topo.Endpoint, delayToQueue, escapeWord(topo.Endpoint, false)); err != nil {
		return err
	}
	exchange := escapeWord(s.t.o.exchange, true)
	for _, name := range topo.Handles {
		if err := bind(topo.Endpoint, delayToPublish, exchange, name); err != nil {
			return err
		}
	}
	return nil
}

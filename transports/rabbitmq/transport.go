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

// Send publishes env to the queue of the endpoint named to through
// the default exchange and returns once the broker confirmed it. An
// env.Due ahead (bus.Delay, bus.At) sends it through the delay queues
// instead, which carry the delayed retries too: it reaches the queue no
// earlier than Due (see [Transport.MaxDelay]; a missing queue then sends
// it to [DelayUndeliverableQueue]). A missing
// queue is an [*UnroutableError], except for an instance queue
// ([Transport.InstanceAddress]): that message is dropped with a warning.
// The first Send of a transport connects. While there is no connection,
// Send waits for one until ctx ends (then it returns an
// [*UnreachableError]) and publishes again.
func (t *Transport) Send(ctx context.Context, env *bus.Envelope, to string) error {
	if to == "" {
		return fmt.Errorf("rabbitmq: send %s: %w: no destination endpoint", env.Name, bus.ErrNoRoute)
	}
	if len(to) > maxShortString {
		return fmt.Errorf("rabbitmq: send %s: destination %.40q is longer than %d bytes", env.Name, to, maxShortString)
	}
	if delay := dueIn(env); delay > 0 {
		return t.emitAfter(ctx, env, to, delay)
	}
	return t.sent(ctx, env, to, t.emit(ctx, env, "", to, true))
}

// sent is the result of a Send to to that ended with err: a send to a
// missing instance queue is dropped with a warning.
func (t *Transport) sent(ctx context.Context, env *bus.Envelope, to string, err error) error {
	if err != nil && strings.HasPrefix(to, InstanceQueuePrefix) && errors.Is(err, ErrUnroutable) {
		// An instance queue is gone for good (its instance stopped) or
		// until its instance reconnects: no one can receive this message.
		t.log.WarnContext(ctx, "message to an instance queue that does not exist dropped: its instance stopped or is reconnecting",
			slog.String("queue", to), slog.String("message_name", env.Name), slog.String("message_id", env.Attributes.MessageID))
		return nil
	}
	return err
}

// CopiesEnvelopes implements [bus.EnvelopeCopier]: Send and Publish keep
// nothing of env once the broker confirmed it.
func (t *Transport) CopiesEnvelopes() bool { return true }

// Publish publishes env to the topic exchange with its name as routing key:
// every endpoint that handles the name gets a copy. It returns once the
// broker confirmed it; when no endpoint subscribes it is an
// [*UnroutableError] unless [WithUnroutablePublish] was given. It waits
// for a connection as Send does. An env.Due ahead publishes it through the
// delay queues: when it is due, every endpoint that handles the name then
// gets a copy (none: [DelayUndeliverableQueue]).
func (t *Transport) Publish(ctx context.Context, env *bus.Envelope) error {
	if env.Name == "" || len(env.Name) > maxShortString {
		return fmt.Errorf("rabbitmq: publish: message name %.40q must be 1 to %d bytes", env.Name, maxShortString)
	}
	if delay := dueIn(env); delay > 0 {
		return t.emitAfter(ctx, env, "", delay)
	}
	return t.emit(ctx, env, t.o.exchange, env.Name, !t.o.unroutablePublish)
}

func (t *Transport) emit(ctx context.Context, env *bus.Envelope, exchange, key string, mandatory bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msg, err := t.publishing(env)
	if err != nil {
		return err
	}
	refused, redeclared := 0, false
	for {
		s, err := t.session(ctx, func() string { return describe(exchange, key, env.Name) })
		if err != nil {
			if errors.Is(err, ErrUnreachable) {
				return err
			}
			return fmt.Errorf("rabbitmq: %s: %w", describe(exchange, key, env.Name), err)
		}
		err = s.publisher().publish(ctx, exchange, key, mandatory, &msg)
		var re *RefusedError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errRetry), errors.Is(err, errChannelClosed):
			continue
		case errors.As(err, &re):
			if re.Code == amqp.NotFound && exchange == t.o.exchange && !redeclared {
				// Our topic exchange is gone (deleted behind our back):
				// declare it again, with this endpoint's bindings, and
				// publish again. Other endpoints' bindings come back only
				// when their transports do the same or reconnect: until
				// then a publish that only they handle is unroutable, and
				// one that this endpoint handles too reaches this
				// endpoint alone (the docs warn of it).
				redeclared = true
				if derr := s.redeclare(t.topology()); derr != nil {
					return fmt.Errorf("rabbitmq: %s: %w (declaring the exchange again failed: %w)", describe(exchange, key, env.Name), re, derr)
				}
				t.log.WarnContext(ctx, "the topic exchange was gone; declared it again with this endpoint's bindings",
					slog.String("exchange", exchange), slog.String("message_name", env.Name))
				continue
			}
			// The channel closed for a message in flight on it, not
			// necessarily this one: one more try on its replacement
			// tells. A message the broker refuses is never retried on
			// and on, and the connection stays up.
			if refused++; refused < 2 {
				continue
			}
			re.Message, re.Exchange, re.RoutingKey = env.Name, exchange, key
			return re
		case errors.Is(err, ErrUnroutable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return err
		}
		return fmt.Errorf("rabbitmq: %s: %w", describe(exchange, key, env.Name), err)
	}
}

// publishing checks env's headers, properties and size and returns the
// message to publish.
func (t *Transport) publishing(env *bus.Envelope) (amqp.Publishing, error) {
	if err := validateHeaders(env.Headers); err != nil {
		return amqp.Publishing{}, err
	}
	// AMQP carries these in short strings. amqp091 refuses a longer one
	// only once it wrote the publish's method frame, and then closes the
	// connection: every publish in flight on it would be published again.
	for _, p := range [...]struct{ name, value string }{
		{"message name", env.Name}, {"message id", env.Attributes.MessageID},
		{"correlation id", env.Attributes.CorrelationID}, {"content type", env.ContentType},
	} {
		if len(p.value) > maxShortString {
			return amqp.Publishing{}, fmt.Errorf("rabbitmq: the %s %.40q of %.40s is %d bytes; AMQP carries it in at most %d", p.name, p.value, env.Name, len(p.value), maxShortString)
		}
	}
	if len(env.Body) > t.o.maxMessageSize {
		return amqp.Publishing{}, &bus.MessageTooLargeError{Transport: "rabbitmq", Message: env.Name, Size: len(env.Body), Limit: t.o.maxMessageSize}
	}
	return publishing(env)
}

func describe(exchange, key, name string) string {
	if exchange == "" {
		return "send of " + name + " to " + key
	}
	return "publish of " + name
}

// Receive returns the next message of the endpoint's queue or of the
// instance queue. While the connection is down it waits for the next one. A message it cannot read
// is returned with Delivery.Err set, for the bus to dead-letter. Raw is a
// *amqp091.Delivery, to be read and not modified, valid until the bus
// releases the delivery (after it is settled).
func (t *Transport) Receive(ctx context.Context) (*bus.Delivery, error) {
	return t.receive(ctx, false)
}

// ReceiveInstance returns the next message of this transport's instance
// queue only (bus.InstanceReceiver): the bus reads it with a loop of its
// own, so that replies never wait for a busy handler worker.
func (t *Transport) ReceiveInstance(ctx context.Context) (*bus.Delivery, error) {
	return t.receive(ctx, true)
}

func (t *Transport) receive(ctx context.Context, instanceOnly bool) (*bus.Delivery, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, err := t.session(ctx, func() string { return "Receive" })
		if err != nil {
			if errors.Is(err, bus.ErrClosed) || ctx.Err() != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, bus.ErrClosed
			}
			return nil, fmt.Errorf("rabbitmq: receive: %w", err)
		}
		select {
		case <-s.consuming:
		default:
			if t.topology() == nil {
				return nil, errors.New("rabbitmq: Receive before Setup: the bus calls Setup at Start")
			}
			select { // Setup is declaring on this session
			case <-s.consuming:
			case <-s.dead:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.done:
				return nil, bus.ErrClosed
			}
		}
		var m amqp.Delivery
		var ok bool
		endpoint := s.deliveries
		if instanceOnly {
			if s.instDeliveries == nil {
				return nil, errors.New("rabbitmq: ReceiveInstance without an instance queue: the bus sets Topology.Instance when a middleware needs one")
			}
			endpoint = nil // never ready
		}
		// A delivery already buffered is taken without a blocking select.
		// Otherwise the wait needs no case for Close: Close ends the
		// session, which closes s.dead (and, with the connection, the
		// delivery channels).
		select {
		case m, ok = <-endpoint:
		default:
			select {
			case m, ok = <-endpoint:
			case m, ok = <-s.instDeliveries:
			case <-s.dead:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if t.isClosed() {
			return nil, bus.ErrClosed // m goes back to the queue with its channel
		}
		if !ok {
			if s.conn.IsClosed() || s.cons.IsClosed() {
				// amqp091 closes the delivery channels when the connection
				// or the channel shuts down, once it handed the cause to
				// the session's watchers: let them record it (a missed
				// heartbeat, a reset), not a cancellation.
				s.awaitCause()
				continue
			}
			s.fail(errors.New("rabbitmq: the broker cancelled the consumer (queue deleted?)"))
			continue
		}
		if s.isDead() {
			continue // its channel is gone: the broker redelivers it
		}
		return t.delivery(ctx, s, &m), nil
	}
}

// received is a delivery and the amqp091 message it was read from, in one
// allocation that the transport reuses once the bus releases the delivery
// ([Transport.ReleaseDelivery]): a message then costs the garbage
// collector neither of them.
type received struct {
	d bus.Delivery
	m amqp.Delivery
	s *session
}

func (t *Transport) delivery(ctx context.Context, s *session, m *amqp.Delivery) *bus.Delivery {
	r, _ := t.released.Get().(*received)
	if r == nil {
		r = new(received)
	}
	r.m, r.s = *m, s
	limits := decodeLimits{maxAttempts: int(t.maxAttempts.Load()), clock: t.clock}
	env, attempt, ignored, err := envelope(&r.m, limits)
	retries, bad := readRetries(&r.m)
	if bad != nil {
		ignored = append(ignored, *bad)
	}
	for _, ig := range ignored {
		t.log.WarnContext(ctx, "received message: reserved header ignored",
			slog.String("header", ig.name), slog.String("value", clip(headerText(ig.value), 200)), slog.String("reason", ig.why),
			slog.Int("max_attempts", limits.maxAttempts), slog.String("message_name", env.Name), slog.String("message_id", env.Attributes.MessageID))
	}
	r.d = bus.Delivery{Envelope: env, Attempt: attempt, Retries: retries, Raw: &r.m, Token: r, Err: err}
	return &r.d
}

// clip shortens s to at most n bytes for a log line.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// ReleaseDelivery implements [bus.DeliveryReleaser]: the bus is done with
// d, and d and its Raw message are reused for a later delivery.
func (t *Transport) ReleaseDelivery(d *bus.Delivery) {
	r, ok := d.Token.(*received)
	if !ok || r.s == nil || r.s.t != t || &r.d != d {
		return
	}
	*r = received{}
	t.released.Put(r)
}

// settling checks that d came from this transport and that its channel is
// still open.
func (t *Transport) settling(d *bus.Delivery) (*session, *amqp.Delivery, error) {
	r, ok := d.Token.(*received)
	if !ok || r.s == nil || r.s.t != t {
		return nil, nil, fmt.Errorf("rabbitmq: delivery of %s (id %s) was not received by this transport", d.Name, d.Attributes.MessageID)
	}
	s, m := r.s, &r.m
	if t.isClosed() {
		return nil, m, fmt.Errorf("rabbitmq: settling %s (id %s): %w; the broker redelivers it", d.Name, d.Attributes.MessageID, bus.ErrClosed)
	}
	if s.isDead() {
		return nil, m, fmt.Errorf("rabbitmq: settling %s (id %s): %w", d.Name, d.Attributes.MessageID, ErrConnectionLost)
	}
	return s, m, nil
}

func (t *Transport) ack(s *session, d *bus.Delivery, m *amqp.Delivery) error {
	if err := s.cons.Ack(m.DeliveryTag, false); err != nil {
		if s.cons.IsClosed() {
			return fmt.Errorf("rabbitmq: acknowledging %s (id %s): %w", d.Name, d.Attributes.MessageID, ErrConnectionLost)
		}
		return fmt.Errorf("rabbitmq: acknowledging %s (id %s): %w", d.Name, d.Attributes.MessageID, err)
	}
	return nil
}

// Delete acknowledges d.
func (t *Transport) Delete(_ context.Context, d *bus.Delivery) error {
	s, m, err := t.settling(d)
	if err != nil {
		return err
	}
	return t.ack(s, d, m)
}

// Return publishes a copy of d to the end of the endpoint's queue with its
// attempt count raised and, once the broker confirmed the copy,
// acknowledges d. The copy keeps the properties and headers of d, except
// a user-id of another user (see [HeaderUserID]), x-delivery-count, and
// CC and BCC (moved to [HeaderOriginalCC] and [HeaderOriginalBCC], so that
// the broker routes the copy nowhere else), and carries d.Retries, the retry history the bus updated, in
// [HeaderRetries]. When the broker refuses the copy, d is requeued (nack)
// and the error returned: the broker redelivers d with its attempt count
// unchanged. A d whose headers leave no room in a frame for those of the
// copy (another producer's) cannot be retried: it is dead-lettered, with
// cause and why.
func (t *Transport) Return(ctx context.Context, d *bus.Delivery, cause error) error {
	s, m, err := t.settling(d)
	if err != nil {
		return err
	}
	msg, h := t.republishing(m, 2)
	h[HeaderAttempt] = int32(d.Attempt + 1)
	writeRetries(h, d.Retries)
	if err := checkFrame(&msg, s.conn.Config.FrameSize); err != nil {
		return t.failTooLarge(ctx, d, cause, err)
	}
	queue := t.topology().Endpoint
	if m.ConsumerTag == instanceConsumer {
		queue = t.instanceQueue()
	}
	if err := t.resend(ctx, s, d, m, route{key: queue, queue: queue}, &msg, nil); err != nil {
		return err
	}
	return t.ack(s, d, m)
}

// Fail publishes a copy of d to the endpoint's dead-letter queue with f in
// headers ([HeaderFailureReason] and the others, f.History in
// [HeaderRetries]) and, once the broker
// confirmed it, acknowledges d. When the broker refuses the copy, d is
// requeued (nack) as by Return. A transport without an endpoint (an
// instance queue alone) has no dead-letter queue: it logs the message and
// its failure at error level and acknowledges it. Headers of d (another
// producer's) that leave no room in a frame for the failure are left out
// of the copy, largest first, and named in its reason.
func (t *Transport) Fail(ctx context.Context, d *bus.Delivery, f bus.Failure) error {
	s, m, err := t.settling(d)
	if err != nil {
		return err
	}
	if t.topology().Endpoint == "" {
		t.log.ErrorContext(ctx, "message of the instance queue failed and there is no endpoint dead-letter queue: dropped",
			slog.String("queue", t.instanceQueue()), slog.String("message_name", d.Name), slog.String("message_id", d.Attributes.MessageID),
			slog.String("reason", f.Reason), slog.Int("attempts", f.Attempts), slog.String("body", string(m.Body)))
		return t.ack(s, d, m)
	}
	endpoint := f.Endpoint
	if endpoint == "" {
		endpoint = t.topology().Endpoint
	}
	if f.Time.IsZero() {
		f.Time = time.Now()
	}
	msg, h := t.republishing(m, 5)
	msg.Expiration = "" // a dead letter waits for a person, not for a publisher's TTL
	history := f.History
	if history.IsZero() {
		history = d.Retries
	}
	writeRetries(h, history)
	h[HeaderFailureReason] = f.Reason
	h[HeaderFailureAttempts] = int32(f.Attempts)
	h[HeaderFailureEndpoint] = endpoint
	h[HeaderFailureTime] = f.Time.UTC().Format(time.RFC3339Nano)
	if left := fitDeadLetter(&msg, s.conn.Config.FrameSize); left != nil {
		t.log.WarnContext(ctx, "dead letter: headers left out, which a frame cannot hold beside the failure",
			slog.Any("headers", left), slog.Int("frame_size", s.conn.Config.FrameSize),
			slog.String("message_name", d.Name), slog.String("message_id", d.Attributes.MessageID))
	}
	dlq := DeadLetterQueue(t.topology().Endpoint)
	missing := func() error { return s.redeclareQueue(dlq, t.o.deadLetterArgs()) }
	if err := t.resend(ctx, s, d, m, route{key: dlq, queue: dlq}, &msg, missing); err != nil {
		return err
	}
	return t.ack(s, d, m)
}

// failTooLarge dead-letters d, which Return or ReturnAfter could not copy
// because the copy's headers do not fit a frame (tooLarge): retried as it
// came, it would fail the same way for ever.
func (t *Transport) failTooLarge(ctx context.Context, d *bus.Delivery, cause, tooLarge error) error {
	reason := fmt.Sprintf("%v; it cannot be retried: %v", cause, tooLarge)
	t.log.WarnContext(ctx, "message dead-lettered instead of retried: its headers leave no room for the retry's",
		slog.String("message_name", d.Name), slog.String("message_id", d.Attributes.MessageID), slog.Int("attempt", d.Attempt), slog.Any("error", tooLarge))
	return t.Fail(ctx, d, bus.Failure{Reason: reason, Attempts: d.Attempt, History: d.Retries})
}

// route is where resend publishes a copy: an exchange ("" is the default
// exchange, which routes on the queue's name) and a routing key, the queue
// the copy ends in, and the delay it waits first (zero for none).
type route struct {
	exchange, key, queue string
	delay                time.Duration
}

func (r route) String() string {
	if r.delay > 0 {
		return fmt.Sprintf("queue %q with a delay of %v", r.queue, r.delay)
	}
	return fmt.Sprintf("queue %q", r.queue)
}

// resend publishes msg along r on d's own session: if that connection is
// gone, the broker redelivers d and a copy would be a duplicate. When the
// copy is unroutable, or refused because an exchange is missing, and
// missing is not nil, a queue or exchange was deleted behind the
// transport's back: missing declares it again, once, and the copy is
// published again.
//
// When the copy is refused (a nack, an unroutable or oversized copy, a
// channel error) d is requeued (see [Transport.requeue]).
func (t *Transport) resend(ctx context.Context, s *session, d *bus.Delivery, m *amqp.Delivery, r route, msg *amqp.Publishing, missing func() error) error {
	publish := func() error {
		err := s.publisher().publish(ctx, r.exchange, r.key, true, msg)
		if errors.Is(err, errChannelClosed) {
			err = s.publisher().publish(ctx, r.exchange, r.key, true, msg)
		}
		return err
	}
	err := publish()
	var re *RefusedError
	if missing != nil && (errors.Is(err, ErrUnroutable) || errors.As(err, &re) && re.Code == amqp.NotFound) {
		if derr := missing(); derr != nil {
			err = fmt.Errorf("%w (declaring it again failed: %w)", err, derr)
		} else {
			if r.delay > 0 {
				t.log.WarnContext(ctx, "delay exchanges or queues were gone; declared them again", slog.String("message_name", d.Name))
			} else {
				t.log.WarnContext(ctx, "the queue was gone; declared it again", slog.String("queue", r.queue), slog.String("message_name", d.Name))
			}
			err = publish()
		}
	}
	if errors.As(err, &re) {
		re.Message, re.Exchange, re.RoutingKey = d.Name, r.exchange, r.key
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errRetry):
		return fmt.Errorf("rabbitmq: moving %s (id %s) to %v: %w", d.Name, d.Attributes.MessageID, r, ErrConnectionLost)
	case errors.Is(err, bus.ErrClosed):
		return fmt.Errorf("rabbitmq: moving %s (id %s) to %v: %w; the broker redelivers it", d.Name, d.Attributes.MessageID, r, err)
	}
	return t.requeue(s, d, m, r, err)
}

// requeue negatively acknowledges d with requeue, because its copy along r
// could not be made (err), so that the broker redelivers it and its
// prefetch slot is freed: a delivery left unacknowledged would hold its
// slot until the connection closes and, with a small prefetch, stall the
// consumer. It returns err with what happened to d.
func (t *Transport) requeue(s *session, d *bus.Delivery, m *amqp.Delivery, r route, err error) error {
	if nerr := s.cons.Nack(m.DeliveryTag, false, true); nerr != nil {
		if s.cons.IsClosed() {
			return fmt.Errorf("rabbitmq: moving %s (id %s) to %v: %w (then %w)", d.Name, d.Attributes.MessageID, r, err, ErrConnectionLost)
		}
		return fmt.Errorf("rabbitmq: moving %s (id %s) to %v: %w; requeueing it failed too: %w", d.Name, d.Attributes.MessageID, r, err, nerr)
	}
	return fmt.Errorf("rabbitmq: moving %s (id %s) to %v: %w; the original was requeued with its attempt count unchanged and the broker redelivers it", d.Name, d.Attributes.MessageID, r, err)
}

// dueIn returns how far env.Due lies ahead: 0 when it is zero or passed.
func dueIn(env *bus.Envelope) time.Duration {
	if env.Due.IsZero() {
		return 0
	}
	return time.Until(env.Due)
}

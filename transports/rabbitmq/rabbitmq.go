package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// DefaultExchange is the topic exchange published messages go through
// unless [WithExchange] names another.
const DefaultExchange = "plugbus.events"

// InstanceQueuePrefix starts the name of every instance queue (see
// [Transport.InstanceAddress]). An endpoint cannot start with it.
const InstanceQueuePrefix = "plugbus.instance."

// DeadLetterQueue returns the name of endpoint's dead-letter queue.
func DeadLetterQueue(endpoint string) string { return endpoint + ".dlq" }

// Option configures a transport. Options are applied once, by [New].
type Option func(*options)

type options struct {
	exchange          string
	logger            *slog.Logger
	prefetch          int
	publishers        int
	backoff           bus.Backoff
	dialTimeout       time.Duration
	config            amqp.Config
	unroutablePublish bool
	queueArgs         amqp.Table
	dlqArgs           amqp.Table
	dlqArgsSet        bool
	maxMessageSize    int
}

// WithExchange names the topic exchange published messages go through. The
// default is [DefaultExchange]. All buses that exchange events must use
// the same name.
func WithExchange(name string) Option { return func(o *options) { o.exchange = name } }

// WithLogger sets the logger for connection events. The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithPrefetch sets how many unacknowledged messages the broker pushes to
// the consumer. The default is twice Topology.Concurrency, which keeps
// every bus worker busy while acknowledgements travel.
func WithPrefetch(n int) Option { return func(o *options) { o.prefetch = n } }

// WithPublisherChannels sets how many confirm channels Send and Publish
// share. Publishes on one channel are pipelined, so one channel already
// serves many concurrent senders; more spread the broker-side work. The
// default is 2.
func WithPublisherChannels(n int) Option { return func(o *options) { o.publishers = n } }

// WithBackoff sets the wait between two connection attempts: after the
// n-th failed attempt in a row, backoff.Delay(n). A zero field keeps its
// default, as in every WithBackoff of plugbus: Initial
// [DefaultBackoffInitial] (100ms), Max [DefaultBackoffMax] (5s).
func WithBackoff(backoff bus.Backoff) Option {
	return func(o *options) {
		o.backoff = bus.Backoff{Initial: cmp.Or(backoff.Initial, DefaultBackoffInitial), Max: cmp.Or(backoff.Max, DefaultBackoffMax)}
	}
}

// The defaults of [WithBackoff].
const (
	DefaultBackoffInitial = 100 * time.Millisecond
	DefaultBackoffMax     = 5 * time.Second
)

// WithConfig sets the amqp091 connection configuration (TLS, heartbeat,
// client properties, SASL). Its Dial function is replaced by the
// transport's own, so that Close interrupts a connection attempt, and its
// Recovery is turned off: the transport reconnects and declares its
// topology itself, and amqp091's recovery reopening channels underneath it
// would hide lost deliveries and confirmations.
func WithConfig(c amqp.Config) Option {
	return func(o *options) {
		c.Recovery = nil
		o.config = c
	}
}

// DefaultMaxMessageSize is the largest body Send and Publish accept unless
// [WithMaxMessageSize] says otherwise: RabbitMQ's default max_message_size
// since 4.0.
const DefaultMaxMessageSize = 16 << 20

// WithMaxMessageSize sets the largest body, in bytes, Send and Publish
// accept; a larger one is a [*bus.MessageTooLargeError] and is not sent. The
// default is [DefaultMaxMessageSize]. Set it to the broker's
// max_message_size: a body over that limit makes the broker close the
// publisher channel, which the transport reports as a [*RefusedError].
func WithMaxMessageSize(n int) Option { return func(o *options) { o.maxMessageSize = n } }

// WithUnroutablePublish lets Publish succeed when no endpoint subscribes to
// the message, which the broker then drops. By default such a publish
// returns an [*UnroutableError]. Sends are always mandatory.
func WithUnroutablePublish() Option { return func(o *options) { o.unroutablePublish = true } }

// WithQueueArguments sets the arguments of the endpoint queue, for example
// {"x-queue-type": "quorum"}. The dead-letter queue takes only its
// x-queue-type: a TTL or a length limit meant for the work queue would
// drop dead letters (see [WithDeadLetterQueueArguments]). They must match
// the arguments of an existing queue: RabbitMQ refuses to declare a queue
// again with different ones.
func WithQueueArguments(args amqp.Table) Option { return func(o *options) { o.queueArgs = args } }

// WithDeadLetterQueueArguments sets the arguments of the endpoint's
// dead-letter queue instead of the x-queue-type of [WithQueueArguments].
// An expiry or a length limit here drops dead letters: the broker does it
// silently.
func WithDeadLetterQueueArguments(args amqp.Table) Option {
	return func(o *options) { o.dlqArgs, o.dlqArgsSet = args, true }
}

// deadLetterArgs returns the arguments of the dead-letter queue.
func (o *options) deadLetterArgs() amqp.Table {
	if o.dlqArgsSet {
		return o.dlqArgs
	}
	if typ, ok := o.queueArgs["x-queue-type"]; ok {
		return amqp.Table{"x-queue-type": typ}
	}
	return nil
}

// Transport is the RabbitMQ [bus.Transport]. It is safe for concurrent use.
// Build it with [New]; it connects on first use.
type Transport struct {
	url  string
	addr string // url with its password replaced, for logs and errors
	user string // the broker user of the connection: user-id it may publish
	o    options
	log  *slog.Logger

	live        atomic.Pointer[session] // sess, read without the lock
	maxAttempts atomic.Int64            // Topology.MaxAttempts of the last Setup
	clock       *skewClock              // for the sent times of received messages
	released    sync.Pool               // *received the bus released, for later deliveries

	mu      sync.Mutex
	inst    string // the instance queue's name, fixed by the first Setup asking for it
	topo    *bus.Topology
	sess    *session      // the live session, nil while (re)connecting
	changed chan struct{} // closed and replaced whenever sess changes
	lastErr error         // why the last connection attempt failed
	failed  int           // connection attempts failed in a row
	started bool
	closed  bool
	done    chan struct{} // closed by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New returns a transport for the broker at url
// ("amqp://user:password@host:5672/vhost"). It does not connect: the
// first Setup (bus Start of a bus that receives), Send, Publish or
// [Transport.Connect] does, and waits for the broker as long as its
// context allows.
func New(url string, opts ...Option) (*Transport, error) {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid broker URL: %w", err)
	}
	o := options{exchange: DefaultExchange, publishers: 2, backoff: bus.Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax}, dialTimeout: 10 * time.Second,
		maxMessageSize: DefaultMaxMessageSize}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.exchange == "" || len(o.exchange) > maxShortString:
		return nil, fmt.Errorf("rabbitmq: WithExchange(%.40q): the exchange name must be 1 to %d bytes", o.exchange, maxShortString)
	case o.publishers < 1:
		return nil, fmt.Errorf("rabbitmq: WithPublisherChannels(%d): must be at least 1", o.publishers)
	case o.prefetch < 0:
		return nil, fmt.Errorf("rabbitmq: WithPrefetch(%d): must not be negative", o.prefetch)
	case o.maxMessageSize < 1:
		return nil, fmt.Errorf("rabbitmq: WithMaxMessageSize(%d): must be at least 1", o.maxMessageSize)
	case o.backoff.Validate() != nil:
		return nil, fmt.Errorf("rabbitmq: WithBackoff: %w", o.backoff.Validate())
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	user := uri.Username
	for _, a := range o.config.SASL {
		if p, ok := a.(*amqp.PlainAuth); ok {
			user = p.Username
			break
		}
	}
	redacted := uri
	if redacted.Password != "" {
		redacted.Password = "xxxxx"
	}
	return &Transport{
		url: url, addr: redacted.String(), user: user, o: o, clock: newSkewClock(time.Now),
		log:     o.logger.With(slog.String("transport", "rabbitmq")),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// Exchange returns the name of the topic exchange published messages go through.
func (t *Transport) Exchange() string { return t.o.exchange }

// Endpoint returns the endpoint set up by Setup, empty before.
func (t *Transport) Endpoint() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.topo == nil {
		return ""
	}
	return t.topo.Endpoint
}

func validateTopology(topo bus.Topology) error {
	if topo.Endpoint == "" {
		if topo.Instance {
			return nil
		}
		return errors.New("rabbitmq: Setup: empty endpoint name")
	}
	if len(DeadLetterQueue(topo.Endpoint)) > maxShortString || strings.HasPrefix(topo.Endpoint, "amq.") || strings.HasPrefix(topo.Endpoint, InstanceQueuePrefix) {
		return fmt.Errorf("rabbitmq: Setup: endpoint %.40q cannot name a queue: at most %d bytes, not starting with \"amq.\" or %q", topo.Endpoint, maxShortString-len(".dlq"), InstanceQueuePrefix)
	}
	for _, name := range topo.Handles {
		if name == "" || len(name) > maxShortString {
			return fmt.Errorf("rabbitmq: Setup: message name %.40q cannot be a routing key: 1 to %d bytes", name, maxShortString)
		}
		if slices.Contains(strings.Split(name, "."), "*") || slices.Contains(strings.Split(name, "."), "#") {
			return fmt.Errorf("rabbitmq: Setup: message name %q has a dot-separated word \"*\" or \"#\", a wildcard in a topic binding; rename the message", name)
		}
	}
	return nil
}

// Setup declares the endpoint's queue, its dead-letter queue and the
// bindings of the queue to the exchange for each handled message name, then
// starts consuming with manual acknowledgements. With topo.Instance it also
// declares the transport's instance queue and consumes from it (see
// [Transport.InstanceAddress]); the endpoint may then be empty. It
// connects first, waiting for the broker until ctx ends (each failed
// attempt logged at warn level): then it returns an [*UnreachableError].
// Calling it again with the same endpoint is harmless; a transport serves
// one endpoint.
func (t *Transport) Setup(ctx context.Context, topo bus.Topology) error {
	if err := validateTopology(topo); err != nil {
		return err
	}
	topo.Handles = slices.Clone(topo.Handles)
	t.mu.Lock()
	if t.topo != nil && t.topo.Endpoint != topo.Endpoint {
		prev := t.topo.Endpoint
		t.mu.Unlock()
		return fmt.Errorf("rabbitmq: Setup(%q): this transport already serves endpoint %q; use one transport per endpoint", topo.Endpoint, prev)
	}
	if t.topo != nil {
		topo.Handles = mergeSorted(t.topo.Handles, topo.Handles)
		topo.Instance = topo.Instance || t.topo.Instance
	}
	if topo.Instance && t.inst == "" {
		t.inst = instanceQueueName(topo.Endpoint)
	}
	t.maxAttempts.Store(int64(topo.MaxAttempts))
	t.mu.Unlock()
	// Declare on the live session, then record the topology so that every
	// later session declares it too. A session that replaced the one set
	// up meanwhile may have missed it: set that one up as well.
	var done *session
	for {
		s, err := t.session(ctx, func() string { return fmt.Sprintf("Setup(%q)", topo.Endpoint) })
		if err != nil {
			if errors.Is(err, ErrUnreachable) {
				return err
			}
			return fmt.Errorf("rabbitmq: Setup(%q): %w", topo.Endpoint, err)
		}
		if s == done {
			return nil
		}
		if err := s.setup(&topo); err != nil {
			if s.isDead() && ctx.Err() == nil {
				continue // the connection dropped meanwhile
			}
			return fmt.Errorf("rabbitmq: Setup(%q): %w", topo.Endpoint, err)
		}
		t.mu.Lock()
		t.topo = &topo
		t.mu.Unlock()
		done = s
	}
}

// instanceQueueName returns a new instance queue name: the prefix, the
// endpoint when it fits, and 16 random hex digits.
func instanceQueueName(endpoint string) string {
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	if endpoint == "" || len(InstanceQueuePrefix)+len(endpoint)+1+len(id) > maxShortString {
		return InstanceQueuePrefix + id
	}
	return InstanceQueuePrefix + endpoint + "." + id
}

// InstanceAddress returns the name of the transport's instance queue, made
// by Setup with Topology.Instance; empty before. Send it as the Destination
// of a message for this transport instance alone.
//
// The queue is exclusive to the transport's connection and auto-deleted:
// it disappears when the transport closes or its connection drops, and is
// declared again under the same name when the transport reconnects. A
// message sent to it while it does not exist (its instance stopped, or is
// reconnecting) is dropped: Send logs a warning and returns nil, since no
// one could ever receive it. Instance queues carry replies, which their
// requester stops waiting for after a timeout.
func (t *Transport) InstanceAddress() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inst
}

func (t *Transport) instanceQueue() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inst
}

func mergeSorted(a, b []string) []string {
	m := slices.Concat(a, b)
	slices.Sort(m)
	return slices.Compact(m)
}

func (t *Transport) topology() *bus.Topology {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.topo
}

// Connect connects to the broker, or waits for the connection under way,
// until ctx ends; then it returns an [*UnreachableError]. Setup, Send and
// Publish connect by themselves; bus.Start calls Connect for a send-only
// bus (it implements bus.Connector), so that its Start fails fast too on a
// wrong address or a broker that is down. After Close it returns
// bus.ErrClosed.
func (t *Transport) Connect(ctx context.Context) error {
	_, err := t.session(ctx, func() string { return "Connect" })
	return err
}

// session returns the live session, starting the connection on first use
// and waiting for a reconnection while there is none. When ctx ends first
// it returns an [*UnreachableError] for the operation op names.
func (t *Transport) session(ctx context.Context, op func() string) (*session, error) {
	if s := t.live.Load(); s != nil && !s.isDead() && !t.isClosed() {
		return s, nil
	}
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, bus.ErrClosed
		}
		if !t.started {
			t.started = true
			sctx, cancel := context.WithCancel(context.Background())
			t.cancel = cancel
			t.wg.Go(func() { t.supervise(sctx) })
		}
		s, changed := t.sess, t.changed
		t.mu.Unlock()
		if s != nil && !s.isDead() {
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.mu.Lock()
			defer t.mu.Unlock()
			return nil, &UnreachableError{Op: op(), Address: t.addr, Attempts: t.failed, Last: t.lastErr, Err: ctx.Err()}
		case <-t.done:
			return nil, bus.ErrClosed
		}
	}
}

// setSession records the live session (nil while there is none), why
// there is none and how many connection attempts failed in a row.
func (t *Transport) setSession(s *session, lastErr error, failed int) {
	t.mu.Lock()
	t.sess, t.lastErr, t.failed = s, lastErr, failed
	t.live.Store(s)
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// supervise keeps a session alive until ctx ends: connect, wait for the
// session to die, reconnect with backoff. Each failed attempt is logged at
// warn level with the address and the time of the next.
func (t *Transport) supervise(ctx context.Context) {
	failed := 0
	for {
		s, err := t.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failed++
			t.setSession(nil, err, failed)
			wait := t.o.backoff.Delay(failed)
			t.log.Warn("connecting to RabbitMQ failed; retrying", slog.String("address", t.addr), slog.Int("attempt", failed),
				slog.Any("error", err), slog.Duration("backoff", wait), slog.Time("retry_at", time.Now().Add(wait)))
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			continue
		}
		t.log.Info("connected to RabbitMQ", slog.String("address", t.addr), slog.Int("attempts", failed+1))
		failed = 0
		t.setSession(s, nil, 0)
		select {
		case <-s.dead:
			t.log.Warn("connection to RabbitMQ lost; reconnecting", slog.String("address", t.addr), slog.Any("error", s.cause()))
			t.setSession(nil, s.cause(), 0)
			s.close()
		case <-ctx.Done():
			s.close()
			return
		}
	}
}

func (t *Transport) connect(ctx context.Context) (*session, error) {
	cfg := t.o.config
	var stop func() bool
	var wire *coalescingConn
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: t.o.dialTimeout}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// Bound the TLS and AMQP handshakes; amqp091 clears the deadline
		// once the connection is open. Close interrupts them.
		if err := c.SetDeadline(time.Now().Add(t.o.dialTimeout)); err != nil {
			_ = c.Close()
			return nil, err
		}
		stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
		wire = &coalescingConn{Conn: c}
		return wire, nil
	}
	conn, err := amqp.DialConfig(t.url, cfg)
	if stop != nil {
		stop()
	}
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connecting: %w", err)
	}
	s, err := newSession(t, conn, wire)
	if err != nil {
		s.close()
		return nil, err
	}
	if topo := t.topology(); topo != nil {
		if err := s.setup(topo); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// Close stops receiving and closes the connection. Deliveries not yet
// deleted, returned or failed go back to their queue: the broker
// redelivers them. Receive, Send and Publish return bus.ErrClosed
// afterwards. Close waits for the connection to close, bounded by ctx.
func (t *Transport) Close(ctx context.Context) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	cancel := t.cancel
	t.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	finished := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: close: %w", ctx.Err())
	}
}

func (t *Transport) isClosed() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

var (
	_ bus.Transport            = (*Transport)(nil)
	_ bus.HeaderValidator      = (*Transport)(nil)
	_ bus.InstanceQueuer       = (*Transport)(nil)
	_ bus.InstanceReceiver     = (*Transport)(nil)
	_ bus.DeliveryReleaser     = (*Transport)(nil)
	_ bus.EnvelopeCopier       = (*Transport)(nil)
	_ bus.Connector            = (*Transport)(nil)
	_ bus.Delayer              = (*Transport)(nil)
	_ bus.MessagingSystemNamer = (*Transport)(nil)
)

package plugin

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/plugbus/plugbus/bus"
)

// FailurePolicy decides what happens to a message while its plugin is
// down (crashed, hung, restarting) or does not answer in time.
type FailurePolicy uint8

const (
	// FailClosed, the default, returns an [*UnavailableError]: the bus
	// returns the message for retry and nothing is lost.
	FailClosed FailurePolicy = iota
	// FailOpen skips the plugin: the rest of the chain runs as if it were
	// not there. Each skip is counted ([Stats].Skipped) and logged.
	FailOpen
)

// String implements fmt.Stringer.
func (p FailurePolicy) String() string {
	if p == FailOpen {
		return "fail-open"
	}
	return "fail-closed"
}

// ParseFailurePolicy parses "fail-closed" (or "") and "fail-open".
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "fail-closed", "closed":
		return FailClosed, nil
	case "fail-open", "open":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("plugin: unknown failure policy %q; use \"fail-closed\" or \"fail-open\"", s)
}

// Option configures [Load].
type Option func(*config) error

type config struct {
	sum          []byte
	unpinned     bool
	pluginConfig []byte
	policy       FailurePolicy
	startTimeout time.Duration
	callTimeout  time.Duration
	logger       *slog.Logger
	backoff      bus.Backoff
	restartDelay func(restart int) time.Duration // tests fix the delay; nil: backoff.Delay
	stableUptime time.Duration                   // uptime after which the back-off resets
	streams      int
	hungTimeouts int
	args         []string
	// sessionFrom is the number of invocations in flight, this one
	// included, from which an invocation goes over the process's
	// batching session rather than a Call stream (tests force either).
	sessionFrom int32
}

func defaults() config {
	return config{
		startTimeout: 10 * time.Second,
		callTimeout:  5 * time.Second,
		backoff:      bus.Backoff{Initial: DefaultBackoffInitial, Max: DefaultBackoffMax},
		stableUptime: time.Minute,
		streams:      1,
		hungTimeouts: 3,
		sessionFrom:  2,
	}
}

// WithSHA256 pins the binary: its SHA-256 (hex) is checked before it is
// run, at load and at every restart, and a mismatch is refused with a
// [*ChecksumError].
func WithSHA256(sum string) Option {
	return func(c *config) error {
		b, err := hex.DecodeString(strings.TrimSpace(sum))
		if err != nil || len(b) != 32 {
			return fmt.Errorf("plugin: WithSHA256(%q): want 64 hex digits (`plugbus plugin verify <binary>` prints them)", sum)
		}
		c.sum = b
		return nil
	}
}

// WithoutChecksum runs the binary without checking it. For development
// only: anyone who can replace the file runs code in your service.
func WithoutChecksum() Option { return func(c *config) error { c.unpinned = true; return nil } }

// WithConfig passes configuration (JSON) to the plugin; the plugin reads it
// through sdk.Configurer.
func WithConfig(raw json.RawMessage) Option {
	return func(c *config) error {
		if len(raw) > 0 && !json.Valid(raw) {
			return errors.New("plugin: WithConfig: not valid JSON")
		}
		c.pluginConfig = raw
		return nil
	}
}

// WithFailurePolicy sets what happens while the plugin is down. The
// default is [FailClosed].
func WithFailurePolicy(p FailurePolicy) Option {
	return func(c *config) error { c.policy = p; return nil }
}

// WithStartTimeout bounds how long the plugin process may take to start
// and describe itself. The default is 10s.
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("plugin: WithStartTimeout(%s): must be positive", d)
		}
		c.startTimeout = d
		return nil
	}
}

// WithInvocationTimeout bounds how long the plugin may take to answer one
// stage invocation, not counting the time the host spends in next. The
// host checks the invocations in flight every eighth of d, so one that
// does not answer fails between d and 9/8 d after it began, with a
// [*TimeoutError] under the failure policy; a plugin that stops answering
// health checks, or times out three times in a row, is considered hung
// and restarted. The default is 5s.
func WithInvocationTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("plugin: WithInvocationTimeout(%s): must be positive", d)
		}
		c.callTimeout = d
		return nil
	}
}

// WithLogger sets the logger that plugin logs and lifecycle events go to,
// with a "plugin" attribute. The default is the logger of the bus the
// plugin is instantiated for, and slog.Default() before that.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("plugin: WithLogger: nil logger")
		}
		c.logger = l
		return nil
	}
}

// Defaults of [WithBackoff].
const (
	DefaultBackoffInitial = 100 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
)

// WithBackoff sets the back-off of restarts of a crashed or hung plugin
// process: restart n (counted since the last process that stayed up for a
// minute) waits b.Delay(n), a random delay of at most Initial·2^(n-1),
// capped at Max ([bus.Backoff]). The count grows with each failed restart
// and each process that dies within a minute of starting. A zero field
// keeps its default: Initial [DefaultBackoffInitial] (100ms), Max
// [DefaultBackoffMax] (30s).
func WithBackoff(b bus.Backoff) Option {
	return func(c *config) error {
		b = bus.Backoff{Initial: cmp.Or(b.Initial, DefaultBackoffInitial), Max: cmp.Or(b.Max, DefaultBackoffMax)}
		if err := b.Validate(); err != nil {
			return fmt.Errorf("plugin: WithBackoff: %w", err)
		}
		c.backoff = b
		return nil
	}
}

// delay returns the delay before restart n.
func (c *config) delay(restart int) time.Duration {
	if c.restartDelay != nil {
		return c.restartDelay(restart)
	}
	return c.backoff.Delay(restart)
}

// WithStreams sets how many streams of the pool are opened when the
// process starts (default 1). An invocation made while no other of the
// process is in flight runs on a stream of its own, taken from the pool
// or opened when none is idle, and returned after (invocations made while
// others are in flight go batched over one stream instead); so the pool
// grows to the largest number of lone invocations at once, and n only
// saves the first ones the opening.
func WithStreams(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 64 {
			return fmt.Errorf("plugin: WithStreams(%d): want 1..64", n)
		}
		c.streams = n
		return nil
	}
}

// WithArgs sets the arguments the plugin binary is started with (none by
// default). sdk/sdktest starts a test binary as the plugin with
// "-test.run=^$", so that a test binary that does not serve runs no tests.
func WithArgs(args ...string) Option {
	return func(c *config) error { c.args = append([]string(nil), args...); return nil }
}

package plugin

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
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
	backoffMin   time.Duration
	backoffMax   time.Duration
	stableUptime time.Duration // uptime after which the back-off resets
	streams      int
	hungTimeouts int
}

func defaults() config {
	return config{
		startTimeout: 10 * time.Second,
		callTimeout:  5 * time.Second,
		backoffMin:   100 * time.Millisecond,
		backoffMax:   30 * time.Second,
		stableUptime: time.Minute,
		streams:      1,
		hungTimeouts: 3,
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
// stage invocation, not counting the time the host spends in next. On
// expiry the invocation fails with a [*TimeoutError] under the failure
// policy; a plugin that stops answering health checks, or times out three
// times in a row, is considered hung and restarted. The default is 5s.
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

// WithRestartBackoff sets the delay before the first restart of a crashed
// plugin and its cap; the delay doubles after each failed restart and
// each time a process dies within a minute of starting, and resets once a
// process stayed up for a minute. The default is 100ms to 30s.
func WithRestartBackoff(initial, maximum time.Duration) Option {
	return func(c *config) error {
		if initial <= 0 || maximum < initial {
			return fmt.Errorf("plugin: WithRestartBackoff(%s, %s): want 0 < initial <= maximum", initial, maximum)
		}
		c.backoffMin, c.backoffMax = initial, maximum
		return nil
	}
}

// WithStreams sets how many long-lived gRPC streams invocations are
// multiplexed over. The default, 1, batches best; more may help on
// machines with many cores.
func WithStreams(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 64 {
			return fmt.Errorf("plugin: WithStreams(%d): want 1..64", n)
		}
		c.streams = n
		return nil
	}
}

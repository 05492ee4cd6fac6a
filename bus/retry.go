package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// RetryPolicy says how the bus retries a message whose handling failed
// with an error that is not permanent ([IsPermanent]).
//
// A message is retried in rounds. In each round it is delivered once and
// then, after each failure, up to Immediate more times at once. When a
// round is used up, the message waits for a delay drawn from Backoff
// (the n-th delayed retry waits [Backoff.Delay](n)) and a new round
// begins, up to Delayed rounds. After the last round's last failure it
// goes to the dead-letter queue with its retry history ([RetryHistory]).
// A message is so delivered at most [RetryPolicy.MaxAttempts] times.
//
// The delay is carried by the transport ([Delayer]): durable on RabbitMQ
// and SQS, a timer in memory. On a transport that cannot delay, delayed
// retries happen at once (the bus warns at Start).
type RetryPolicy struct {
	// Immediate is how many times a failed message is delivered again at
	// once, in each round.
	Immediate int
	// Delayed is how many delayed rounds follow the first.
	Delayed int
	// Backoff draws the delay before each delayed round. It is needed
	// when Delayed is above zero.
	Backoff Backoff
}

// DefaultRetryPolicy is the policy of a bus without [WithRetry]: 2
// immediate retries per round and 10 delayed rounds, waiting up to 1 s,
// 2 s, 4 s, … 256 s and then 5 minutes (full jitter), so about 7 minutes
// in all on average and at most 13½: a message outlives a dependency that
// is down for minutes before it is dead-lettered, after at most 33
// deliveries. docs/recoverability.md compares it with NServiceBus's and
// MassTransit's defaults.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{Immediate: 2, Delayed: 10, Backoff: Backoff{Initial: time.Second, Max: 5 * time.Minute}}
}

// MaxAttempts returns how many times the policy delivers a message at
// most: (1+Immediate)·(1+Delayed).
func (p RetryPolicy) MaxAttempts() int { return (1 + p.Immediate) * (1 + p.Delayed) }

// validate says what to change in a policy that cannot work.
func (p RetryPolicy) validate() error {
	switch {
	case p.Immediate < 0 || p.Delayed < 0:
		return fmt.Errorf("Immediate (%d) and Delayed (%d) must be at least 0", p.Immediate, p.Delayed)
	case p.Immediate > 1000 || p.Delayed > 1000:
		return fmt.Errorf("Immediate (%d) and Delayed (%d) must be at most 1000", p.Immediate, p.Delayed)
	case p.Delayed > 0:
		if err := p.Backoff.Validate(); err != nil {
			return fmt.Errorf("delayed rounds need a Backoff: %w", err)
		}
	}
	return nil
}

// WithRetry sets the bus's retry policy, for every message and handler
// without a policy of its own ([WithRetryFor], [HandlerRetry]). The
// default is [DefaultRetryPolicy].
func WithRetry(p RetryPolicy) Option {
	return func(c *config) error {
		if err := p.validate(); err != nil {
			return fmt.Errorf("bus: WithRetry: %w", err)
		}
		c.retry = p
		return nil
	}
}

// WithRetryFor sets the retry policy of the given messages, overriding
// the bus's. A handler's own policy ([HandlerRetry]) overrides it when
// that handler fails.
func WithRetryFor(p RetryPolicy, msgs ...Message) Option {
	return func(c *config) error {
		if err := p.validate(); err != nil {
			return fmt.Errorf("bus: WithRetryFor: %w", err)
		}
		if len(msgs) == 0 {
			return errors.New("bus: WithRetryFor: no messages; pass the messages the policy is for, such as OrderPlaced{}")
		}
		if c.retryFor == nil {
			c.retryFor = make(map[string]RetryPolicy)
		}
		for i, m := range msgs {
			if m == nil {
				return fmt.Errorf("bus: WithRetryFor: message %d is nil; pass a value of the message type, such as OrderPlaced{}", i)
			}
			name, err := messageName(m)
			if err != nil {
				return fmt.Errorf("bus: WithRetryFor: %w", err)
			}
			c.retryFor[name] = p
		}
		return nil
	}
}

// HandlerRetry sets the retry policy used when this handler fails,
// overriding the message's and the bus's. When several handlers of one
// message fail, the first failed handler with a policy of its own decides.
func HandlerRetry(p RetryPolicy) HandlerOption {
	return func(h *handler) {
		h.retry = &p
	}
}

// RetryHistory is what the failures of a message left behind: the bus
// updates it on every failure, the transport carries it with the message
// it returns ([Delivery].Retries) where it can, and the dead letter
// records it ([Failure].History).
type RetryHistory struct {
	// Delayed is how many delayed rounds the message went through.
	Delayed int
	// FirstFailure and LastFailure are when it failed first and last.
	FirstFailure, LastFailure time.Time
	// Errors are the distinct errors it failed with, oldest first: at
	// most [MaxRetryErrors], each cut to [MaxRetryErrorLen] bytes.
	Errors []string
	// roundStart is the attempt that began the current round.
	roundStart int
}

// Bounds of RetryHistory.Errors: it travels with the message.
const (
	MaxRetryErrors   = 5
	MaxRetryErrorLen = 256
)

// Immediate returns how many of a message's attempts up to attempt were
// retried at once, counted from its Delayed rounds.
func (h RetryHistory) Immediate(attempt int) int { return max(0, attempt-1-h.Delayed) }

// IsZero reports whether the message never failed.
func (h RetryHistory) IsZero() bool {
	return h.Delayed == 0 && h.FirstFailure.IsZero() && h.LastFailure.IsZero() && len(h.Errors) == 0 && h.roundStart == 0
}

// retryHistoryText is RetryHistory on the wire: short keys, since it
// travels in a header or attribute of every retried message.
type retryHistoryText struct {
	Delayed    int       `json:"d,omitempty"`
	RoundStart int       `json:"r,omitempty"`
	First      time.Time `json:"f,omitzero"`
	Last       time.Time `json:"l,omitzero"`
	Errors     []string  `json:"e,omitempty"`
}

// MarshalText encodes the history for a transport to carry as text.
func (h RetryHistory) MarshalText() ([]byte, error) {
	return json.Marshal(retryHistoryText{Delayed: h.Delayed, RoundStart: h.roundStart, First: h.FirstFailure, Last: h.LastFailure, Errors: h.Errors})
}

// UnmarshalText decodes what MarshalText wrote. A transport that cannot
// read it ignores it with a warning naming the header: the bus never
// trusts a history to shorten a message's life, and checks what it reads
// against its retry policy.
func (h *RetryHistory) UnmarshalText(b []byte) error {
	var t retryHistoryText
	if err := json.Unmarshal(b, &t); err != nil {
		return fmt.Errorf("bus: retry history: %w", err)
	}
	if t.Delayed < 0 || t.RoundStart < 0 || len(t.Errors) > MaxRetryErrors {
		return fmt.Errorf("bus: retry history out of range: %d delayed rounds, round start %d, %d errors", t.Delayed, t.RoundStart, len(t.Errors))
	}
	for i, e := range t.Errors {
		t.Errors[i] = cutUTF8(e, MaxRetryErrorLen) // written elsewhere, maybe longer
	}
	*h = RetryHistory{Delayed: t.Delayed, roundStart: t.RoundStart, FirstFailure: t.First, LastFailure: t.Last, Errors: t.Errors}
	return nil
}

// failed records a failure with err at now.
func (h *RetryHistory) failed(err error, now time.Time) {
	if h.FirstFailure.IsZero() {
		h.FirstFailure = now
	}
	h.LastFailure = now
	text := cutUTF8(err.Error(), MaxRetryErrorLen)
	errs := slices.Clone(h.Errors) // the delivery's slice may be shared with the transport
	if i := slices.Index(errs, text); i >= 0 {
		errs = slices.Delete(errs, i, i+1) // recurring: now among the newest
	} else if len(errs) == MaxRetryErrors {
		errs = slices.Delete(errs, 0, 1) // keep the newest
	}
	h.Errors = append(errs, text)
}

// cutUTF8 cuts s to at most n bytes without splitting a rune, and
// replaces invalid UTF-8 (an error text may hold any bytes).
func cutUTF8(s string, n int) string {
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// retryStep is what the bus does with a failed message.
type retryStep uint8

const (
	retryNow   retryStep = iota // Return
	retryLater                  // ReturnAfter
	giveUp                      // Fail
)

// next decides the step after a failure of attempt, with h the message's
// history before this failure; round is the delayed round a retryLater
// begins (1 for the first).
func (p RetryPolicy) next(attempt int, h RetryHistory) (step retryStep, round int) {
	if attempt >= p.MaxAttempts() {
		// Whatever the history says (a transport that does not carry it
		// gives none): a message is delivered at most MaxAttempts times.
		return giveUp, 0
	}
	start := max(h.roundStart, 1)
	if attempt-start < p.Immediate {
		return retryNow, 0
	}
	if h.Delayed < p.Delayed {
		return retryLater, h.Delayed + 1
	}
	return giveUp, 0
}

// trusted reports whether h read back from a delivery of attempt can be
// what p left: a history that claims more rounds than p has, or a round
// that began after this attempt, was not written by this bus.
func (p RetryPolicy) trusted(attempt int, h RetryHistory) bool {
	// Delayed rounds come only after full rounds of 1+Immediate attempts.
	return h.Delayed <= p.Delayed && h.roundStart <= attempt &&
		(h.Delayed == 0 || h.roundStart >= 1+h.Delayed*(1+p.Immediate))
}

// policyFor returns the retry policy for a failure err of the message
// named name: the first failed handler's own, else the message's, else
// the bus's.
func (b *Bus) policyFor(name string, err error) RetryPolicy {
	var rejected *HandlerDispatchRejectedError
	if errors.As(err, &rejected) {
		for _, f := range rejected.Failures {
			for _, h := range b.handlers[name] {
				if h.name == f.Handler && h.retry != nil {
					return *h.retry
				}
			}
		}
	}
	if p, ok := b.retryFor[name]; ok {
		return p
	}
	return b.retry
}

// mostAttempts returns the most deliveries any of the bus's policies
// gives a message: what the transport must allow (Topology.MaxAttempts).
func (b *Bus) mostAttempts() int {
	n := b.retry.MaxAttempts()
	for _, p := range b.retryFor {
		n = max(n, p.MaxAttempts())
	}
	for _, hs := range b.handlers {
		for _, h := range hs {
			if h.retry != nil {
				n = max(n, h.retry.MaxAttempts())
			}
		}
	}
	return n
}

// delaysRetries reports whether a policy of the bus has delayed rounds.
func (b *Bus) delaysRetries() bool {
	if b.retry.Delayed > 0 {
		return true
	}
	for _, p := range b.retryFor {
		if p.Delayed > 0 {
			return true
		}
	}
	for _, hs := range b.handlers {
		for _, h := range hs {
			if h.retry != nil && h.retry.Delayed > 0 {
				return true
			}
		}
	}
	return false
}

// settleFailure settles a delivery whose handling failed with err: at
// once to the dead-letter queue when err is permanent, else as its retry
// policy says — returned at once, returned after a delay, or
// dead-lettered with its history once the policy is used up.
func (b *Bus) settleFailure(ctx, settleCtx context.Context, d *Delivery, err error) error {
	permanent := b.permanentCause(ctx, err)
	p := b.policyFor(d.Name, err)
	if !p.trusted(d.Attempt, d.Retries) {
		b.logger.WarnContext(ctx, "retry history out of range for the retry policy; ignoring it", append(describeEnvelope(&d.Envelope),
			slog.String("attribute", "retries"), slog.Int("attempt", d.Attempt), slog.Int("delayed", d.Retries.Delayed))...)
		d.Retries = RetryHistory{}
	}
	if permanent == nil && b.delayer != nil {
		if delay, ok := retryAfter(err); ok {
			// Not a failure: the message could not be tried now. No
			// round used up, nothing in the history, and never the
			// dead-letter queue for it (see RetryAfter).
			delay = min(max(delay, 0), b.delayer.MaxDelay())
			if b.logger.Enabled(ctx, slog.LevelInfo) {
				b.logger.InfoContext(ctx, "message returned to be tried again later", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Duration("delay", delay), slog.Any("error", err))...)
			}
			// This delivery tried nothing: the round starts one delivery
			// later, so that the next failure still has the immediate
			// retries it had. ReturnAfter carries the history, even with
			// no delay (Return may hand the message back as it came).
			// Not past the attempts the transport counts up to: one that
			// caps them (SQS) would deliver it again as this attempt, and
			// the history would no longer be trusted.
			if start := max(d.Retries.roundStart, 1) + 1; start <= b.maxAttempts {
				d.Retries.roundStart = start
			}
			return b.delayer.ReturnAfter(settleCtx, d, err, delay)
		}
	}
	step, round := giveUp, 0
	if permanent == nil {
		step, round = p.next(d.Attempt, d.Retries)
	}
	if permanent == nil && ctx.Err() != nil && (step != giveUp || !b.countsReceives || d.Attempt < b.maxAttempts) {
		// Stop cancelled the handlers: the attempt was interrupted, not
		// failed, so even a last attempt is retried rather than
		// dead-lettered — unless the broker would dead-letter it on its
		// next receive, without the reason (ReceiveCounter).
		b.logger.WarnContext(ctx, "message returned for retry: the bus stopped while it was handled", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Any("error", err))...)
		return b.t.Return(settleCtx, d, err)
	}
	now := time.Now().UTC()
	d.Retries.failed(err, now)
	switch step {
	case retryNow:
		b.logger.WarnContext(ctx, "message returned for retry", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Any("error", err))...)
		return b.t.Return(settleCtx, d, err)
	case retryLater:
		d.Retries.Delayed, d.Retries.roundStart = round, d.Attempt+1
		delay := p.Backoff.Delay(round)
		if b.delayer == nil {
			b.logger.WarnContext(ctx, "message returned for retry (the transport cannot delay it)", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Int("round", round), slog.Any("error", err))...)
			return b.t.Return(settleCtx, d, err)
		}
		delay = min(delay, b.delayer.MaxDelay())
		b.logger.WarnContext(ctx, "message returned for a delayed retry", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Int("round", round), slog.Duration("delay", delay), slog.Any("error", err))...)
		return b.delayer.ReturnAfter(settleCtx, d, err, delay)
	}
	reason := err.Error()
	switch {
	case permanent != nil:
		reason += permanentReason
	case d.Attempt > 1:
		reason = fmt.Sprintf("%s (after %d attempts, %d delayed retries)", reason, d.Attempt, d.Retries.Delayed)
	}
	f := Failure{Reason: reason, Attempts: d.Attempt, Endpoint: b.endpoint, Time: now, History: d.Retries}
	if _, unhandled := permanent.(*NoHandlerError); unhandled {
		// Not a failure of this service: someone sent it a message it
		// does not handle. The dead letter keeps it for whoever looks
		// into that.
		b.logger.WarnContext(ctx, "message dead-lettered: no handler for its name", append(describeEnvelope(&d.Envelope), slog.String("endpoint", b.endpoint), slog.Any("error", err))...)
	} else {
		b.logger.ErrorContext(ctx, "message dead-lettered", append(describeEnvelope(&d.Envelope), slog.Int("attempt", d.Attempt), slog.Int("delayed_retries", d.Retries.Delayed), slog.Bool("permanent", permanent != nil), slog.Any("error", err))...)
	}
	return b.t.Fail(settleCtx, d, f)
}

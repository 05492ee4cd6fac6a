package sqs

import (
	"fmt"
	"log/slog"
	"time"

	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/plugbus/plugbus/bus"
)

// Option configures a [Transport]. [New] refuses an option whose value
// SQS would not accept, or with which the transport cannot work, with an
// [*OptionError]; it never adjusts a value.
type Option func(*options)

type options struct {
	logger         *slog.Logger
	prefix         string
	visibility     time.Duration
	wait           time.Duration
	maxSize        int
	dlqRetention   time.Duration
	sqsOpts        []func(*awssqs.Options)
	snsOpts        []func(*awssns.Options)
	deleteFlushers int
	hop            time.Duration // the longest delay of one message (delay.go); shorter in tests
	instanceHop    time.Duration // the same on an instance queue (delay.go); shorter in tests
	requestTimeout time.Duration // of each attempt of an AWS request (timeout.go)
}

// The limits of SQS that the options meet.
const (
	maxVisibilityTimeout = 12 * time.Hour
	maxWaitTime          = 20 * time.Second
	minMessageSize       = 1024        // SQS: MaximumMessageSize from 1 KiB
	maxMessageSize       = 1024 * 1024 // to 1 MiB
	minRetention         = time.Minute // SQS: MessageRetentionPeriod from 60 s
	maxRetention         = 14 * 24 * time.Hour
	// hashSuffixLen is the "-" and 8 hex digits a name too long or with
	// other characters gets (names.go).
	hashSuffixLen = 9
	// instanceIDLen is the length of the random id of an instance queue.
	instanceIDLen = 16
)

// MaxPrefixLength is the longest prefix [WithPrefix] accepts: the longest
// that every queue name keeps whole, so that a ListQueues by prefix, an
// IAM policy on "prefix*" and the clean-up of a test environment find
// every queue. An instance queue's name ends with "-instance-" and 16
// hex digits; what comes before is shortened to fit and hashed, keeping
// its first 45 characters.
const MaxPrefixLength = maxQueueName - len(instanceMarker) - instanceIDLen - 1 - hashSuffixLen

// WithLogger sets the logger. The default (and nil) is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithPrefix puts prefix in front of every queue and topic name, to keep
// environments (or tests) that share an AWS account apart. The default is
// no prefix. A prefix is at most [MaxPrefixLength] (45) characters among
// A-Z a-z 0-9 - _, those of a queue name.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithVisibilityTimeout sets the visibility timeout of the endpoint's
// queue: how long a received message stays hidden from other consumers.
// While a handler works on a message the transport extends it before it
// ends, so it bounds how long a crashed consumer holds messages, not how
// long a handler may run. Whole seconds, from 1s to 12h (SQS's maximum);
// the default is 30s.
func WithVisibilityTimeout(d time.Duration) Option { return func(o *options) { o.visibility = d } }

// DefaultWaitTime is the default of [WithWaitTime]: a second under
// [bus.StopGrace], the time bus.Stop gives Close, so that the receive
// requests in progress end within it.
const DefaultWaitTime = bus.StopGrace - time.Second

// WithWaitTime sets how long one receive request waits for messages (SQS
// long polling), in whole seconds from 1s to 20s (SQS's maximum); the
// default is [DefaultWaitTime] (4s). Zero, SQS's short polling, is
// refused: the pollers would send receive requests in a loop. Close
// waits for the receive requests in progress to end, so this also bounds
// how long Close takes. Above [bus.StopGrace], bus.Stop cancels them
// instead and reports it: messages SQS handed to a cancelled request stay
// invisible until their visibility timeout, and that receive counts
// toward their attempts.
func WithWaitTime(d time.Duration) Option { return func(o *options) { o.wait = d } }

// WithMaxMessageSize sets the largest message, body and attributes
// together, that Send and Publish accept, from 1 KiB to 1 MiB (what SQS
// queues accept at most). The default is 256 KiB, what SNS accepts; raise
// it up to what your queues accept only for endpoints that receive sent
// messages alone.
func WithMaxMessageSize(n int) Option { return func(o *options) { o.maxSize = n } }

// WithDeadLetterRetention sets how long the dead-letter queue keeps
// messages: whole seconds, from 1 minute to 14 days (SQS's limits). The
// default is 14 days.
func WithDeadLetterRetention(d time.Duration) Option { return func(o *options) { o.dlqRetention = d } }

// WithSQSOptions adds functions that adjust the SQS client's options.
func WithSQSOptions(fns ...func(*awssqs.Options)) Option {
	return func(o *options) { o.sqsOpts = append(o.sqsOpts, fns...) }
}

// WithSNSOptions adds functions that adjust the SNS client's options.
func WithSNSOptions(fns ...func(*awssns.Options)) Option {
	return func(o *options) { o.snsOpts = append(o.snsOpts, fns...) }
}

// defaultOptions returns the options of a transport given none.
func defaultOptions() options {
	return options{
		visibility: 30 * time.Second, wait: DefaultWaitTime,
		maxSize: DefaultMaxMessageSize, dlqRetention: maxRetention,
		deleteFlushers: 2, hop: hopDelay, instanceHop: instanceHopDelay, requestTimeout: DefaultRequestTimeout,
	}
}

// validate returns an [*OptionError] for the first option o holds that
// SQS or the transport cannot take, or nil.
func (o *options) validate() error {
	refuse := func(option string, value any, reason string) error {
		return &OptionError{Option: option, Value: fmt.Sprint(value), Reason: reason}
	}
	if reason := prefixProblem(o.prefix); reason != "" {
		return refuse("WithPrefix", fmt.Sprintf("%.60q", o.prefix), reason)
	}
	if !wholeSecondsWithin(o.visibility, time.Second, maxVisibilityTimeout) {
		return refuse("WithVisibilityTimeout", o.visibility,
			"the visibility timeout must be whole seconds from 1s to 12h0m0s (SQS's maximum); the transport extends it while a handler works, so it need not cover the longest handler")
	}
	if !wholeSecondsWithin(o.wait, time.Second, maxWaitTime) {
		return refuse("WithWaitTime", o.wait,
			"the wait time must be whole seconds from 1s to 20s (SQS's longest long poll; 0, short polling, would send receive requests in a loop)")
	}
	if o.maxSize < minMessageSize || o.maxSize > maxMessageSize {
		return refuse("WithMaxMessageSize", o.maxSize,
			"the size must be from 1024 (1 KiB) to 1048576 (1 MiB), what SQS queues accept; SNS accepts 262144 (256 KiB), the default")
	}
	if !wholeSecondsWithin(o.dlqRetention, minRetention, maxRetention) {
		return refuse("WithDeadLetterRetention", o.dlqRetention,
			"the retention must be whole seconds from 1m0s to 336h0m0s (14 days), SQS's limits")
	}
	if o.requestTimeout <= 0 {
		return refuse("WithRequestTimeout", o.requestTimeout,
			fmt.Sprintf("the timeout must be positive (the default is %v)", DefaultRequestTimeout))
	}
	for i, fn := range o.sqsOpts {
		if fn == nil {
			return refuse("WithSQSOptions", "nil", fmt.Sprintf("function %d of %d is nil; give functions that adjust the SQS client's options", i+1, len(o.sqsOpts)))
		}
	}
	for i, fn := range o.snsOpts {
		if fn == nil {
			return refuse("WithSNSOptions", "nil", fmt.Sprintf("function %d of %d is nil; give functions that adjust the SNS client's options", i+1, len(o.snsOpts)))
		}
	}
	return nil
}

// wholeSecondsWithin reports whether d is a whole number of seconds from
// lo to hi.
func wholeSecondsWithin(d, lo, hi time.Duration) bool {
	return d%time.Second == 0 && d >= lo && d <= hi
}

// prefixProblem says what is wrong with prefix, or returns "".
func prefixProblem(prefix string) string {
	if len(prefix) > MaxPrefixLength {
		return fmt.Sprintf("the prefix is %d bytes long; it must be at most %d (sqs.MaxPrefixLength), so that every queue name begins with it", len(prefix), MaxPrefixLength)
	}
	for i := range len(prefix) {
		if !validNameChar(prefix[i]) {
			return fmt.Sprintf("the prefix has %q at byte %d; it may hold only A-Z a-z 0-9 - _, the characters of a queue name", prefix[i:i+1], i)
		}
	}
	return ""
}

package plugin

import (
	"errors"
	"fmt"
	"time"

	"github.com/plugbus/plugbus/bus"
)

var (
	// ErrChecksum is matched by [*ChecksumError].
	ErrChecksum = errors.New("plugin: checksum mismatch")
	// ErrNotPinned is returned by Load without a checksum: pass
	// [WithSHA256] (`plugbus plugin verify` prints it) or, in development
	// only, [WithoutChecksum].
	ErrNotPinned = errors.New("plugin: no checksum given; pass plugin.WithSHA256(sum) (printed by `plugbus plugin verify <binary>`) or, for development only, plugin.WithoutChecksum()")
	// ErrUnavailable is matched by [*UnavailableError].
	ErrUnavailable = errors.New("plugin: unavailable")
	// ErrTimeout is matched by [*TimeoutError].
	ErrTimeout = errors.New("plugin: invocation timed out")
	// ErrClosed is returned by a plugin used after Close.
	ErrClosed = errors.New("plugin: closed")
	// ErrNotEncodable is the cause of the permanent failure of an
	// invocation whose message cannot cross the wire (protobuf strings
	// must be valid UTF-8: a message name, an id or a header that is
	// not, say). The invocation fails alone, the process is not taken for
	// failed, and the bus dead-letters the message with that reason.
	ErrNotEncodable = errors.New("plugin: the message cannot be encoded for the plugin")
)

// ChecksumError reports a plugin binary whose SHA-256 is not the pinned
// one. The binary was not executed.
type ChecksumError struct {
	Path      string
	Want, Got string // hex
}

// Error implements error.
func (e *ChecksumError) Error() string {
	return fmt.Sprintf("plugin: %s has SHA-256 %s, want %s; the binary was not run. Rebuild or restore the pinned binary, or pin the new one after checking it (plugbus plugin lock <manifest>)", e.Path, e.Got, e.Want)
}

// Is reports whether target is ErrChecksum.
func (e *ChecksumError) Is(target error) bool { return target == ErrChecksum }

// Error is an error returned by a plugin's middleware, carried across the
// process boundary. Unwrap returns the typed cause when one crossed: the
// error next returned (when the plugin wrapped it), a
// [*bus.NextMisuseError], or the bus or context sentinel of its kind.
// When the plugin returns next's error unchanged, the host returns the
// original error itself, not an *Error. A permanent failure of the plugin
// (an error marked with bus.Permanent; in the incoming stage any error
// [bus.IsPermanent] holds for, as in process) comes back as a
// [*bus.PermanentError] wrapping the *Error, so that the message is
// dead-lettered at once and errors.Is(err, bus.ErrPermanent) holds on the
// host.
type Error struct {
	// Plugin is the plugin's name.
	Plugin string
	// Stage is the stage that failed; zero for a Start or Stop hook.
	Stage bus.Stage
	// Message is the plugin's error text.
	Message string
	// Err is the typed cause, or nil.
	Err error
	// Codes are the texts of the sentinel errors the plugin declared
	// (sdk.ErrorDeclarer) that its error matched: errors.Is(err, s) holds
	// for a sentinel s whose text is one of them.
	Codes []string
}

// Error implements error.
func (e *Error) Error() string {
	if e.Stage == 0 { // a Start or Stop hook's
		return fmt.Sprintf("plugin %q: %s", e.Plugin, e.Message)
	}
	return fmt.Sprintf("plugin %q (%s stage): %s", e.Plugin, e.Stage, e.Message)
}

// Unwrap returns the typed cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is one of the plugin's declared sentinels the
// error matched in the plugin, by its text.
func (e *Error) Is(target error) bool {
	if len(e.Codes) == 0 || target == nil {
		return false
	}
	text := target.Error()
	for _, c := range e.Codes {
		if c == text {
			return true
		}
	}
	return false
}

// UnavailableError is returned, under the fail-closed policy, for a
// message a plugin could not process because its process crashed, hung or
// is restarting (and, with Stage zero, when a bus is built or its Start
// or Stop hooks run meanwhile). In the incoming and handler stages the bus returns the
// message for retry (after the retry policy's delay); in the outgoing
// stage the message was not sent, and the caller of Send or Publish must
// retry — unless HandedOn says the plugin failed after its next had sent
// it.
type UnavailableError struct {
	Plugin string
	Stage  bus.Stage
	// Err is why: the stream or process error, or a [*TimeoutError].
	Err error
	// HandedOn reports, in the outgoing stage, that the plugin failed
	// after its next had handed the message on (to the transport, or to
	// the handler's buffer): it was sent, and must not be sent again.
	HandedOn bool
}

// Error implements error.
func (e *UnavailableError) Error() string {
	if e.Stage == 0 { // building a bus, or a Start or Stop hook: no message involved
		return fmt.Sprintf("plugin %q unavailable: %v", e.Plugin, e.Err)
	}
	return fmt.Sprintf("plugin %q unavailable in the %s stage (fail-closed: %s; the plugin is restarted): %v", e.Plugin, e.Stage, failClosedOutcome(e.Stage, e.HandedOn), e.Err)
}

// failClosedOutcome says what became of the message of a stage that failed
// closed, handedOn when its next had handed the message on.
func failClosedOutcome(s bus.Stage, handedOn bool) string {
	switch {
	case s == bus.StageOutgoing && handedOn:
		return "the plugin failed after its next had sent the message (to the transport, or to the handler's buffer); do not send it again"
	case s == bus.StageOutgoing:
		return "the message was not sent; the caller must retry the send"
	}
	return "the message is returned for retry, delayed per the retry policy"
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// TimeoutError reports a plugin that did not answer within the
// per-invocation timeout ([WithInvocationTimeout]).
type TimeoutError struct {
	Plugin  string
	Stage   bus.Stage
	Timeout time.Duration
	// HandedOn: as [UnavailableError.HandedOn].
	HandedOn bool
}

// Error implements error.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("plugin %q did not answer the %s stage within %s (fail-closed: %s); raise plugin.WithInvocationTimeout or fix the plugin", e.Plugin, e.Stage, e.Timeout, failClosedOutcome(e.Stage, e.HandedOn))
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// notEncodable is the permanent failure of an invocation the host could
// not encode.
func (p *Plugin) notEncodable(stage bus.Stage, err error) error {
	return bus.Permanent(&Error{Plugin: p.Name(), Stage: stage, Message: err.Error(), Err: ErrNotEncodable})
}

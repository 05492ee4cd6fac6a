package rabbitmq

import (
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/plugbus/plugbus/bus"
)

// frameOverhead is what a frame adds to its payload: type, channel, size
// and frame-end octets.
const frameOverhead = 8

// HeadersTooLargeError reports a message whose properties and headers do
// not fit one AMQP frame of the connection (RabbitMQ's frame_max, 128 KiB
// by default): AMQP 0-9-1 carries them in a single content header frame,
// and the broker closes the whole connection (FRAME_ERROR) on a larger
// one. The transport refuses such a message before sending it; sending it
// again unchanged fails the same way. It matches [ErrHeadersTooLarge] and
// bus.ErrMessageTooLarge with errors.Is.
type HeadersTooLargeError struct {
	// Message is the message name.
	Message string
	// Size is the content header frame the message needs, in bytes.
	Size int
	// Limit is the connection's frame size, in bytes.
	Limit int
	// Largest is the name of the largest header, and LargestSize its
	// encoded size (name and value) in bytes.
	Largest     string
	LargestSize int
}

// Error implements error.
func (e *HeadersTooLargeError) Error() string {
	largest := ""
	if e.Largest != "" {
		largest = fmt.Sprintf(" (largest header %.60q: %d bytes)", e.Largest, e.LargestSize)
	}
	return fmt.Sprintf("rabbitmq: the properties and headers of %s need a frame of %d bytes, over the connection's frame size of %d bytes%s: AMQP carries them in one frame, and the broker would close the connection; put less in headers (large values belong in the body)",
		e.Message, e.Size, e.Limit, largest)
}

// Is reports whether target is ErrHeadersTooLarge or bus.ErrMessageTooLarge.
func (e *HeadersTooLargeError) Is(target error) bool {
	return target == ErrHeadersTooLarge || target == bus.ErrMessageTooLarge
}

// checkFrame returns a *HeadersTooLargeError when the content header frame
// of msg does not fit a frame of frameMax bytes (0 or less: no limit).
func checkFrame(msg *amqp.Publishing, frameMax int) error {
	if frameMax <= 0 {
		return nil
	}
	size := headerFrameSize(msg)
	if size <= frameMax {
		return nil
	}
	e := &HeadersTooLargeError{Message: msg.Type, Size: size, Limit: frameMax}
	for k, v := range msg.Headers {
		if n := 1 + len(k) + fieldSize(v); n > e.LargestSize || n == e.LargestSize && k < e.Largest {
			e.Largest, e.LargestSize = k, n
		}
	}
	return e
}

// headerFrameSize returns the size of the content header frame amqp091
// writes for msg, frame overhead included.
func headerFrameSize(msg *amqp.Publishing) int {
	short := func(s string) int {
		if s == "" {
			return 0
		}
		return 1 + len(s)
	}
	n := frameOverhead + 2 + 2 + 8 + 2 // class, weight, body size, property flags
	n += short(msg.ContentType) + short(msg.ContentEncoding) + short(msg.CorrelationId) + short(msg.ReplyTo) +
		short(msg.Expiration) + short(msg.MessageId) + short(msg.Type) + short(msg.UserId) + short(msg.AppId)
	if len(msg.Headers) > 0 {
		n += tableSize(msg.Headers)
	}
	if msg.DeliveryMode > 0 {
		n++
	}
	if msg.Priority > 0 {
		n++
	}
	if !msg.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// tableSize is the encoded size of a field table, its length included.
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += 1 + len(k) + fieldSize(v)
	}
	return n
}

// fieldSize is the encoded size of a field value, its type octet
// included, as amqp091 writes it (a type it cannot write counts 0: the
// publish fails on it anyway).
func fieldSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 1
	case bool, byte, int8:
		return 2
	case int16, uint16:
		return 3
	case int, int32, uint32, float32:
		return 5
	case amqp.Decimal:
		return 6
	case int64, float64, time.Time:
		return 9
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case []any:
		n := 5
		for _, e := range x {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + tableSize(x)
	}
	return 0
}

// fitDeadLetter makes the dead-letter copy msg, whose failure reason is
// in its headers, fit a frame of frameMax bytes (0 or less: no limit):
// it leaves out of the copy the headers of the original it cannot hold
// beside the failure, largest first, and names them in the reason; a
// reason still too long is cut. It returns the names of the headers left
// out, nil when the copy fits as it is.
func fitDeadLetter(msg *amqp.Publishing, frameMax int) []string {
	if frameMax <= 0 || headerFrameSize(msg) <= frameMax {
		return nil
	}
	h := msg.Headers
	reason, _ := h[HeaderFailureReason].(string)
	kept := map[string]bool{HeaderFailureReason: true, HeaderFailureAttempts: true, HeaderFailureEndpoint: true, HeaderFailureTime: true}
	var candidates []string
	for k := range h {
		if !kept[k] {
			candidates = append(candidates, k)
		}
	}
	size := func(k string) int { return 1 + len(k) + fieldSize(h[k]) }
	slices.SortFunc(candidates, func(a, b string) int {
		if d := size(b) - size(a); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	var left, notes []string
	for _, k := range candidates {
		left = append(left, k)
		notes = append(notes, fmt.Sprintf("%.60q (%d bytes)", k, size(k)))
		delete(h, k)
		h[HeaderFailureReason] = fmt.Sprintf("%s [headers left out of this dead letter: an AMQP frame of the connection (%d bytes) cannot hold them beside the failure: %s]",
			reason, frameMax, strings.Join(notes, ", "))
		if headerFrameSize(msg) <= frameMax {
			return left
		}
	}
	if over := headerFrameSize(msg) - frameMax; over > 0 {
		r := h[HeaderFailureReason].(string)
		h[HeaderFailureReason] = clip(r, max(len(r)-over-len("…"), 0))
	}
	return left
}

// deathsSize bounds what the broker adds to the headers of a message
// delayed along r by the time it is delivered: an x-death entry for each
// delay queue it waits in (one per set bit of its routing key) and the
// x-first-death-* and x-last-death-* headers.
func deathsSize(r route) int {
	bits := r.key[:min(len(r.key), 2*delayLevels-1)]
	return 512 + strings.Count(bits, "1")*(200+len(r.key))
}

// delayedFrameSize is the frame size left to a message delayed along r on
// a connection of frame size frameMax (0 or less: no limit, 0 returned):
// what deathsSize leaves of it, at least 1 (a frame the x-death headers
// alone fill holds no delayed message, rather than any).
func delayedFrameSize(frameMax int, r route) int {
	if frameMax <= 0 {
		return 0
	}
	return max(frameMax-deathsSize(r), 1)
}

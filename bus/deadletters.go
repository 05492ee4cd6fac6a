package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// This file is the dead-letter part of the transport contract
// (bus/transport.go): the optional [DeadLetterManager] through which
// `plugbus dlq`, the web console and tests list, replay and delete dead
// letters the same way on every transport.

// DeadLetterManager is implemented by transports whose dead letters can be
// listed, counted, replayed and deleted. Every method works on the
// dead-letter queue of one endpoint, named by the filter.
//
// ReplayDeadLetters and DeleteDeadLetters go through the queue once and
// act on each dead letter the filter selects: a replay sends
// [ReplayEnvelope]'s copy and removes the dead letter only once the broker
// confirmed the copy. A transport may have several replays waiting for
// their confirmation at once; it calls done one call at a time. When ctx
// ends they take no further dead letter, finish those in hand (so that
// none is both replayed and left), return what they did with ctx's error,
// and leave the rest where it was: an interrupted bulk replay loses and
// doubles nothing.
// A process killed between the confirmation and the removal leaves the
// dead letter beside its copy: both carry the same message id, which an
// inbox deduplicates.
//
// An endpoint of which the transport has neither the queue nor the
// dead-letter queue is an error, [*UnknownEndpointError], for every
// method: a mistyped name is never "no dead letters". So is a replay's
// destination without a queue, before the dead letter it would copy is
// removed.
type DeadLetterManager interface {
	// ListDeadLetters returns the dead letters f selects, oldest first.
	ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// CountDeadLetters returns how many dead letters endpoint has.
	CountDeadLetters(ctx context.Context, endpoint string) (int, error)
	// QueueDepth returns how many messages wait in endpoint's queue.
	QueueDepth(ctx context.Context, endpoint string) (int, error)
	// ReplayDeadLetters replays the dead letters f selects to r.To (or
	// each one's own endpoint), calling done after each, and returns how
	// many it replayed.
	ReplayDeadLetters(ctx context.Context, f DeadLetterFilter, r Replay, done func(DeadLetter)) (int, error)
	// DeleteDeadLetters deletes the dead letters f selects, calling done
	// after each, and returns how many it deleted.
	DeleteDeadLetters(ctx context.Context, f DeadLetterFilter, done func(DeadLetter)) (int, error)
}

// EndpointLister is implemented by a [DeadLetterManager] that can name the
// endpoints it knows (those with a queue or a dead-letter queue), sorted:
// the console shows them, and an [*UnknownEndpointError] names them.
type EndpointLister interface {
	Endpoints(ctx context.Context) ([]string, error)
}

// DestinationChecker is implemented by a [DeadLetterManager] that can tell,
// without taking a dead letter, whether a replay to the endpoint (or
// address) to would be refused: CheckDestination returns the error
// ReplayDeadLetters would, a [*UnknownEndpointError] for a destination
// without a queue, and nil for one with a queue. `plugbus dlq replay -to
// -dry-run` asks it: an endpoint with a dead-letter queue alone exists
// (QueueDepth answers 0) but cannot be replayed to.
type DestinationChecker interface {
	CheckDestination(ctx context.Context, to string) error
}

// DeliveryCounter is implemented by a [DeadLetterManager] whose broker
// counts the messages delivered from an endpoint's queue since it started:
// the web console shows messages per second from it.
type DeliveryCounter interface {
	Delivered(ctx context.Context, endpoint string) (uint64, error)
}

// ErrNoDeadLetterEndpoint is returned (wrapped) by a [DeadLetterManager]
// for a filter without an endpoint.
var ErrNoDeadLetterEndpoint = errors.New("bus: the dead-letter filter names no endpoint")

// ErrUnknownEndpoint is matched by [*UnknownEndpointError].
var ErrUnknownEndpoint = errors.New("bus: unknown endpoint")

// UnknownEndpointError is returned (wrapped) by every method of a
// [DeadLetterManager] for an endpoint of which the transport has neither
// the queue nor the dead-letter queue: a mistyped name, or an endpoint
// whose bus never started (its Setup declares both). An endpoint with a
// queue and no dead-letter queue has no dead letters, and one with a
// dead-letter queue alone still has its dead letters: neither is unknown.
//
// ReplayDeadLetters returns it too for a destination without a queue
// ([Replay.To], or the endpoint a dead letter failed on), where the copy
// could not be received, before it removes that dead letter: replaying to
// a mistyped endpoint leaves the dead letters where they were.
type UnknownEndpointError struct {
	// Endpoint is the endpoint as it was given.
	Endpoint string
	// Known names the endpoints the transport knows, sorted, when it can
	// list them ([EndpointLister]); nil when it cannot.
	Known []string
	// Destination is true for a replay's destination without a queue
	// (the endpoint may still have a dead-letter queue), false for an
	// endpoint with neither queue.
	Destination bool
}

// Error implements error. It suggests the known endpoint nearest to the
// one given, when one is near enough to be a typo of it.
func (e *UnknownEndpointError) Error() string {
	switch {
	case slices.Contains(e.Known, e.Endpoint):
		// Known by its dead letters alone: a replay's destination.
		return fmt.Sprintf("bus: endpoint %q has no queue on this transport, only dead letters: start its bus (which declares its queue) or replay elsewhere", e.Endpoint)
	case e.Destination && e.Known == nil:
		// Its dead-letter queue may exist: the transport did not look.
		return fmt.Sprintf("bus: endpoint %q has no queue on this transport to replay to: check the name, or start its bus (which declares its queue)", e.Endpoint)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bus: endpoint %q does not exist on this transport", e.Endpoint)
	switch {
	case e.Known == nil:
		b.WriteString(": check the name (an endpoint's queues exist once its bus has started)")
	case len(e.Known) == 0:
		b.WriteString("; it knows no endpoint yet")
	default:
		if near := nearest(e.Endpoint, e.Known); near != "" {
			fmt.Fprintf(&b, "; did you mean %q? Known endpoints: ", near)
		} else {
			b.WriteString("; known endpoints: ")
		}
		const shown = 20
		b.WriteString(strings.Join(e.Known[:min(len(e.Known), shown)], ", "))
		if len(e.Known) > shown {
			fmt.Fprintf(&b, " and %d more", len(e.Known)-shown)
		}
	}
	return b.String()
}

// Is reports whether target is ErrUnknownEndpoint.
func (e *UnknownEndpointError) Is(target error) bool { return target == ErrUnknownEndpoint }

// nearest returns the name of known nearest to name by edit distance
// (ignoring case), when it is within a third of name's length (at least 1,
// at most 3 edits); "" otherwise.
func nearest(name string, known []string) string {
	best, bestDist := "", min(max(len(name)/3, 1), 3)+1
	lower := strings.ToLower(name)
	for _, k := range known {
		lk := strings.ToLower(k)
		// The distance is at least the difference in length: a name
		// further than that is not near, and its distance, which takes
		// the product of the lengths to compute, is not computed.
		if max(len(lk)-len(lower), len(lower)-len(lk)) >= bestDist {
			continue
		}
		if d := editDistance(lower, lk); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the number of edits, in bytes, that turn a into b: an
// insertion, a deletion, a substitution or a swap of two neighbours (the
// optimal string alignment distance).
func editDistance(a, b string) int {
	// Rows i-2, i-1 and i of the table of the distances between prefixes.
	before, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], before[j-2]+1)
			}
		}
		before, prev, cur = prev, cur, before
	}
	return prev[len(b)]
}

// DeadLetterFilter selects dead letters of one endpoint. A zero field
// selects all.
type DeadLetterFilter struct {
	// Endpoint is the endpoint whose dead-letter queue is read. Required.
	Endpoint string
	// IDs, when not empty, selects only these dead letters ([DeadLetter.ID]).
	IDs []string
	// Name selects one message name.
	Name string
	// Reason selects failures whose reason contains it, regardless of case.
	Reason string
	// Since and Until select failures at or after Since and before Until.
	Since, Until time.Time
	// Limit, when above zero, is the most dead letters selected.
	Limit int
}

// Check returns an error wrapping [ErrNoDeadLetterEndpoint] when f names
// no endpoint.
func (f DeadLetterFilter) Check() error {
	if f.Endpoint == "" {
		return ErrNoDeadLetterEndpoint
	}
	return nil
}

// Match reports whether f selects dl (Limit aside).
func (f DeadLetterFilter) Match(dl *DeadLetter) bool { return f.Matcher()(dl) }

// Matcher returns [DeadLetterFilter.Match] for many dead letters: it reads
// f.IDs once.
func (f DeadLetterFilter) Matcher() func(*DeadLetter) bool {
	var ids map[string]struct{}
	if len(f.IDs) > 0 {
		ids = make(map[string]struct{}, len(f.IDs))
		for _, id := range f.IDs {
			ids[id] = struct{}{}
		}
	}
	reason := strings.ToLower(f.Reason)
	return func(dl *DeadLetter) bool {
		if ids != nil {
			if _, ok := ids[dl.ID]; !ok {
				return false
			}
		}
		switch {
		case f.Name != "" && dl.Envelope.Name != f.Name:
			return false
		case reason != "" && !strings.Contains(strings.ToLower(dl.Failure.Reason), reason):
			return false
		case !f.Since.IsZero() && dl.Failure.Time.Before(f.Since):
			return false
		case !f.Until.IsZero() && !dl.Failure.Time.Before(f.Until):
			return false
		}
		return true
	}
}

// Full reports whether n selected dead letters reach f's Limit.
func (f DeadLetterFilter) Full(n int) bool { return f.Limit > 0 && n >= f.Limit }

// Replay says where a replayed dead letter goes and who replayed it.
type Replay struct {
	// To is the endpoint the copy is sent to; empty sends it to the
	// endpoint that dead-lettered it (its Failure.Endpoint, else the
	// filter's endpoint).
	To string
	// By names who replayed it (a user, a tool); recorded with the copy.
	By string
	// At is when; zero means now.
	At time.Time
}

// HeaderReplay is the header a replayed copy carries: a JSON
// [ReplayRecord], which [ReplayRecordOf] reads. It is an ordinary header,
// so it stays with the message if it fails again and is replayed again.
const HeaderReplay = "x-plugbus-replay"

// MaxReplayFailures bounds the failures a [ReplayRecord] keeps: the latest.
const MaxReplayFailures = 5

// ReplayRecord is what a replayed message carries in [HeaderReplay]: when
// and by whom it was last replayed, how many times, and the failures that
// dead-lettered it before each replay, oldest first.
type ReplayRecord struct {
	At       time.Time `json:"at"`
	By       string    `json:"by,omitempty"`
	Count    int       `json:"count"`
	Failures []Failure `json:"failures"`
}

// ReplayRecordOf reads the [HeaderReplay] of h; ok is false without one.
func ReplayRecordOf(h Headers) (rec ReplayRecord, ok bool, err error) {
	v, ok := h[HeaderReplay]
	if !ok {
		return rec, false, nil
	}
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return rec, true, fmt.Errorf("bus: header %s: %w", HeaderReplay, err)
	}
	return rec, true, nil
}

// ReplayEnvelope returns the copy of dl that a replay sends, and where:
// the envelope as it was (name, body, content type, attributes with the
// message id, headers) with dl's failure added to its [HeaderReplay]
// record. Sent afresh, it starts again at attempt 1 with an empty retry
// history, so the retry policy gives it all its attempts; the failure
// history travels in the record.
func ReplayEnvelope(dl DeadLetter, fallback string, r Replay) (*Envelope, string, error) {
	to := r.To
	if to == "" {
		to = dl.Failure.Endpoint
	}
	if to == "" {
		to = fallback
	}
	if to == "" {
		return nil, "", fmt.Errorf("bus: dead letter %s names no endpoint to replay to: give one", dl.ID)
	}
	rec, _, err := ReplayRecordOf(dl.Envelope.Headers)
	if err != nil {
		rec = ReplayRecord{} // unreadable: start a new record rather than refuse the replay
	}
	rec.At = r.At
	if rec.At.IsZero() {
		rec.At = time.Now().UTC()
	}
	rec.By = r.By
	rec.Count++
	rec.Failures = append(rec.Failures, dl.Failure)
	if n := len(rec.Failures); n > MaxReplayFailures {
		rec.Failures = rec.Failures[n-MaxReplayFailures:]
	}
	js, err := json.Marshal(&rec)
	if err != nil {
		return nil, "", fmt.Errorf("bus: encoding the replay record: %w", err)
	}
	env := dl.Envelope
	env.Due = time.Time{}
	env.Headers = make(Headers, len(dl.Envelope.Headers)+1)
	for k, v := range dl.Envelope.Headers {
		env.Headers[k] = v
	}
	env.Headers[HeaderReplay] = string(js)
	return &env, to, nil
}

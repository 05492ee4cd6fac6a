package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// endpoints it knows (those with a queue or a dead-letter queue), sorted.
type EndpointLister interface {
	Endpoints(ctx context.Context) ([]string, error)
}

// DeliveryCounter is implemented by a [DeadLetterManager] whose broker
// counts the messages delivered from an endpoint's queue since it started:
// the web console shows messages per second from it.
type DeliveryCounter interface {
	Delivered(ctx context.Context, endpoint string) (uint64, error)
}

// ErrNoEndpoint is returned (wrapped) by a [DeadLetterManager] for a filter
// without an endpoint.
var ErrNoEndpoint = errors.New("bus: the dead-letter filter names no endpoint")

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

// Check returns an error wrapping [ErrNoEndpoint] when f names no endpoint.
func (f DeadLetterFilter) Check() error {
	if f.Endpoint == "" {
		return ErrNoEndpoint
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

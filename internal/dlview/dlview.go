// Package dlview is how `plugbus dlq` and the web console show a dead
// letter: one shape for JSON output and for templates, with the body
// pretty-printed when it is JSON.
package dlview

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
)

// DeadLetter is a dead letter as shown.
type DeadLetter struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	MessageID     string            `json:"message_id"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	SentAt        time.Time         `json:"sent_at,omitzero"`
	ContentType   string            `json:"content_type,omitempty"`
	Attributes    map[string]string `json:"attributes,omitempty"`
	Sticky        map[string]string `json:"sticky_attributes,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	// Body is the body as JSON when it is JSON, else as a string (a
	// base64 string when it is not UTF-8, BodyEncoding then says so).
	Body json.RawMessage `json:"body"`
	// BodyEncoding is "base64" when Body is the base64 of a body that is
	// not UTF-8, else empty.
	BodyEncoding string `json:"body_encoding,omitempty"`
	// BodySize is the body's length in bytes.
	BodySize int               `json:"body_size"`
	Failure  Failure           `json:"failure"`
	Replay   *bus.ReplayRecord `json:"replay,omitempty"`
	pretty   string
}

// Failure is a dead letter's failure as shown.
type Failure struct {
	Reason       string    `json:"reason"`
	Attempts     int       `json:"attempts"`
	Endpoint     string    `json:"endpoint"`
	Time         time.Time `json:"time,omitzero"`
	Delayed      int       `json:"delayed_rounds,omitempty"`
	FirstFailure time.Time `json:"first_failure,omitzero"`
	LastFailure  time.Time `json:"last_failure,omitzero"`
	Errors       []string  `json:"errors,omitempty"`
}

// Of returns the view of dl.
func Of(dl bus.DeadLetter) DeadLetter {
	env := dl.Envelope
	a := env.Attributes
	v := DeadLetter{
		ID: dl.ID, Name: env.Name, MessageID: a.MessageID, CorrelationID: a.CorrelationID, SentAt: a.SentAt,
		ContentType: env.ContentType, Headers: maps.Clone(env.Headers),
		Failure: Failure{Reason: dl.Failure.Reason, Attempts: dl.Failure.Attempts, Endpoint: dl.Failure.Endpoint, Time: dl.Failure.Time,
			Delayed: dl.Failure.History.Delayed, FirstFailure: dl.Failure.History.FirstFailure, LastFailure: dl.Failure.History.LastFailure,
			Errors: dl.Failure.History.Errors},
	}
	for k, val := range a.Values() {
		if v.Attributes == nil {
			v.Attributes = map[string]string{}
		}
		v.Attributes[k] = val
	}
	for k, val := range a.StickyValues() {
		if v.Sticky == nil {
			v.Sticky = map[string]string{}
		}
		v.Sticky[k] = val
	}
	if rec, ok, err := bus.ReplayRecordOf(env.Headers); ok && err == nil {
		v.Replay = &rec
		delete(v.Headers, bus.HeaderReplay)
	}
	var buf bytes.Buffer
	switch {
	case json.Valid(env.Body) && json.Indent(&buf, env.Body, "", "  ") == nil:
		v.pretty = buf.String()
		v.Body = json.RawMessage(bytes.TrimSpace(env.Body))
	case utf8.Valid(env.Body):
		v.pretty = string(env.Body)
		v.Body, _ = json.Marshal(string(env.Body))
	default:
		v.Body, _ = json.Marshal(env.Body) // base64
		v.BodyEncoding = "base64"
		v.pretty = base64.StdEncoding.EncodeToString(env.Body)
	}
	v.BodySize = len(env.Body)
	return v
}

// PrettyBody is the body for a person: indented JSON, the text as it is,
// or the base64 of a body that is not UTF-8 (BodyEncoding "base64").
func (v DeadLetter) PrettyBody() string { return v.pretty }

// HeaderNames returns the header names, sorted.
func (v DeadLetter) HeaderNames() []string { return slices.Sorted(maps.Keys(v.Headers)) }

// OneLine puts s on one line of at most n runes, cut with an ellipsis.
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

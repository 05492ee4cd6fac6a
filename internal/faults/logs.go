package faults

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Logs is a slog.Handler that records every message and when it came, so
// that a test can wait for the log line that says a fault was noticed.
// It keeps the message and time only.
type Logs struct {
	mu      sync.Mutex
	records []Record
	changed chan struct{}
}

// Record is one recorded log message.
type Record struct {
	At    time.Time
	Level slog.Level
	Msg   string
	Attrs string // "key=value" pairs, space separated
}

// NewLogs returns an empty recorder.
func NewLogs() *Logs { return &Logs{changed: make(chan struct{})} }

// Logger returns a logger that writes to l.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

// Enabled implements slog.Handler: every level is recorded.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	var attrs strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		attrs.WriteString(a.String())
		attrs.WriteByte(' ')
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, Record{At: time.Now(), Level: r.Level, Msg: r.Message, Attrs: attrs.String()})
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// WithAttrs implements slog.Handler; the attributes are not recorded.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Await waits until a message containing msg is logged at or after
// since, and returns it; ok is false when ctx ended first.
func (l *Logs) Await(ctx context.Context, msg string, since time.Time) (r Record, ok bool) {
	for {
		l.mu.Lock()
		for _, r := range l.records {
			if !r.At.Before(since) && strings.Contains(r.Msg, msg) {
				l.mu.Unlock()
				return r, true
			}
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return Record{}, false
		}
	}
}

// Matching returns the records whose message contains msg.
func (l *Logs) Matching(msg string) []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Record
	for _, r := range l.records {
		if strings.Contains(r.Msg, msg) {
			out = append(out, r)
		}
	}
	return out
}

// Count returns how many messages containing msg were logged.
func (l *Logs) Count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if strings.Contains(r.Msg, msg) {
			n++
		}
	}
	return n
}

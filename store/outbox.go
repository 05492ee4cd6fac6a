package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/plugbus/plugbus/bus"
)

type storedAttrs struct {
	Values map[string]string `json:"v,omitempty"`
	Sticky map[string]string `json:"s,omitempty"`
}

func encodeOutbound(m bus.Outbound) ([]any, error) {
	e := m.Envelope
	if e == nil {
		return nil, errors.New("store: outbox: nil envelope")
	}
	var sa storedAttrs
	for k, v := range e.Attributes.Values() {
		if sa.Values == nil {
			sa.Values = map[string]string{}
		}
		sa.Values[k] = v
	}
	for k, v := range e.Attributes.StickyValues() {
		if sa.Sticky == nil {
			sa.Sticky = map[string]string{}
		}
		sa.Sticky[k] = v
	}
	attrs, err := json.Marshal(sa)
	if err != nil {
		return nil, fmt.Errorf("store: outbox: encoding attributes of %s: %w", e.Name, err)
	}
	headers := []byte("{}")
	if len(e.Headers) > 0 {
		if headers, err = json.Marshal(e.Headers); err != nil {
			return nil, fmt.Errorf("store: outbox: encoding headers of %s: %w", e.Name, err)
		}
	}
	body := e.Body
	if body == nil {
		body = []byte{}
	}
	return []any{e.Attributes.MessageID, int16(m.Kind), m.Options.Destination, e.Name, e.ContentType, body,
		e.Attributes.CorrelationID, e.Attributes.SentAt.UnixNano(), string(attrs), string(headers), time.Now().UnixNano()}, nil
}

func scanOutbound(rows *sql.Rows) (int64, bus.Outbound, error) {
	var (
		id                          int64
		msgID, dest, name, ct, corr string
		kind                        int16
		body                        []byte
		sentAt                      int64
		attrs, headers              string
	)
	if err := rows.Scan(&id, &msgID, &kind, &dest, &name, &ct, &body, &corr, &sentAt, &attrs, &headers); err != nil {
		return 0, bus.Outbound{}, fmt.Errorf("store: reading the outbox: %w", err)
	}
	var sa storedAttrs
	if err := json.Unmarshal([]byte(attrs), &sa); err != nil {
		return id, bus.Outbound{}, fmt.Errorf("store: outbox row %d: attributes: %w", id, err)
	}
	var h bus.Headers
	if headers != "{}" {
		if err := json.Unmarshal([]byte(headers), &h); err != nil {
			return id, bus.Outbound{}, fmt.Errorf("store: outbox row %d: headers: %w", id, err)
		}
	}
	env := &bus.Envelope{Name: name, ContentType: ct, Body: body, Headers: h,
		Attributes: bus.NewAttributes(msgID, corr, time.Unix(0, sentAt).UTC(), sa.Values, sa.Sticky)}
	return id, bus.Outbound{Kind: bus.Kind(kind), Envelope: env, Options: bus.SendOptions{Destination: dest}}, nil
}

// DispatchError reports a stored message the relay could not hand to the
// transport. The message stays in the outbox and is tried again.
type DispatchError struct {
	ID        int64  // row id in the outbox table
	MessageID string // the message's id
	Name      string // the message's name
	Err       error
}

func (e *DispatchError) Error() string {
	return fmt.Sprintf("store: dispatching outbox row %d (%s, id %s): %v; it stays in the outbox and is retried", e.ID, e.Name, e.MessageID, e.Err)
}

// Unwrap returns the transport's error.
func (e *DispatchError) Unwrap() error { return e.Err }

// DispatchPending hands up to limit stored, not yet dispatched messages to
// dispatch, oldest first, and marks those it accepted as dispatched. It
// stops at the first message dispatch refuses, records the error on that
// row and returns a [*DispatchError]. It returns how many were dispatched.
//
// On PostgreSQL the rows are locked (FOR UPDATE SKIP LOCKED) until they are
// marked, so several relays, in several processes, share the work without
// dispatching a row twice. On SQLite one relay runs at a time per Store;
// run one process per database file.
//
// Delivery is at least once: a crash between dispatch and the mark hands
// the message to the transport again, with the same message id.
func (s *Store) DispatchPending(ctx context.Context, limit int, dispatch func(context.Context, bus.Outbound) error) (int, error) {
	if limit < 1 {
		limit = 1
	}
	if s.d.skipLocked {
		return s.dispatchLocked(ctx, limit, dispatch)
	}
	s.relay.Lock()
	defer s.relay.Unlock()
	rows, err := s.db.QueryContext(ctx, s.q.claim, limit)
	if err != nil {
		return 0, fmt.Errorf("store: reading the outbox: %w", err)
	}
	ids, msgs, err := readBatch(rows, limit)
	if err != nil {
		return 0, err
	}
	n, derr := dispatchAll(ctx, ids, msgs, dispatch)
	if err := s.mark(ctx, s.db, ids[:n], derr); err != nil {
		return 0, err
	}
	return n, derr
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func (s *Store) dispatchLocked(ctx context.Context, limit int, dispatch func(context.Context, bus.Outbound) error) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: relay: beginning a transaction: %w", err)
	}
	defer tx.Rollback()
	// Losing the mark in a crash only re-dispatches (at least once), so
	// the relay's commits need not wait for the disk.
	if _, err := tx.ExecContext(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
		return 0, fmt.Errorf("store: relay: %w", err)
	}
	rows, err := tx.QueryContext(ctx, s.q.claimForUpdate, limit)
	if err != nil {
		return 0, fmt.Errorf("store: reading the outbox: %w", err)
	}
	ids, msgs, err := readBatch(rows, limit)
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	n, derr := dispatchAll(ctx, ids, msgs, dispatch)
	if err := s.mark(ctx, tx, ids[:n], derr); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: relay: commit: %w", err)
	}
	return n, derr
}

func readBatch(rows *sql.Rows, limit int) ([]int64, []bus.Outbound, error) {
	defer rows.Close()
	ids := make([]int64, 0, min(limit, 64))
	msgs := make([]bus.Outbound, 0, min(limit, 64))
	for rows.Next() {
		id, m, err := scanOutbound(rows)
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("store: reading the outbox: %w", err)
	}
	return ids, msgs, nil
}

func dispatchAll(ctx context.Context, ids []int64, msgs []bus.Outbound, dispatch func(context.Context, bus.Outbound) error) (int, error) {
	for i, m := range msgs {
		if err := dispatch(ctx, m); err != nil {
			return i, &DispatchError{ID: ids[i], MessageID: m.Envelope.Attributes.MessageID, Name: m.Envelope.Name, Err: err}
		}
	}
	return len(msgs), nil
}

// mark records the dispatched rows, and the error of the failed one.
func (s *Store) mark(ctx context.Context, x execer, ids []int64, derr error) error {
	ctx = context.WithoutCancel(ctx) // what was dispatched must be recorded
	if len(ids) > 0 {
		var arg any = ids
		if !s.d.numbered {
			b := make([]byte, 0, 8*len(ids))
			b = append(b, '[')
			for i, id := range ids {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendInt(b, id, 10)
			}
			arg = string(append(b, ']'))
		}
		if _, err := x.ExecContext(ctx, s.q.markDispatched, time.Now().UnixNano(), arg); err != nil {
			return fmt.Errorf("store: marking %d outbox rows dispatched (they will be dispatched again): %w", len(ids), err)
		}
	}
	var de *DispatchError
	if errors.As(derr, &de) {
		if _, err := x.ExecContext(ctx, s.q.markFailed, de.Err.Error(), de.ID); err != nil {
			return fmt.Errorf("store: recording the dispatch error of outbox row %d: %w", de.ID, err)
		}
	}
	return nil
}

// PurgeDispatched deletes the messages dispatched before before, and
// returns how many it deleted.
func (s *Store) PurgeDispatched(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		res, err := s.db.ExecContext(ctx, s.q.purgeOutbox, before.UnixNano())
		if err != nil {
			return total, fmt.Errorf("store: purging the outbox: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < 5000 {
			return total, nil
		}
	}
}

// Pending returns how many stored messages wait to be dispatched.
func (s *Store) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q.pendingCount).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: counting pending outbox messages: %w", err)
	}
	return n, nil
}

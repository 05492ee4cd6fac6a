package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/plugbus/plugbus/bus"
)

type storedAttrs struct {
	Values map[string]string `json:"v,omitempty"`
	Sticky map[string]string `json:"s,omitempty"`
	// Binary holds the attributes and headers whose name or value is not
	// valid UTF-8: JSON would replace each invalid byte with U+FFFD, and a
	// transport carries them byte for byte.
	Binary []binaryEntry `json:"b,omitempty"`
}

// binaryEntry is an attribute or header of [storedAttrs.Binary], its
// name and value in base64.
type binaryEntry struct {
	In    byte   `json:"i"` // 'v' one-hop, 's' sticky, 'h' header
	Name  []byte `json:"k"`
	Value []byte `json:"v"`
}

// put adds name and value to m, or to sa.Binary (as in) when either is
// not valid UTF-8.
func (sa *storedAttrs) put(m *map[string]string, in byte, name, value string) {
	if !utf8.ValidString(name) || !utf8.ValidString(value) {
		sa.Binary = append(sa.Binary, binaryEntry{In: in, Name: []byte(name), Value: []byte(value)})
		return
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[name] = value
}

func encodeOutbound(m bus.Outbound) ([]any, error) {
	e := m.Envelope
	if e == nil {
		return nil, errors.New("store: outbox: nil envelope")
	}
	var sa storedAttrs
	for k, v := range e.Attributes.Values() {
		sa.put(&sa.Values, 'v', k, v)
	}
	for k, v := range e.Attributes.StickyValues() {
		sa.put(&sa.Sticky, 's', k, v)
	}
	h := map[string]string(e.Headers)
	for k, v := range e.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) { // copied without the binary ones
			h = nil
			for k, v := range e.Headers {
				sa.put(&h, 'h', k, v)
			}
			break
		}
	}
	attrs, err := json.Marshal(sa)
	if err != nil {
		return nil, fmt.Errorf("store: outbox: encoding attributes of %s: %w", e.Name, err)
	}
	headers := []byte("{}")
	if len(h) > 0 {
		if headers, err = json.Marshal(h); err != nil {
			return nil, fmt.Errorf("store: outbox: encoding headers of %s: %w", e.Name, err)
		}
	}
	body := e.Body
	if body == nil {
		body = []byte{}
	}
	var due int64
	if !e.Due.IsZero() {
		due = e.Due.UnixNano()
	}
	return []any{e.Attributes.MessageID, int16(m.Kind), m.Destination, e.Name, e.ContentType, body,
		e.Attributes.CorrelationID, e.Attributes.SentAt.UnixNano(), string(attrs), string(headers), time.Now().UnixNano(), due}, nil
}

// batchRow is one row the relay claimed: a message to dispatch, or a row
// that could not be decoded, which is parked.
type batchRow struct {
	id          int64
	attempts    int
	msg         bus.Outbound
	undecodable error
}

func scanOutbound(rows *sql.Rows) (batchRow, error) {
	var (
		r                           batchRow
		msgID, dest, name, ct, corr string
		kind                        int16
		body                        []byte
		sentAt, dueAt               int64
		attrs, headers              string
	)
	if err := rows.Scan(&r.id, &r.attempts, &msgID, &kind, &dest, &name, &ct, &body, &corr, &sentAt, &attrs, &headers, &dueAt); err != nil {
		return unreadable(rows, err)
	}
	var sa storedAttrs
	if err := json.Unmarshal([]byte(attrs), &sa); err != nil {
		r.undecodable = fmt.Errorf("store: outbox row %d: undecodable attributes: %w", r.id, err)
	}
	var h bus.Headers
	if headers != "{}" && r.undecodable == nil {
		if err := json.Unmarshal([]byte(headers), &h); err != nil {
			r.undecodable = fmt.Errorf("store: outbox row %d: undecodable headers: %w", r.id, err)
		}
	}
	for _, b := range sa.Binary {
		var m *map[string]string
		switch b.In {
		case 'v':
			m = &sa.Values
		case 's':
			m = &sa.Sticky
		case 'h':
			m = (*map[string]string)(&h)
		default:
			if r.undecodable == nil {
				r.undecodable = fmt.Errorf("store: outbox row %d: undecodable attributes: binary entry of unknown kind %d", r.id, b.In)
			}
			continue
		}
		if *m == nil {
			*m = map[string]string{}
		}
		(*m)[string(b.Name)] = string(b.Value)
	}
	env := &bus.Envelope{Name: name, ContentType: ct, Body: body, Headers: h,
		Attributes: bus.NewAttributes(msgID, corr, time.Unix(0, sentAt).UTC(), sa.Values, sa.Sticky)}
	if dueAt != 0 {
		// Handed to the transport as it is: a due time that has passed
		// while the row waited means now, one ahead is the transport's
		// to carry. The relay never waits for it.
		env.Due = time.Unix(0, dueAt)
	}
	r.msg = bus.Outbound{Kind: bus.Kind(kind), Envelope: env, Destination: dest}
	return r, nil
}

// unreadable returns the row rows is on, which scanErr says cannot be read
// as the store writes it (a value of another type, a NULL: a hand-written
// UPDATE, a hand-made schema), as an undecodable row, parked with what
// identifies it. Failing the read would fail every round on this row and
// hold up every message behind it for good. Without a readable id there
// is nothing to park: it returns scanErr.
func unreadable(rows *sql.Rows, scanErr error) (batchRow, error) {
	vals := make([]any, strings.Count(outboxColumns, ",")+1)
	dest := make([]any, len(vals))
	for i := range vals {
		dest[i] = &vals[i]
	}
	id, ok := int64(0), false
	if rows.Scan(dest...) == nil {
		id, ok = vals[0].(int64)
	}
	if !ok {
		return batchRow{}, fmt.Errorf("store: reading the outbox: %w", scanErr)
	}
	text := func(v any) string {
		switch v := v.(type) {
		case string:
			return v
		case []byte:
			return string(v)
		}
		return ""
	}
	r := batchRow{id: id, undecodable: fmt.Errorf("store: outbox row %d: unreadable: %w", id, scanErr)}
	if n, ok := vals[1].(int64); ok {
		r.attempts = int(n)
	}
	// id, attempts, message_id, kind, destination, name: outboxColumns
	r.msg = bus.Outbound{Destination: text(vals[4]), Envelope: &bus.Envelope{Name: text(vals[5]),
		Attributes: bus.NewAttributes(text(vals[2]), "", time.Time{}, nil, nil)}}
	return r, nil
}

// ErrParked is matched by a [*DispatchError] whose row was parked.
var ErrParked = errors.New("store: outbox row parked")

// DispatchError reports a stored message the relay could not hand to the
// transport. The row records the error and its attempt count; it is tried
// again after a back-off (store.WithBackoff) while the other messages
// go on, or, when Parked, no longer dispatched until [Store.Requeue].
type DispatchError struct {
	ID        int64     // row id in the outbox table
	MessageID string    // the message's id
	Name      string    // the message's name
	Attempts  int       // failed attempts so far, this one included
	Parked    bool      // the row is parked: out of attempts, or undecodable
	RetryAt   time.Time // when the row is due again; zero when parked
	Err       error
}

// Error implements error.
func (e *DispatchError) Error() string {
	if e.Parked {
		return fmt.Sprintf("store: dispatching outbox row %d (%s, id %s) failed %d time(s): %v; the row is parked: list it with Store.Parked and send it again with Store.Requeue", e.ID, e.Name, e.MessageID, e.Attempts, e.Err)
	}
	return fmt.Sprintf("store: dispatching outbox row %d (%s, id %s) failed %d time(s): %v; it stays in the outbox and is retried after a backoff", e.ID, e.Name, e.MessageID, e.Attempts, e.Err)
}

// Unwrap returns the transport's (or the decoding) error.
func (e *DispatchError) Unwrap() error { return e.Err }

// Is reports whether target is [ErrParked] and the row was parked.
func (e *DispatchError) Is(target error) bool { return target == ErrParked && e.Parked }

// DispatchPending hands up to limit stored, not yet dispatched messages
// whose retry time has come to dispatch, oldest first, and marks those it
// accepted as dispatched. A message dispatch refuses does not stop the
// others: its row records the error and is tried again after a back-off
// (store.WithBackoff); after store.WithDispatchAttempts failures, or at
// once when the row cannot be read or decoded, it is parked (see
// [Store.Parked]).
// The error returned then joins a [*DispatchError] per refused row.
//
// When ctx is cancelled, DispatchPending stops before the next message,
// marks what was dispatched and returns ctx's error with it; a send the
// cancellation interrupted is not counted as a failed attempt.
//
// On PostgreSQL the rows are locked (FOR UPDATE SKIP LOCKED) until they are
// marked, so several relays, in several processes, share the work without
// dispatching a row twice. On SQLite one relay runs at a time per Store;
// run one process per database file.
//
// Delivery is at least once: a crash between dispatch and the mark hands
// the message to the transport again, with the same message id. It returns
// how many were dispatched.
func (s *Store) DispatchPending(ctx context.Context, limit int, dispatch func(context.Context, bus.Outbound) error) (int, error) {
	return s.DispatchPendingBatch(ctx, limit, oneByOne(dispatch))
}

// DispatchPendingBatch is [Store.DispatchPending] handing the claimed
// messages to dispatch as one batch (bus.Bus.DispatchBatch: one confirm
// round trip on a transport that takes batches). dispatch returns nil
// when every message was accepted, a *bus.BatchError naming by index those
// that were not (each such row records its error and is retried, or
// parked, as with DispatchPending), or any other error, which counts
// against every message of the batch.
func (s *Store) DispatchPendingBatch(ctx context.Context, limit int, dispatch func(context.Context, []bus.Outbound) error) (int, error) {
	if limit < 1 {
		limit = 1
	}
	if s.dialect.rowLocks() {
		return s.dispatchWithRowLocks(ctx, limit, dispatch)
	}
	s.sqliteRelay.Lock()
	defer s.sqliteRelay.Unlock()
	claimCtx, cancel := s.bounded(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(claimCtx, s.queries.claim, time.Now().UnixNano(), limit)
	if err != nil {
		return 0, fmt.Errorf("store: reading the outbox: %w", err)
	}
	batch, err := readBatch(rows, limit)
	cancel()
	if err != nil {
		return 0, err
	}
	sent, failed, cerr := s.dispatchAll(ctx, batch, dispatch)
	if err := s.recordOutcome(ctx, s.db, sent, failed); err != nil {
		return 0, err
	}
	return len(sent), joinDispatch(cerr, failed)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func (s *Store) dispatchWithRowLocks(ctx context.Context, limit int, dispatch func(context.Context, []bus.Outbound) error) (int, error) {
	// Not ctx: database/sql rolls a transaction back when its context is
	// done, and what was dispatched before a Stop must still be marked.
	// The watchdog cancels it when a step on the database outlives the
	// store's timeout (a silent connection), but not while the transport
	// takes its time.
	txCtx, dog := s.watch(ctx)
	defer dog.stop()
	tx, err := s.db.BeginTx(txCtx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: relay: beginning a transaction: %w", err)
	}
	defer tx.Rollback()
	claimCtx, cancel := s.bounded(ctx)
	defer cancel()
	// Losing the mark in a crash only re-dispatches (at least once), so
	// the relay's commits need not wait for the disk.
	if _, err := tx.ExecContext(claimCtx, "SET LOCAL synchronous_commit = off"); err != nil {
		return 0, fmt.Errorf("store: relay: %w", err)
	}
	rows, err := tx.QueryContext(claimCtx, s.queries.claimForUpdate, time.Now().UnixNano(), limit)
	if err != nil {
		return 0, fmt.Errorf("store: reading the outbox: %w", err)
	}
	batch, err := readBatch(rows, limit)
	cancel()
	if err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	dog.disarm()
	sent, failed, cerr := s.dispatchAll(ctx, batch, dispatch)
	dog.arm()
	if err := s.recordOutcome(ctx, tx, sent, failed); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: relay: commit: %w", err)
	}
	return len(sent), joinDispatch(cerr, failed)
}

func readBatch(rows *sql.Rows, limit int) ([]batchRow, error) {
	defer rows.Close()
	batch := make([]batchRow, 0, min(limit, 64))
	for rows.Next() {
		r, err := scanOutbound(rows)
		if err != nil {
			return nil, err
		}
		batch = append(batch, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: reading the outbox: %w", err)
	}
	return batch, nil
}

// dispatchAll dispatches batch as one batch. It returns the ids
// dispatched, the rows refused, and ctx's error when ctx ended: a message
// the cancellation interrupted is neither dispatched nor refused.
func (s *Store) dispatchAll(ctx context.Context, batch []batchRow, dispatch func(context.Context, []bus.Outbound) error) ([]int64, []*DispatchError, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var failed []*DispatchError
	refuse := func(r batchRow, err error) {
		de := &DispatchError{ID: r.id, MessageID: r.msg.Envelope.Attributes.MessageID, Name: r.msg.Envelope.Name, Attempts: r.attempts + 1, Err: err}
		de.Parked = r.undecodable != nil || de.Attempts >= s.retry.attempts
		failed = append(failed, de)
	}
	msgs := make([]bus.Outbound, 0, len(batch))
	rowOf := make([]int, 0, len(batch)) // the index in batch of each message in msgs
	for i, r := range batch {
		if r.undecodable != nil {
			refuse(r, r.undecodable)
			continue
		}
		msgs = append(msgs, r.msg)
		rowOf = append(rowOf, i)
	}
	errs := make([]error, len(msgs))
	if len(msgs) > 0 {
		err := dispatch(ctx, msgs)
		var be *bus.BatchError
		switch {
		case err == nil:
		case errors.As(err, &be):
			for _, f := range be.Failures {
				errs[f.Index] = f.Err
			}
		default:
			for i := range errs {
				errs[i] = err
			}
		}
	}
	cerr := ctx.Err()
	sent := make([]int64, 0, len(msgs))
	for k, i := range rowOf {
		switch err := errs[k]; {
		case err == nil:
			sent = append(sent, batch[i].id)
		case cerr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			// interrupted, not refused
		default:
			refuse(batch[i], err)
		}
	}
	return sent, failed, cerr
}

// oneByOne adapts a dispatch of one message to a batch: it dispatches
// the messages in order until ctx ends; those it did not reach fail with
// ctx's error.
func oneByOne(dispatch func(context.Context, bus.Outbound) error) func(context.Context, []bus.Outbound) error {
	return func(ctx context.Context, ms []bus.Outbound) error {
		errs := make([]error, len(ms))
		for i, m := range ms {
			if errs[i] = ctx.Err(); errs[i] == nil {
				errs[i] = dispatch(ctx, m)
			}
		}
		return bus.BatchResult(errs)
	}
}

func joinDispatch(cerr error, failed []*DispatchError) error {
	if len(failed) == 0 {
		return cerr
	}
	errs := make([]error, 0, len(failed)+1)
	if cerr != nil {
		errs = append(errs, cerr)
	}
	for _, de := range failed {
		errs = append(errs, de)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// errorText is err's text as a TEXT column takes it: PostgreSQL refuses
// a NUL byte and invalid UTF-8, and a transport's error may quote bytes of
// a message. Refusing the text would roll the relay's round back, the
// rows it dispatched included, at every round.
func errorText(err error) string {
	return strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "\uFFFD")
}

// recordOutcome records the dispatched rows, and the errors of the refused ones.
func (s *Store) recordOutcome(ctx context.Context, x execer, ids []int64, failed []*DispatchError) error {
	ctx, cancel := s.bounded(context.WithoutCancel(ctx)) // what was dispatched must be recorded
	defer cancel()
	now := time.Now()
	if len(ids) > 0 {
		var arg any = ids
		if !s.dialect.numberedPlaceholders() {
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
		if _, err := x.ExecContext(ctx, s.queries.markDispatched, now.UnixNano(), arg); err != nil {
			return fmt.Errorf("store: marking %d outbox rows dispatched (they will be dispatched again): %w", len(ids), err)
		}
	}
	for _, de := range failed {
		var parked any
		if de.Parked {
			parked = now.UnixNano()
		}
		retryAt := now.Add(s.retry.after(de.Attempts))
		if !de.Parked {
			de.RetryAt = retryAt
		}
		if _, err := x.ExecContext(ctx, s.queries.markFailed, de.Attempts, errorText(de.Err), retryAt.UnixNano(), parked, de.ID); err != nil {
			return fmt.Errorf("store: recording the dispatch error of outbox row %d: %w", de.ID, err)
		}
		if de.Parked {
			s.logger.ErrorContext(ctx, "outbox: message parked; it is no longer dispatched: inspect it with Store.Parked and send it again with Store.Requeue",
				slog.Int64("outbox_row", de.ID), slog.String("message_id", de.MessageID), slog.String("message_name", de.Name),
				slog.Int("attempts", de.Attempts), slog.Any("error", de.Err))
		}
	}
	return nil
}

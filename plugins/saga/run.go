package saga

import (
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"

	"github.com/google/uuid"

	"github.com/plugbus/plugbus/bus"
	"github.com/plugbus/plugbus/internal/sqlstore"
)

// savepoint is where a handler that lost a conflict goes back to.
const savepoint = "plugbus_saga"

// outcome is what handling one message does to its instance.
type outcome struct {
	skip   bool // nothing to save
	next   sqlstore.SagaRow
	remove bool // completed and not kept
}

// handle is the bus handler of every route of s.
func (s *Saga[S]) handle(ctx context.Context, r *route, m bus.Message, a bus.Attributes) error {
	if r.timeout {
		if name, _ := a.Value(AttrSaga); name != s.name {
			return nil // another saga's timeout of the same type
		}
	}
	key, err := r.key(m, a)
	if err != nil {
		return bus.Permanent(err)
	}
	b, _, _ := bus.MessageContext(ctx)
	fx := busEffects{b: b}
	logger := s.logger().With(slog.String("saga", s.name), slog.String("key", key))
	return s.store.InTx(ctx, func(ctx context.Context, tx *sqlstore.Tx) error {
		// With the outbox, what the handler sends is in tx too: a lost
		// conflict is undone to the savepoint and handled again at once.
		// The savepoint is not released: it ends with the transaction,
		// and ROLLBACK TO keeps it for the next attempt, so a message
		// costs one statement more, not two.
		inPlace := tx.CarriesOutbox()
		if inPlace {
			if err := tx.Savepoint(ctx, savepoint); err != nil {
				return err
			}
		}
		for attempt := 1; ; attempt++ {
			cur, found, err := s.store.LoadSaga(ctx, tx, s.name, key)
			if err != nil {
				return err
			}
			var prev *sqlstore.SagaRow
			if found {
				prev = &cur
			}
			out, err := s.step(ctx, r, m, a, key, prev, fx, tx.SQL(), logger)
			if err != nil {
				return err
			}
			saved := out.skip
			if !saved {
				if saved, err = s.store.SaveSaga(ctx, tx, s.name, key, prev, out.next, out.remove); err != nil {
					return err
				}
			}
			if saved {
				return nil
			}
			s.conflicts.Add(1)
			if !inPlace || attempt > s.cfg.conflictRetries {
				return &ConflictError{Saga: s.name, Key: key, Attempts: attempt}
			}
			logger.DebugContext(ctx, "saga: concurrency conflict; handling the message again on the new state", slog.Int("attempt", attempt))
			if err := tx.RollbackTo(ctx, savepoint); err != nil {
				return err
			}
		}
	})
}

// route returns the route of the message name, nil when s does not declare it.
func (s *Saga[S]) route(name string) *route {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byName[name]
}

// step runs r's handler on the instance cur (nil: none) and returns what to save.
func (s *Saga[S]) step(ctx context.Context, r *route, m bus.Message, a bus.Attributes, key string, cur *sqlstore.SagaRow, fx effects, tx *sql.Tx, logger *slog.Logger) (outcome, error) {
	switch {
	case r.timeout:
		inst, _ := a.Value(AttrInstance)
		if cur == nil || cur.Completed || cur.InstanceID != inst {
			logger.DebugContext(ctx, "saga: timeout for an instance that no longer runs; dropped", slog.String("message", r.msgName))
			return outcome{skip: true}, nil
		}
	case cur == nil && !r.starts:
		if r.missing == DeadLetter {
			return outcome{}, bus.Permanent(&NotFoundError{Saga: s.name, Message: r.msgName, Key: key})
		}
		logger.InfoContext(ctx, "saga: no running instance for the message; ignored", slog.String("message", r.msgName))
		return outcome{skip: true}, nil
	case cur != nil && cur.Completed:
		logger.InfoContext(ctx, "saga: message for a completed instance; ignored", slog.String("message", r.msgName))
		return outcome{skip: true}, nil
	}
	state := new(S)
	var instanceID string
	if cur != nil {
		if err := json.Unmarshal(cur.State, state); err != nil {
			return outcome{}, bus.Permanent(&StateError{Saga: s.name, Key: key, Err: err})
		}
		instanceID = cur.InstanceID
	} else {
		instanceID = uuid.NewString()
	}
	c := &Context[S]{Context: ctx, State: state, saga: s.name, key: key, instanceID: instanceID,
		attrs: a, fx: fx, tx: tx, logger: logger, of: s}
	if err := r.call(c, m); err != nil {
		return outcome{}, err
	}
	body, err := json.Marshal(state)
	if err != nil {
		return outcome{}, bus.Permanent(&StateError{Saga: s.name, Key: key, Err: err})
	}
	return outcome{next: sqlstore.SagaRow{InstanceID: instanceID, State: body, Completed: c.completed},
		remove: c.completed && !s.cfg.keepCompleted}, nil
}
